# The commands a user runs. Each target installs into .venv what it runs, and no more: `make demo` and
# `make bench` the package alone (torch, numpy, OpenCV, Pillow, ...), `make test` the package and EXTRAS.
# TORCH is what gets installed only when no torch is importable (a CPU build on these machines).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
# What is installed is recorded by stamps: $(STAMP) for the venv, torch and the package, and $(STAMP)-NAME for
# each extra NAME on top of it. So `make test` after `make demo` adds only the test extras, `make demo` after
# `make test` installs nothing, and a change to setup.cfg, pyproject.toml, setup.py, the C source it builds
# (dataprep/images/_jpegseg.c) or this file installs again.
STAMP  ?= $(VENV)/.installed
# Extras `make test` (and `make install`) add: test, dask, lightning and video (PyAV) everywhere; DALI's wheels exist for Linux x86_64
# only (about 1 GB installed); lightning for dataprep.lightning. `make test EXTRAS=test` leaves them out, and their
# tests are skipped with the reason.
EXTRAS ?= $(if $(filter Linux-x86_64,$(shell uname -s)-$(shell uname -m)),test$(comma)dask$(comma)lightning$(comma)video$(comma)dali,test$(comma)dask$(comma)lightning$(comma)video)
comma  := ,
EXTRA_STAMPS = $(addprefix $(STAMP)-,$(subst $(comma), ,$(EXTRAS)))

.PHONY: install demo test bench docs fuzz clean
.NOTPARALLEL:  # the pip steps share one venv

install: $(STAMP) $(EXTRA_STAMPS)

# --system-site-packages: a torch the user already has stays in use; we install ours only where none imports.
$(STAMP): setup.cfg pyproject.toml setup.py dataprep/images/_jpegseg.c Makefile
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	touch $@

$(STAMP)-%: $(STAMP)
	$(PY) -m pip install -q -e ".[$*]"
	touch $@

demo: $(STAMP)
	$(PY) -m dataprep demo

# ruff and mypy first (their settings: pyproject.toml; both come with the test extra): a lint or type finding
# fails in seconds, not after the suite. The suite runs in two pytest processes (pytest-xdist, the test extra):
# many tests wait on subprocesses, forks and deadlines, so two keep both cores busy (docs/benchmarks.md, Suite).
# pytest-benchmark, where installed, refuses to run beside xdist: it is left out. PYTEST_ARGS= runs one process.
PYTEST_ARGS ?= -n 2 -p no:benchmark
test: $(STAMP) $(EXTRA_STAMPS)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/bench_core.py

# The API reference, generated from the docstrings of the public names (pdoc, the docs extra) into DOCS_OUT;
# any warning, pdoc's or a docstring's whose Args name no parameter, fails it (scripts/api_docs.py).
DOCS_OUT ?= build/api
docs: $(STAMP) $(STAMP)-docs
	$(PY) scripts/api_docs.py $(DOCS_OUT)

# The compiled part (dataprep/images/_jpegseg.c) under libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer
# for FUZZ_SECONDS, every input also held to the Python path (fuzz/run.py says how; it needs clang). The corpus
# grows in FUZZ_CORPUS between runs; a finding is written to build/fuzz/crashes/ and fails the target.
FUZZ_SECONDS ?= 600
FUZZ_CORPUS  ?= build/fuzz/corpus
fuzz: $(STAMP)
	$(PY) fuzz/run.py --seconds $(FUZZ_SECONDS) --corpus $(FUZZ_CORPUS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache dataprep/images/_jpegseg.*.so
