# The two commands of a fresh machine: `make demo` and `make test`. Everything installs into .venv.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all test-integration integration-deps lint typecheck unit unit-all bench clean install \
	gpu-check gpu-check-dry gpu-check-quick gpu-check-wheels

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# Pinned CPU build for development and CI; users on GPU machines install any torch >= 2.4.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	# TensorFlow's CPU build for the TF/Keras tests (users: the `tf` extra), and tf-keras: the Keras 2
	# that multi-worker model.fit scripts run on (Keras 3's fit cannot: keras-team/keras#20585).
	$(BIN)/python -m pip install -q "tensorflow-cpu==2.21.*" "tf-keras==2.21.*"
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

# `make test`: the fast suite (the README gives its measured time); `make test-all`: also the long end-to-end runs
# (marked slow: the demo, the supervisor, multi-node) and the tests against a real Chromium and
# Prometheus (marked integration), as CI runs it.
unit: $(STAMP)
	$(BIN)/pytest -q -m "not gpu and not slow and not integration"

unit-all: $(STAMP)
	$(BIN)/pytest -q -m "not gpu"

# The real parts the tests run against, from Debian (needs root): chromium, chromium-driver,
# prometheus, strace (power-loss crash states), postgresql, slurm-wlm and munge (the test cluster; srun --mpi=pmix for the srun launcher's tests), Open MPI
# (openmpi-bin, libopenmpi-dev: mpirun for the MPI launcher's tests, the library mpi4py loads;
# mpi4py itself is the [mpi] extra, in [dev]). A failure stops
# here. A test that needs a real part calls tests/real_parts.py's
#     require_real("prometheus", install="apt-get install prometheus")
# which fails the test, saying how to install it, under TRAINGUARD_REQUIRE_REAL=1 (test-all) or
# CI=true, and otherwise skips it and lists it in pytest's summary ("real parts missing").
INTEGRATION_PACKAGES := chromium chromium-driver prometheus strace postgresql slurm-wlm munge openmpi-bin libopenmpi-dev
integration-deps:
	@if dpkg -s $(INTEGRATION_PACKAGES) >/dev/null 2>&1; then echo "integration-deps: installed"; else \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(INTEGRATION_PACKAGES); fi

test-integration: $(STAMP) integration-deps
	TRAINGUARD_REQUIRE_REAL=1 $(BIN)/pytest -q -m integration

# `make test` may skip a test whose real part is missing (its summary lists each one);
# `make test-all` (CI) fails on it.
test: lint typecheck unit gpu-check-quick

test-all: export CI := true
test-all: lint typecheck integration-deps gpu-check-dry
	TRAINGUARD_REQUIRE_REAL=1 $(BIN)/pytest -q -m "not gpu"

# `make gpu-check`: every GPU-only path on a real NVIDIA GPU in one go (tools/gpu_check.py; under
# 8 minutes, nothing installed, no network): report and logs in $(OUT); exit 0 pass, 1 fail, 2
# partial (a path the machine lacks hardware for, e.g. a second GPU). It runs with the .venv where
# there is one, else the machine's python3 (a GPU box's own torch). Without a GPU, or with
# GPU_CHECK_DRY=1, the same stages run on the CPU and the simulated node: `make test-all` runs
# that, `make test` its --quick cut (the reference run and the kill drill, no benchmarks).
OUT ?= gpu-check-out
GPU_CHECK_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	$(GPU_CHECK_PY) tools/gpu_check.py --out $(OUT) $(if $(filter-out 0,$(GPU_CHECK_DRY)),--dry)

gpu-check-dry: $(STAMP)
	$(BIN)/python tools/gpu_check.py --dry --out build/gpu-check-dry

gpu-check-quick: $(STAMP)
	$(BIN)/python tools/gpu_check.py --dry --quick --out build/gpu-check-quick

# What the GPU machine's image (Python 3.12, CUDA torch, nvidia-ml-py, prometheus-client, rich,
# matplotlib, scikit-learn; no network) lacks, as wheels for it (about 5 MB): carry build/gpu-wheels
# with the checkout; tools/gpu_check.py unpacks them there (tools/gpu_check.py NEEDED; docs/gpu-check.md).
GPU_WHEELS := "pytest>=8" "pytest-timeout>=2.2" "aiohttp>=3.10" "isal>=1.6"
gpu-check-wheels: $(STAMP)
	$(BIN)/python -m pip download -q --only-binary=:all: --implementation cp --python-version 3.12 \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d build/gpu-wheels $(GPU_WHEELS)
	@ls build/gpu-wheels

# Every benchmark runs; each checks its targets (benchmarks/targets.py) and exits non-zero on a
# miss, and `make bench` then fails, naming them.
bench: $(STAMP)
	@failed=""; for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || failed="$$failed $$b"; done; \
		if [ -n "$$failed" ]; then echo "make bench: targets missed or errors in:$$failed"; exit 1; fi

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
