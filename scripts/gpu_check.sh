#!/usr/bin/env bash
# The GPU check (tools/gpu_check.py): SFT, fp32 master weights, the klear log-prob backend against TRL's, RL with
# GPPO+ERC, dynamic sampling and α (HF generation, and vLLM colocate where vLLM is installed), the gpu-marked
# tests; each stage independent of the others' failure, with its seconds, tokens per second and peak memory, all in
# one file: $OUT/gpu_check.json (OUT unset: outputs/gpu_check). About 5 minutes on one H100/H200, 10 at most.
#
# For a bare CUDA machine with no model hub and no package registry: the model is built here (random weights, the
# package's own tokenizer), klear_lib is imported from this working tree (PYTHONPATH; never installed against its
# torch pin), and what the machine's Python lacks comes from the wheels in .whl/ (made on a machine with PyPI by
# scripts/gpu_wheels.sh), installed into $KLEAR_SITE with --no-index --no-deps. A Python that already has
# trl and datasets (pip install -e '.[gpu]') needs no wheels.
#
# Usage: scripts/gpu_check.sh [--cpu] [tools/gpu_check.py options: --only STAGES, --budget-s S, --work DIR]
#   --cpu: the same path on the CPU at tiny sizes (seconds to a minute; tests/test_gpu_check.py runs it).
#   PY: the Python to use (default python3); KLEAR_SITE: where the wheels go (default /tmp/klear-wheels/site-packages).
# Exit status: 0 when every stage passed or was skipped with a reason, 1 when a stage failed, 2-3 when it could not
# start (no CUDA device, missing packages).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY=${PY:-python3}
# a folder named site-packages: datasets hashes functions with dill, which pickles a module's objects by reference
# only when the module lives under sys.prefix or in a "site-packages" folder (by value otherwise, which fails on
# some pyarrow types)
SITE=${KLEAR_SITE:-/tmp/klear-wheels/site-packages}
OUT=${OUT:-outputs/gpu_check}
export OUT

# Which packages are there, asked without importing them (each import of torch and TRL costs seconds; the check
# imports them once, below)
has() { "$PY" -c 'import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))' "$@"; }
if ! has trl datasets; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    echo "gpu_check: installing $(ls .whl/*.whl | wc -l) wheels from .whl/ into $SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
      || { echo "gpu_check: pip could not install .whl/*.whl" >&2; exit 3; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! has torch transformers trl datasets accelerate; then
  "$PY" - <<'PYCHECK' >&2
import importlib.util
missing = [m for m in ("torch", "transformers", "trl", "datasets", "accelerate") if importlib.util.find_spec(m) is None]
print(f"gpu_check: this Python lacks {missing}: make the wheels with scripts/gpu_wheels.sh on a machine with PyPI "
      "(they land in .whl/ and travel with the working tree), or pip install -e '.[gpu]'")
PYCHECK
  "$PY" -c 'import torch, transformers, trl, datasets, accelerate' >&2
  exit 3
fi
"$PY" tools/gpu_check.py --out "$OUT" "$@"
