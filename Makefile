# One entry point per job. `make run` and `make test` set up everything they need on a fresh
# machine: the server's Python 3.11 environment in .venv and, for the Home Assistant side
# tests, a Python 3.13 environment in .venv-ha.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VENV_HA := .venv-ha
HA_STAMP := $(VENV_HA)/.installed
TORCH_CPU ?= 2.13.0
export OMP_NUM_THREADS ?= 1
export FAIRLANE_LLAMA_SERVER ?= .bench/llama-server/bin/llama-server
# Root installs system packages itself; anyone else through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install run test lint typecheck typecheck-ha unit unit-ha chromium simulate bench tune \
	soak overload clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch first: an open range would fetch a multi-GB CUDA build.
	$(BIN)/pip install -q torch==$(TORCH_CPU)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(HA_STAMP): tests_ha/requirements.txt
	PYENV_VERSION=3.13.0 python3.13 -m venv $(VENV_HA)
	$(VENV_HA)/bin/pip install -q --upgrade pip
	$(VENV_HA)/bin/pip install -q --ignore-requires-python -r tests_ha/requirements.txt
	touch $(HA_STAMP)

run: install
	$(BIN)/fairlane serve $(ARGS)

test: lint typecheck typecheck-ha unit unit-ha

lint: install
	$(BIN)/ruff check addon tests custom_components tests_ha

typecheck: install
	$(BIN)/mypy

# The integration, strictly, against Home Assistant's own types.
typecheck-ha: $(HA_STAMP)
	$(VENV_HA)/bin/mypy --config-file tests_ha/mypy.ini

unit: install chromium
	$(BIN)/pytest -q $(PYTEST_ARGS)

# The dashboard's test runs in headless Chromium: Debian's package, not a browser download.
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -q && \
		$(SUDO) apt-get install -y -q --no-install-recommends chromium; }

# The integration, and Home Assistant's own Wyoming integration, against a real Fairlane
# server (started from .venv); with the integration's test coverage.
unit-ha: install $(HA_STAMP)
	$(VENV_HA)/bin/pytest -c tests_ha/pytest.ini tests_ha -q \
		--cov=custom_components/fairlane --cov-report=term-missing:skip-covered

# A fresh server under a light mixed load for SOAK_MINUTES (chat, voice, embeddings, documents):
# errors, hung requests, /health latency and memory growth. Never alongside tests or benchmarks.
SOAK_MINUTES ?= 10
soak: install
	mkdir -p reports
	$(BIN)/fairlane bench soak --duration $$(( $(SOAK_MINUTES) * 60 )) --json reports/soak.json

# Three times the voice and chat queue limits of streaming clients for a minute, then the drain.
overload: install
	mkdir -p reports
	$(BIN)/fairlane bench overload --duration 60 --json reports/overload.json

simulate: install
	$(BIN)/fairlane simulate --profile rtx4090 --json reports/simulate-rtx4090.json --plot reports/simulate-rtx4090.png

bench: install
	scripts/install-baselines.sh
	mkdir -p reports
	$(BIN)/fairlane bench family --workload addon/fairlane/workloads/family-cpu.yaml \
		--fixtures tests/fixtures/speech --json reports/bench-family.json \
		--plot reports/bench-family.png
	$(BIN)/fairlane bench family --workload addon/fairlane/workloads/family-party-cpu.yaml \
		--phases mixed --fixtures tests/fixtures/speech --json reports/bench-party.json \
		--plot reports/bench-party.png
	$(BIN)/fairlane bench scheduler --json reports/bench-scheduler.json
	$(BIN)/fairlane bench engine --json reports/bench-engine.json
	$(BIN)/fairlane bench throughput --json reports/bench-throughput.json
	$(BIN)/fairlane bench interference --chats 30 --json reports/bench-interference.json
	$(BIN)/fairlane bench speech --json reports/bench-speech.json
	$(BIN)/fairlane bench embed --json reports/bench-embed.json

# The policy settings for the household evening on this machine, written to fairlane-tuned.yaml.
tune: install
	$(BIN)/fairlane tune --workload addon/fairlane/workloads/family-cpu.yaml --calibrate \
		--verify 2 --json reports/tune.json

clean:
	rm -rf $(VENV) $(VENV_HA) reports .bench .pytest_cache .mypy_cache .ruff_cache
