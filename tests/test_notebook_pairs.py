"""Every notebook is a jupytext pair (``notebooks/NN_name.ipynb`` <-> ``notebooks/NN_name.py``, percent format, set
in ``jupytext.toml``), and the two halves agree cell by cell: the ``.py`` is what is reviewed and linted, the
``.ipynb`` what papermill and nbval run. A save in JupyterLab with jupytext active updates both; an edit of one
half alone (outside JupyterLab) fails here until ``jupytext --sync notebooks/NN_name.py`` is run."""

from __future__ import annotations

import pathlib
import re

import jupytext
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
IPYNBS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"


def _cells(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(c.cell_type, c.source.strip(), tuple(c.get("metadata", {}).get("tags", ()))) for c in nb.cells]


def test_every_notebook_has_both_halves():
    stems_ipynb = {p.stem for p in IPYNBS}
    stems_py = {p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.py")}
    assert IPYNBS, f"no notebooks in {NOTEBOOKS}"
    assert stems_ipynb == stems_py, (f"unpaired: .ipynb only {sorted(stems_ipynb - stems_py)}, "
                                     f".py only {sorted(stems_py - stems_ipynb)}")


def test_repository_pairs_ipynb_with_percent_py():
    text = (ROOT / "jupytext.toml").read_text(encoding="utf-8")
    assert re.search(r'^formats\s*=\s*"ipynb,py:percent"', text, flags=re.M), text


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_halves_agree(ipynb: pathlib.Path):
    py = ipynb.with_suffix(".py")
    from_ipynb = _cells(nbformat.read(ipynb, as_version=4))
    from_py = _cells(jupytext.read(py, fmt="py:percent"))
    for i, (a, b) in enumerate(zip(from_ipynb, from_py)):
        assert a == b, (f"{ipynb.stem}: cell {i} differs between the .ipynb and the .py "
                        f"(run `jupytext --sync {py.relative_to(ROOT)}`):\n.ipynb: {a[:2]}\n.py:    {b[:2]}")
    assert len(from_ipynb) == len(from_py), (f"{ipynb.stem}: {len(from_ipynb)} cells in the .ipynb, {len(from_py)} "
                                             f"in the .py (run `jupytext --sync {py.relative_to(ROOT)}`)")


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_check_cell_stores_only_preset_independent_invariants(ipynb: pathlib.Path):
    """nbval compares the last cell's output with the stored one; it must be the same at every preset, so that
    saving the notebook after a `tiny` run in JupyterLab leaves `make test` (the `smoke` preset) green."""
    nb = nbformat.read(ipynb, as_version=4)
    last = nb.cells[-1]
    assert last.cell_type == "code" and last.source.startswith(CHECK_MARK), (
        f"{ipynb.stem}: the last cell must be the nbval check cell, starting with {CHECK_MARK!r}")
    text = "".join(o.get("text", "") for o in last.get("outputs", []) if o.get("output_type") == "stream")
    lines = text.splitlines()
    assert lines, f"{ipynb.stem}: the check cell has no stored output for nbval to compare"
    bad = [line for line in lines if not line.endswith(": True")]
    assert not bad, f"{ipynb.stem}: stored check lines must be invariants that print 'label: True', got {bad}"
    labels = re.findall(r'^print\("([^"]+):"', last.source, flags=re.M)
    assert [line.rsplit(": ", 1)[0] for line in lines] == labels, (
        f"{ipynb.stem}: the stored output does not match the cell's print() labels (re-run the notebook and save, "
        f"or `tools/store_check_output.py` an executed copy)")


@pytest.mark.parametrize("ipynb", IPYNBS, ids=lambda p: p.stem)
def test_every_parameter_is_visible_to_papermill(ipynb: pathlib.Path):
    """`klear run -p key=value` accepts only the parameters papermill finds in the tagged cell; papermill skips a
    line it cannot parse (e.g. an '=' inside a string or a comment), which would make that parameter unknown."""
    from papermill.translators import PythonTranslator

    nb = nbformat.read(ipynb, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", []))
    found = {p.name for p in PythonTranslator.inspect(cell)}
    declared = [line.split("=", 1)[0].strip() for line in cell.source.splitlines()
                if "=" in line and not line.lstrip().startswith("#")]
    assert declared and not [d for d in declared if d not in found], (
        f"{ipynb.stem}: papermill cannot read {[d for d in declared if d not in found]} (no '=' in values or comments)")
