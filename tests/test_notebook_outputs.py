"""The shipped notebooks carry no outputs but the stored nbval check output: every code cell has no outputs and no
execution count, except the cells marked `# NBVAL_CHECK_OUTPUT`, whose stored output (tools/store_check_output.py)
is the text of their own print() lines. A notebook saved after a run in JupyterLab (outputs everywhere, counts
from the session) or a sync that moved an output under another cell fails here; `klear lab NB --preset P` runs a
prepared copy instead, which leaves the tracked notebook alone."""

from __future__ import annotations

import pathlib
import re

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
IPYNBS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_only_check_cells_carry_outputs_and_each_carries_its_own(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    stray = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not c.source.startswith(CHECK_MARK)
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert stray == [], f"{ipynb.name}: cells {stray} carry outputs or an execution count (clear them)"
    checks = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(CHECK_MARK)]
    assert checks, f"{ipynb.name}: no {CHECK_MARK} cell"
    for cell in checks:
        kinds = {o.get("output_type") for o in cell.get("outputs", [])}
        assert kinds <= {"stream"}, f"{ipynb.name}: a check cell stores {kinds - {'stream'}} outputs"
        text = "".join(o.get("text", "") for o in cell.get("outputs", []))
        labels = re.findall(r'^print\("([^"]+):"', cell.source, flags=re.M)
        assert [line.rsplit(": ", 1)[0] for line in text.splitlines()] == labels, (
            f"{ipynb.name}: the stored check output is not this cell's (its print labels: {labels})")


def test_the_stale_output_case_is_caught(tmp_path):
    """The test above fails on what the issue found: a check cell's output left under an earlier cell."""
    nb = nbformat.read(IPYNBS[1], as_version=4)
    check = next(c for c in nb.cells if c.source.startswith(CHECK_MARK))
    other = next(c for c in nb.cells if c.cell_type == "code" and not c.source.startswith(CHECK_MARK))
    other.outputs, other.execution_count = list(check.outputs), 1
    nbformat.write(nb, tmp_path / IPYNBS[1].name)
    with pytest.raises(AssertionError, match="carry outputs or an execution count"):
        test_only_check_cells_carry_outputs_and_each_carries_its_own(tmp_path / IPYNBS[1].name)
