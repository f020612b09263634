"""Store the nbval check cell's output of an executed notebook in the committed one.

    .venv/bin/python tools/store_check_output.py outputs/03_rl_clip_variants/<stamp>/notebook.ipynb

nbval (``make test``) compares the output of each notebook's last cell (``# NBVAL_CHECK_OUTPUT``) with the output
stored in ``notebooks/NN_name.ipynb``. After changing that cell, run the notebook once (``klear run NN --preset
smoke``, or Run All in JupyterLab and save, which stores it directly) and copy its output with this script.
"""

from __future__ import annotations

import pathlib
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main(executed: str) -> None:
    src = nbformat.read(executed, as_version=4)
    name = src.metadata.get("papermill", {}).get("input_path") or executed
    target = ROOT / "notebooks" / pathlib.Path(name).name
    if not target.is_file():
        raise SystemExit(f"{executed}: cannot tell which notebook it ran (papermill input_path {name!r} is not in "
                         f"notebooks/)")
    nb = nbformat.read(target, as_version=4)
    src_last, last = src.cells[-1], nb.cells[-1]
    if src_last.source != last.source:
        raise SystemExit(f"{executed}: its check cell differs from {target.name}'s; run the current notebook first")
    last.outputs = [o for o in src_last.outputs if o.get("output_type") == "stream"]
    last.execution_count = 1  # nbval refuses a stored output on a cell that was never run
    nbformat.write(nb, target)
    print(f"stored {sum(len(o.get('text', '')) for o in last.outputs)} characters of check output in {target}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
