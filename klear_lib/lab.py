"""JupyterLab on the repository without its traps (``klear lab``; ``make lab``).

- Lab's root is the repository, so jupytext finds ``jupytext.toml`` (pairing, metadata filters): a save writes the
  ``.py`` half as committed, with no YAML header. Started on ``notebooks/``, Lab used to miss it. The tracked
  notebooks also carry the filters in their own metadata (as jupytext writes them), so a save is clean either way.
- Each notebook is one entry: the ``.py`` halves (``NN_name.py``) are hidden from the file browser
  (``ContentsManager.hide_globs``); saving the ``.ipynb`` still writes them.
- Saving a tracked notebook keeps its committed notebook-level metadata (``pre_save_hook``): Lab rewrites
  ``kernelspec`` and ``language_info`` (with the machine's Python version) as soon as a kernel starts, which made
  a clean checkout dirty by opening a notebook.
- A quick run never touches a tracked notebook: ``klear lab NB --preset P`` writes ``outputs/lab/NB.P.ipynb``, the
  notebook with the preset's parameters injected (papermill's ``injected-parameters`` cell, as ``klear run`` does)
  and no ``run_dir``, and opens it. Run All there writes a new run directory ``outputs/NB/<stamp>`` each time,
  recorded as that preset (or ``custom`` once a value is edited: ``preset.json``). The copy is not paired with a
  ``.py`` (no jupytext metadata; ``outputs/lab/jupytext.toml``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

LAB_DIR = "lab"  # under the output root: the prepared copies
TRACKED = re.compile(r"(^|/)notebooks/[0-9][0-9]_[^/]*\.ipynb$")
HIDE_GLOBS = ("__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~", "[0-9][0-9]_*.py")  # jupyter's, and the .py halves
COMMITTED_METADATA = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                      "language_info": {"name": "python"}}


def pre_save_hook(model: dict, path: str, contents_manager=None, **kwargs) -> None:
    """jupyter_server's ``ContentsManager.pre_save_hook``: a tracked notebook (``notebooks/NN_*.ipynb``) is saved
    with the committed ``kernelspec`` and ``language_info``, whatever kernel Lab attached; nothing else changes."""
    if model.get("type") != "notebook" or not TRACKED.search(str(path).replace(os.sep, "/")):
        return
    content = model.get("content")
    if isinstance(content, dict):
        content.setdefault("metadata", {}).update(json.loads(json.dumps(COMMITTED_METADATA)))


def prepare_copy(notebook: pathlib.Path, name: str, preset: str, params: Mapping[str, Any],
                 output_root: pathlib.Path) -> pathlib.Path:
    """``<output root>/lab/<name>.<preset>.ipynb``: ``notebook`` with ``params`` injected (no ``run_dir``: each run
    makes its own run directory), not executed. An existing copy is replaced (it is a scratch copy)."""
    import papermill

    folder = output_root / LAB_DIR
    folder.mkdir(parents=True, exist_ok=True)
    # no .py pair for the copies: jupytext takes the nearest jupytext.toml
    (folder / "jupytext.toml").write_text('# prepared copies (klear lab): not paired\nformats = "ipynb"\n',
                                          encoding="utf-8")
    out = folder / f"{name}.{preset}.ipynb"
    papermill.execute_notebook(str(notebook), str(out), parameters=dict(params), prepare_only=True,
                               kernel_name="python3", progress_bar=False)
    import nbformat

    nb = nbformat.read(str(out), as_version=4)
    nb.metadata.pop("jupytext", None)  # the tracked notebook's pairing (formats) travels in its metadata: not here
    nbformat.write(nb, str(out))
    return out


def lab_argv(repo_root: pathlib.Path, open_path: pathlib.Path | None, config_file: pathlib.Path,
             extra: Sequence[str] = ()) -> list[str]:
    """The ``jupyter lab`` command line (written config in ``config_file``): root at the repository, the .py halves
    hidden, tracked notebooks saved with their committed metadata, opened on ``open_path`` (default
    ``notebooks/``)."""
    import sys

    target = (open_path or repo_root / "notebooks").resolve().relative_to(repo_root.resolve()).as_posix()
    url = f"/lab/tree/{target}"
    config = {"ServerApp": {"root_dir": str(repo_root), "default_url": url},
              "ContentsManager": {"hide_globs": list(HIDE_GLOBS), "pre_save_hook": "klear_lib.lab.pre_save_hook"}}
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    jupyter = pathlib.Path(sys.executable).with_name("jupyter")
    argv = [str(jupyter) if jupyter.exists() else "jupyter", "lab", f"--config={config_file}"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        argv.append("--allow-root")  # Jupyter refuses to run as root without it (containers, GPU boxes)
    return argv + list(extra)
