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

.PHONY: install run test lint typecheck typecheck-ha unit unit-ha system-packages simulate bench tune \
	soak overload clean lock test-ha-current busy-host

# Installs are exact: every package comes from a lock (locks/*.txt, each with its sha256),
# installed without resolving; `make lock` refreshes the locks.
PIP_EXACT := pip install -q --require-hashes --no-deps
$(STAMP): pyproject.toml locks/server.txt
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch first (the lock leaves torch out): a plain install would fetch a
	# multi-GB CUDA build.
	$(BIN)/pip install -q --no-deps torch==$(TORCH_CPU)
	$(BIN)/$(PIP_EXACT) -r locks/server.txt
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/pip check
	touch $(STAMP)

install: $(STAMP)

$(HA_STAMP): tests_ha/requirements.txt locks/ha.txt
	PYENV_VERSION=3.13.0 python3.13 -m venv $(VENV_HA)
	$(VENV_HA)/bin/$(PIP_EXACT) --ignore-requires-python -r locks/ha.txt
	touch $(HA_STAMP)

# Resolve the locks again from pyproject.toml and tests_ha/requirements.txt (the newest releases
# their ranges allow, for Linux x86_64), pin the images to the same versions, and run every test
# on what was resolved. Review the diff before committing it. torch's CPU build is resolved from
# TORCH_LINKS so that its dependencies are the CPU build's.
TORCH_LINKS ?= https://download.pytorch.org/whl/cpu/torch/
UV_COMPILE = $(BIN)/uv pip compile -q --generate-hashes --custom-compile-command "make lock" --python-platform x86_64-manylinux_2_28 \
	--index-url https://pypi.org/simple
lock: install
	echo "torch==$(TORCH_CPU)+cpu" > $(VENV)/torch-constraint.txt
	$(UV_COMPILE) --python-version 3.11 --find-links $(TORCH_LINKS) \
		-c $(VENV)/torch-constraint.txt --no-emit-package torch \
		--extra dev pyproject.toml -o locks/server.txt
	# Home Assistant 2026.2 asks for Python 3.13.2; its tests run on pyenv's 3.13.0.
	$(UV_COMPILE) --python-version 3.13.2 tests_ha/requirements.txt -o locks/ha.txt
	$(MAKE) install $(HA_STAMP)
	$(BIN)/python scripts/lock-images.py
	$(MAKE) test

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

unit: install system-packages
	$(BIN)/pytest -q $(PYTEST_ARGS)

# Debian's packages the tests use: the dashboard's test runs in headless Chromium (not a browser
# download); the int8 embedder's test runs ONNX Runtime on an emulated CPU without VNNI
# (qemu-user).
system-packages:
	@{ command -v chromium && command -v qemu-x86_64; } >/dev/null || { \
		$(SUDO) apt-get update -q && \
		$(SUDO) apt-get install -y -q --no-install-recommends chromium qemu-user; }

# The integration, and Home Assistant's own Wyoming integration, against a real Fairlane
# server (started from .venv); with the integration's test coverage.
unit-ha: install $(HA_STAMP)
	$(VENV_HA)/bin/pytest -c tests_ha/pytest.ini tests_ha -q \
		--cov=custom_components/fairlane --cov-report=term-missing:skip-covered

# The integration's tests and strict mypy on the newest Home Assistant release (2026.3 and later
# need Python >= 3.14, which pyenv and pip do not give here): scripts/ha-current.sh builds a
# Debian sid chroot with Python 3.14 (root, apt and PyPI; ~6 min once, then ~12 min).
# HA_VERSION=... picks another release; ARGS=... replaces the test selection (tests_ha). Not
# part of `make test` (CI): see custom_components/fairlane/README.md.
test-ha-current: install
	$(SUDO) $(if $(HA_VERSION),env HA_VERSION=$(HA_VERSION)) scripts/ha-current.sh $(ARGS)

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

# A spoken command's first token and a chat turn's TTFT, quiet and with a busy neighbour process
# on one core, for each thread setting (issue 26). Never alongside tests or benchmarks.
busy-host: install
	mkdir -p reports
	$(BIN)/fairlane bench busy-host --rounds 10 --json reports/busy-host.json

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
