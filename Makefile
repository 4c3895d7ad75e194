# One entry point per job. `make run` and `make test` set up everything they need on a fresh
# machine (a Python 3.11 virtual environment in .venv).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1

.PHONY: install run test lint typecheck unit simulate bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/fairlane serve $(ARGS)

test: lint typecheck unit

lint: install
	$(BIN)/ruff check addon tests

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest -q $(PYTEST_ARGS)

simulate: install
	$(BIN)/fairlane simulate --profile rtx4090 --json reports/simulate-rtx4090.json --plot reports/simulate-rtx4090.png

bench: install
	$(BIN)/fairlane bench scheduler

clean:
	rm -rf $(VENV) reports .pytest_cache .mypy_cache .ruff_cache
