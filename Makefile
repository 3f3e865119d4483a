# The commands a user runs. Each target installs what it needs into .venv first.
# TORCH is what gets installed only when no torch is importable (a CPU build on these machines).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
# Optional extras the tests exercise: dask everywhere; DALI's wheels exist for Linux x86_64 only (about
# 1 GB installed). `make test EXTRAS=test` leaves both out, and their tests are skipped with the reason.
EXTRAS ?= $(if $(filter Linux-x86_64,$(shell uname -s)-$(shell uname -m)),test$(comma)dask$(comma)dali,test$(comma)dask)
comma  := ,

.PHONY: install demo test bench clean

install: $(STAMP)

# --system-site-packages: a torch the user already has stays in use; we install ours only where none imports.
$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	echo "$(EXTRAS)" > $(STAMP)

demo: install
	$(PY) -m dataprep demo

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/bench_core.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
