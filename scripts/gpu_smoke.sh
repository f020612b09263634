#!/usr/bin/env bash
# GPU smoke check, for a machine with an NVIDIA GPU and no network (about 2-5 minutes):
#   1. the `gpu`-marked tests (CUDA bf16 trainer, vLLM rollouts when vLLM is installed, unsloth loading);
#   2. tools/gpu_smoke.py: the tiny model built locally, SFT and GPPO+ERC RL on CUDA, log-probs, entropies, the
#      loss and its gradient checked against the CPU; prints a table and writes outputs/gpu_smoke/gpu_smoke.json.
# Usage: scripts/gpu_smoke.sh [tools/gpu_smoke.py options, e.g. --vllm off]
# Python: $PY, else .venv/bin/python, else python3 (an environment with this package and a CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY=${PY:-}
if [ -z "$PY" ]; then if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi; fi
"$PY" - <<'PYCHECK'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_smoke: torch {torch.__version__} sees no CUDA device (a CPU build? install a CUDA torch)")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")
PYCHECK
SECONDS=0
"$PY" -m pytest -q -p no:cacheprovider -m gpu tests/ -rs
"$PY" tools/gpu_smoke.py --device cuda "$@"
echo "gpu_smoke: done in ${SECONDS}s"
