# Two commands do all set-up: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# one pytest worker more than the cores: the tests wait on their processes part of the time
PYTEST_JOBS ?= -n $(shell echo $$(( $$(nproc) + 1 ))) --dist worksteal

.PHONY: demo test test-fast lint docs install clean bench bench-dist bench-diff bench-tiers

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch is pinned first and alone: its CPU wheel lies on local disk, an unpinned
# torch would pull a multi-GB CUDA build. numpy is named because the torch wheel
# does not pull it in.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0 numpy
	$(BIN)/python -m pip install -q -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)

# mypy's cache lives with the venv: most of a cold run (minutes) is reading torch, DVC
# and the other dependencies, which only a new venv changes; a fresh clone sharing the
# venv starts warm (the cache checks every file it reuses by path, size and hash).
lint: $(STAMP)
	$(BIN)/ruff check recovery recipes hydra_plugins tests examples train.py demo.py benchmarks
	$(BIN)/ruff format --check recovery recipes hydra_plugins tests examples train.py demo.py benchmarks
	$(BIN)/mypy --cache-dir $(VENV)/mypy-cache
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

# The whole suite, its 30 slowest tests and the total (lint included) printed at the end.
# First, tests/provision.sh installs the system packages some tests need (Chromium, SLURM
# and munge) where it can (apt-get as root or with passwordless sudo; PROVISION=no: never);
# where it cannot, those tests skip and the closing lines name what to install.
# Test processes start from a preloaded launcher (tests/launcher/); PYTEST_JOBS: one pytest
# worker more than the cores (pytest-xdist; 3 on 2 cores: 523 s for the integration tests
# where 2 took 740 s), worksteal: an idle worker takes tests queued for another.
# Lint runs beside the tests (mypy and mkdocs use one core, and the tests wait on their
# processes part of the time): its output is printed after theirs, and either failing
# fails `make test`.
test: $(STAMP)
	@start=$$(date +%s); bash tests/provision.sh; lintlog=$$(mktemp); \
	$(MAKE) --no-print-directory lint >$$lintlog 2>&1 & lintpid=$$!; \
	$(BIN)/python -m pytest -q $(PYTEST_JOBS) --durations=30 $(PYTEST_ARGS); code=$$?; \
	wait $$lintpid; lintcode=$$?; cat $$lintlog; rm -f $$lintlog; \
	[ $$lintcode -eq 0 ] || { echo "make test: lint failed (exit $$lintcode), above"; code=1; }; \
	echo "make test: $$(( $$(date +%s) - start )) s in all, lint included"; exit $$code

# The development loop (under 3 minutes): the unit tests and the key integration tests
# (marked `key`): exact resume after SIGKILL, a drill, the DVC pipeline, torchrun.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_JOBS) -m "key or not integration" --durations=10 $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) on http://127.0.0.1:8000, rebuilt on each change;
# `make lint` builds it with --strict into the git-ignored site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

demo: $(STAMP)
	$(BIN)/python demo.py

clean:
	rm -rf $(VENV) .demo

# Speed is a benchmark, never a test: results go to BENCHMARKS.md by hand.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_checkpoint.py --size-gb 1.0 --runs 5 --json .bench.json
	$(BIN)/python benchmarks/bench_checkpoint.py --scaling 0.25,1,4 --runs 5 --json .bench-scaling.json
	$(BIN)/python benchmarks/bench_first_step.py --size-gb 1.0 --runs 5 --json .bench-first-step.json

# The distributed commit against DCP alone, in one 2-rank torchrun job (gloo on CPU).
bench-dist: $(STAMP)
	$(BIN)/python benchmarks/bench_distributed.py --nproc 2 --size-mb 256 --runs 6 --json .bench-dist.json

# Differential against full checkpoints on a large sparse embedding run (train.py subprocesses).
bench-diff: $(STAMP)
	$(BIN)/python benchmarks/bench_differential.py --json .bench-diff.json
	$(BIN)/python benchmarks/bench_differential.py --users 2000000 --items 500000 --intervals 50,100 --json .bench-diff-large.json
	$(BIN)/python benchmarks/bench_differential.py --dvc --intervals 50 --steps 500 --runs 1 --json .bench-diff-dvc.json

# Failures injected into one run, one tier against two (SIGKILL at random steps, own-loop subprocesses),
# each layout at its Young/Daly interval from a calibration pass; medians of 3 runs (about 15 min).
# Then the persistent tier on a slow store, as clusters have: a throttled FUSE mount at three
# bandwidths, mounted and unmounted by the bench (Debian's fuse3 and libfuse2, installed here
# where apt-get may run, and fusepy).
bench-tiers: $(STAMP)
	$(BIN)/python benchmarks/bench_tiers.py --size-mb 1024 --steps 400 --step-ms 200 --kills 4 --async --hash blake3 --repeat 3 --json .bench-tiers.json
	bash tests/provision.sh
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/bench_tiers.py --size-mb 128 --steps 200 --step-ms 100 --kills 3 --async --hash blake3 --repeat 3 --store-mbps 20,60,200 --json .bench-tiers-store.json
