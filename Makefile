# OpenJet: `make run` sets everything up and opens the app; `make test` runs the test suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast bench gpu-check snapshot-update clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/openjet

# Exit code 5 (no tests collected) is a failure: an empty run must not pass.
# One BLAS thread per process: tests run engine servers beside the test process, and OpenBLAS threads spinning on
# oversubscribed cores made the real-model tests 3-4x slower on a 2-core machine.
# A worker per core, a test file per worker (its module fixtures built once): on 2 cores the suite took 770 s
# against ~1,300 s in one process (2026-12-03). `make test XDIST=` runs it in one process.
XDIST ?= -n auto --dist loadfile
test: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(PY) -m pytest -q -ra $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

test-fast: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/gpu_check.py --bench

gpu-check: $(STAMP)
	$(PY) bench/gpu_check.py

snapshot-update: $(STAMP)
	$(PY) -m pytest tests/ui --snapshot-update

clean:
	rm -rf $(VENV) build *.egg-info
