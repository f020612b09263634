"""Shared by the notebook builders: cell constructors and the writer.

A builder module ``nbNN_<name>.py`` defines ``NAME`` (the notebook's file stem), ``cells`` (its cells, the last
one a ``# NBVAL_CHECK_OUTPUT`` cell) and ``SMOKE_CHECK`` (the text nbval expects that cell to print at the
``smoke`` preset). The committed notebook carries no other output.
"""

import nbformat as nbf

md = nbf.v4.new_markdown_cell
code = nbf.v4.new_code_cell

METADATA = {
    "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
    "language_info": {"name": "python"},
}


def write(name: str, cells: list, smoke_check: str, out_dir: str = "notebooks") -> str:
    """Store ``smoke_check`` as the last cell's expected output and write ``out_dir/name.ipynb``."""
    last = cells[-1]
    if not last.source.startswith("# NBVAL_CHECK_OUTPUT"):
        raise ValueError(f"{name}: the last cell must start with '# NBVAL_CHECK_OUTPUT'")
    last.outputs = [nbf.v4.new_output("stream", name="stdout", text=smoke_check)]
    last.execution_count = 1  # nbval refuses a stored output on a cell that was never run
    for i, cell in enumerate(cells):
        cell.id = f"cell-{i:02d}"  # stable ids: rebuilding an unchanged notebook changes nothing
    path = f"{out_dir}/{name}.ipynb"
    nbf.write(nbf.v4.new_notebook(cells=cells, metadata=METADATA), path)
    return path
