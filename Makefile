# The two commands of a fresh machine: `make demo` and `make test`. Everything installs into .venv.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all test-integration integration-deps lint typecheck unit unit-all bench clean install

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# Pinned CPU build for development and CI; users on GPU machines install any torch >= 2.4.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/trainguard demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy

# `make test`: the fast suite (~6 min on 2 cores); `make test-all`: also the long end-to-end runs
# (marked slow: the demo, the supervisor, multi-node) and the tests against a real Chromium and
# Prometheus (marked integration), as CI runs it.
unit: $(STAMP)
	$(BIN)/pytest -q -m "not gpu and not slow and not integration"

unit-all: $(STAMP)
	$(BIN)/pytest -q -m "not gpu"

# Debian's chromium, chromium-driver, prometheus, strace (power-loss crash states; needs root) and
# postgresql (the fleet store's tests start a server from it); the tests skip, naming what is
# missing, where apt-get cannot install them, except under CI=true (make test-all), where a
# missing PostgreSQL fails the run.
integration-deps:
	(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver prometheus strace postgresql) \
		|| echo "apt-get failed: the integration tests will skip what is missing"
test-all: export CI := true

test-integration: $(STAMP) integration-deps
	$(BIN)/pytest -q -m integration

test: lint typecheck unit

test-all: lint typecheck integration-deps unit-all

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
