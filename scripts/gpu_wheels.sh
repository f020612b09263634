#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh needs on a bare CUDA machine (Python 3.12, manylinux x86_64, torch, transformers
# and accelerate already there, no package registry), downloaded here, on a machine with PyPI, into .whl/ (ignored
# by git; it travels with the working tree). Exactly the packages the check imports that such a machine lacks:
# `tools/gpu_check.py --wheels` (TRL and datasets at this project's pins, and their dependencies such an image
# lacks); each wheel's Requires-Dist is then checked against that list and the packages the image holds
# (tools/gpu_check.py's BARE_IMAGE). About 2 MB.
# Usage: scripts/gpu_wheels.sh [DIR (default .whl)]; PY: the Python whose pip downloads (default python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$ROOT/.whl}
PY=${PY:-python3}
mkdir -p "$DEST"
mapfile -t WANT < <("$PY" "$ROOT/tools/gpu_check.py" --wheels)
for spec in "${WANT[@]}"; do
  # pure-Python wheels first; a compiled one is taken for CPython 3.12 on manylinux x86_64
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$DEST" "$spec" 2>/dev/null \
    || "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
         -d "$DEST" "$spec"
done
# one version of each, and nothing the list does not name (two versions of one package stop the whole install)
"$PY" - "$DEST" "$ROOT" <<'PYCHECK'
import re, sys, zipfile
from pathlib import Path
sys.path.insert(0, str(Path(sys.argv[2]) / "tools"))
from gpu_check import BARE_IMAGE, WHEELS

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
wheels = sorted(Path(sys.argv[1]).glob("*.whl"))
have = {}
for w in wheels:
    name, version = w.name.split("-")[:2]
    have.setdefault(norm(name), []).append(version)
want = {norm(k): v for k, v in WHEELS.items()}
problems = [f"{n}: {v}" for n, v in have.items() if n not in want or v != [want[n]]]
problems += [f"{n}=={v}: not downloaded" for n, v in want.items() if n not in have]
for w in wheels:
    meta = next(m for m in zipfile.ZipFile(w).namelist() if m.endswith(".dist-info/METADATA"))
    for line in zipfile.ZipFile(w).read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            dep = norm(re.match(r"Requires-Dist:\s*([A-Za-z0-9_.-]+)", line).group(1))
            if dep not in want and dep not in {norm(b) for b in BARE_IMAGE}:
                problems.append(f"{w.name} needs {dep}, neither in the wheels nor on a bare image")
if problems:
    sys.exit("gpu_wheels: " + "; ".join(problems))
size = sum(w.stat().st_size for w in wheels) / 2**20
print(f"gpu_wheels: {len(wheels)} wheels, {size:.1f} MiB in {sys.argv[1]}: " + ", ".join(w.name for w in wheels))
PYCHECK
