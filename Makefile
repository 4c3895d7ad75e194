# One entry point per job. `make run` and `make test` set up everything they need on a fresh
# machine (a Python 3.11 virtual environment in .venv).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_CPU ?= 2.13.0
export OMP_NUM_THREADS ?= 1
export FAIRLANE_LLAMA_SERVER ?= .bench/llama-server/bin/llama-server

.PHONY: install run test lint typecheck unit simulate bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch first: an open range would fetch a multi-GB CUDA build.
	$(BIN)/pip install -q torch==$(TORCH_CPU)
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
	scripts/build-llama-server.sh
	mkdir -p reports
	$(BIN)/fairlane bench scheduler --json reports/bench-scheduler.json
	$(BIN)/fairlane bench engine --json reports/bench-engine.json
	$(BIN)/fairlane bench throughput --json reports/bench-throughput.json
	$(BIN)/fairlane bench interference --chats 30 --json reports/bench-interference.json
	$(BIN)/fairlane bench speech --json reports/bench-speech.json
	$(BIN)/fairlane bench embed --json reports/bench-embed.json

clean:
	rm -rf $(VENV) reports .bench .pytest_cache .mypy_cache .ruff_cache
