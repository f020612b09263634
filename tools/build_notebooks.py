"""Writes every notebooks/NN_<name>.ipynb from its builder, tools/notebooks/nbNN_<name>.py (the notebook is the
artifact; the builders keep its cells reviewable as plain Python). Run: .venv/bin/python tools/build_notebooks.py
[name ...] (default: every builder)."""

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "notebooks"
sys.path.insert(0, str(HERE))

from _common import write  # noqa: E402

wanted = set(sys.argv[1:])
for path in sorted(HERE.glob("nb[0-9][0-9]_*.py")):
    module = importlib.import_module(path.stem)
    if wanted and module.NAME not in wanted:
        continue
    print("wrote", write(module.NAME, module.cells, module.SMOKE_CHECK))
