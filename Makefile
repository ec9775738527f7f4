# The two commands of the README: `make demo` and `make test`. Each creates .venv when absent,
# installs the pinned dependencies, builds the C++ ops, then runs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
OP_SOURCES := $(shell find custom_ops/cc -name '*.cc' -o -name '*.h' 2>/dev/null)
PYTEST_ARGS ?=
# Test workers (pytest-xdist); tests/conftest.py groups the tests that share a costly build.
WORKERS ?= 2
XDIST  := -n $(WORKERS) --dist loadgroup
# Each worker, and every process a test starts, gets its share of the cores as OpenMP
# threads: torch's and Inductor's default of one thread per core makes the workers' spinning
# threads contend for the same cores (two quick demos side by side took 105 s against 40 s).
THREADS_PER_WORKER := $(shell n=$$(( $$(nproc) / $(WORKERS) )); [ $$n -ge 1 ] && echo $$n || echo 1)

export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test test-quick test-gpu install bench-bridge clean

demo: $(VENV)/.built
	$(VENV)/bin/xgr demo

# The full gate (CI runs this); prints its wall time.
test test-quick: export OMP_NUM_THREADS ?= $(THREADS_PER_WORKER)
test: $(VENV)/.built
	@start=$$(date +%s); $(PY) -m pytest tests $(XDIST) $(PYTEST_ARGS); status=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s wall"; exit $$status

# A developer's inner loop: everything but the tests marked heavy (subprocess builds,
# AOTInductor packages, SavedModel exports, servers) or slow (the larger cases of the
# interpreter grids); stops at the first failure.
test-quick: $(VENV)/.built
	@start=$$(date +%s); $(PY) -m pytest tests $(XDIST) -m "not heavy and not slow" -x $(PYTEST_ARGS); \
	status=$$?; \
	echo "make test-quick: $$(( $$(date +%s) - start )) s wall"; exit $$status

# The heavy cases (full shape grids, bf16 kernels, device decode) on a machine with a GPU.
test-gpu:
	python3 -m pytest tests -m gpu $(PYTEST_ARGS)

install: $(VENV)/.built

$(VENV)/.deps: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	# tensorflow-serving-api and tf-keras (Keras 2 models, run with TF_USE_LEGACY_KERAS=1)
	# require `tensorflow`, whose full wheel would be written over tensorflow-cpu: both run
	# on tensorflow-cpu, so they install without their dependencies.
	$(PIP) install -q --no-deps tensorflow-serving-api==2.21.0 tf-keras==2.21.0
	touch $@

$(VENV)/.built: $(VENV)/.deps setup.py $(OP_SOURCES) custom_ops/_build.py
	$(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

bench-bridge: $(VENV)/.built
	$(PY) -m benchmarks.bench_bridge

clean:
	rm -rf build $(VENV) custom_ops/_*.so *.egg-info
