# The two commands a newcomer runs (README): `make reproduce` and `make test`. Each sets itself up.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.klear-installed
PRESET ?= tiny
export PYTHONUNBUFFERED := 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export KLEAR_REQUIRE_VERL := 1

.PHONY: reproduce test lab setup notebooks bench clean-venv

# Create the venv if missing and install the pinned packages. torch==2.13.0 first: on these machines it is the
# CPU wheel on disk, and installing it before anything else keeps pip from pulling a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@# The code sandbox runs untrusted programs under Debian's bubblewrap: install it if it is missing.
	@command -v bwrap >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,lab,verl-test]'
	@# verl's policy-loss code for tests/test_verl.py, without its hydra dependency (it clashes with math-verify's
	@# antlr build and breaks every pytest run through hydra's pytest plugin).
	$(PY) -m pip install -q --no-deps verl==0.9.1
	@# torchvision/torchaudio/torchcodec next to the CPU torch break `import transformers`: never keep them.
	@$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	@touch $@

setup: $(STAMP)

# Every ablation notebook that has a params/<notebook>/$(PRESET).yaml, each into its own run directory, then the
# report (outputs/report.html); a failing notebook is recorded and the others still run.
reproduce: $(STAMP)
	$(VENV)/bin/klear reproduce --preset $(PRESET)

# The whole suite: the linter (library, tests, benchmarks, tools, the notebooks' .py halves), unit and integration
# tests (the notebook pairs' agreement among them), then every notebook at its `smoke` preset under nbval.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	rm -rf .nbval && mkdir -p .nbval
	@# Run folders are named as klear names them (a timestamp): the report counts only those as runs.
	stamp=$$(date +%Y%m%d-%H%M%S); for nb in notebooks/[0-9]*.ipynb; do \
	  name=$$(basename $$nb .ipynb); \
	  if [ -f params/$$name/smoke.yaml ]; then \
	    $(VENV)/bin/klear prepare $$name --preset smoke --out .nbval/$$name.ipynb --run-dir .nbval/runs/$$name/$$stamp || exit 1; \
	  fi; \
	done
	@# The report notebook (00_*) gathers the other notebooks' smoke runs: pytest collects in argument order, so it
	@# is named last.
	$(PY) -m pytest -p no:cacheprovider tests $$(ls .nbval/*.ipynb | grep -v '/00_') $$(ls .nbval/00_*.ipynb) \
	  --nbval-lax --sanitize-with tests/nbval_sanitize.cfg

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
