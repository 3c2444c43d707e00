# The two commands of a fresh machine: `make demo` and `make test`. Everything installs into .venv.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all test-integration integration-deps lint typecheck unit unit-all bench clean install \
	gpu-check gpu-check-dry

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
	$(BIN)/ruff check src tests benchmarks examples tools
	$(BIN)/ruff format --check src tests benchmarks examples tools

typecheck: $(STAMP)
	$(BIN)/mypy

# `make test`: the fast suite (~6 min on 2 cores); `make test-all`: also the long end-to-end runs
# (marked slow: the demo, the supervisor, multi-node) and the tests against a real Chromium and
# Prometheus (marked integration), as CI runs it.
unit: $(STAMP)
	$(BIN)/pytest -q -m "not gpu and not slow and not integration"

unit-all: $(STAMP)
	$(BIN)/pytest -q -m "not gpu"

# Debian's chromium, chromium-driver, prometheus and strace (power-loss crash states; needs root);
# the tests skip, naming what is missing, where apt-get cannot install them.
integration-deps:
	(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver prometheus strace) \
		|| echo "apt-get failed: the integration tests will skip what is missing"

# Debian's slurm-wlm and munge: the remediation tests start a real munged, slurmctld and slurmd on
# loopback. Unlike the packages above, this fails (and so does test-all) when it cannot install them.
.PHONY: slurm-deps
integration-deps: slurm-deps
slurm-deps:
	command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
		|| (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge)

test-integration: $(STAMP) integration-deps
	$(BIN)/pytest -q -m integration

test: lint typecheck unit gpu-check-dry

test-all: lint typecheck integration-deps unit-all gpu-check-dry

# `make gpu-check`: every GPU-only path on a real NVIDIA GPU in one go (tools/gpu_check.py; under
# 8 minutes, nothing installed, no network): report and logs in $(OUT). It runs with the .venv
# where there is one, else the machine's python3 (a GPU box's own torch). Without a GPU, or with
# GPU_CHECK_DRY=1, the same stages run on the CPU and the simulated node: `make test` runs that.
OUT ?= gpu-check-out
GPU_CHECK_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	$(GPU_CHECK_PY) tools/gpu_check.py --out $(OUT) $(if $(filter-out 0,$(GPU_CHECK_DRY)),--dry)

gpu-check-dry: $(STAMP)
	$(BIN)/python tools/gpu_check.py --dry --out build/gpu-check-dry

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
