"""JupyterLab without traps (klear_lib.lab, `klear lab`), checked with the contents manager Lab saves through
(jupytext's, as the `lab` extra installs it) on a copy of the repository in its own git checkout: opening and saving
an unchanged notebook, the .ipynb or the .py, leaves `git status` clean, also after Lab attached a kernel (it rewrites
kernelspec and language_info); each notebook is one entry; a quick run's prepared copy lives in outputs/lab/, with
the preset's parameters injected, and saving it writes no .py pair and touches no tracked file."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import nbformat
import pytest

from klear_lib import cli, lab, runner

ROOT = pathlib.Path(__file__).resolve().parent.parent
jupytext = pytest.importorskip("jupytext")


def git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def checkout(tmp_path):
    """notebooks/, params/, jupytext.toml and .gitignore of the repository, committed in a fresh git repository."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("notebooks", "params"):
        shutil.copytree(ROOT / name, repo / name)
    for name in ("jupytext.toml", ".gitignore"):
        shutil.copy(ROOT / name, repo / name)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x")
    return repo


class contents_manager:
    """jupytext's asynchronous contents manager, the one JupyterLab's server runs with the jupytext extension,
    configured as `klear lab` configures the server (its config file); get/save run to completion."""

    def __init__(self, root: pathlib.Path, config_file: pathlib.Path | None = None):
        from jupytext import AsyncTextFileContentsManager
        from traitlets.config import Config

        config = Config(json.loads(config_file.read_text())) if config_file else Config()
        self.cm = AsyncTextFileContentsManager(root_dir=str(root), config=config)

    def get(self, *args, **kwargs):
        return asyncio.run(self.cm.get(*args, **kwargs))

    def save(self, *args, **kwargs):
        return asyncio.run(self.cm.save(*args, **kwargs))


def lab_config(repo, open_path=None) -> pathlib.Path:
    config = repo / "outputs" / "lab" / "jupyter_server_config.json"
    argv = lab.lab_argv(repo, open_path, config)
    assert argv[1:3] == ["lab", f"--config={config}"]
    return config


NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_the_server_is_rooted_at_the_repository_and_opens_the_notebooks(checkout):
    settings = json.loads(lab_config(checkout).read_text())
    assert settings["ServerApp"] == {"root_dir": str(checkout), "default_url": "/lab/tree/notebooks"}
    assert settings["ContentsManager"]["pre_save_hook"] == "klear_lib.lab.pre_save_hook"


def test_opening_and_saving_unchanged_notebooks_leaves_git_status_clean(checkout):
    cm = contents_manager(checkout, lab_config(checkout))
    for name in NOTEBOOKS:
        for path in (f"notebooks/{name}", f"notebooks/{name[:-6]}.py"):
            model = cm.get(path, content=True, type="notebook")
            cm.save(model, path)
    assert git(checkout, "status", "--porcelain") == ""


def test_a_kernel_attached_by_lab_does_not_dirty_the_checkout(checkout):
    """Lab sets the running kernel's kernelspec and language_info (with the machine's Python version) on the model
    it saves; the tracked notebooks keep their committed ones."""
    cm = contents_manager(checkout, lab_config(checkout))
    path = "notebooks/03_rl_clip_variants.ipynb"
    model = cm.get(path, content=True, type="notebook")
    model["content"]["metadata"]["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                                  "name": "python3"}
    model["content"]["metadata"]["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py", "mimetype": "text/x-python",
        "name": "python", "nbconvert_exporter": "python", "pygments_lexer": "ipython3", "version": "3.11.7"}
    cm.save(model, path)
    assert git(checkout, "status", "--porcelain") == ""
    # an edit of a cell is a change, as it should be: in both halves
    model["content"]["cells"][1]["source"] += "\n# an edit"
    cm.save(model, path)
    assert sorted(git(checkout, "status", "--porcelain").split()) == [
        "M", "M", path, path.replace(".ipynb", ".py")]


def test_a_lab_rooted_at_notebooks_saves_clean_too(checkout):
    """The old `make lab` rooted Lab at notebooks/, where jupytext never reads jupytext.toml and a save rewrote the
    .py half with a YAML header. The notebooks now carry jupytext's filters in their own metadata (as its contents
    manager writes them), so even that save leaves the checkout clean."""
    cm = contents_manager(checkout / "notebooks")
    for name in ("03_rl_clip_variants.ipynb", "04_erc_bounds.py"):
        cm.save(cm.get(name, content=True, type="notebook"), name)
    assert git(checkout, "status", "--porcelain") == ""
    meta = nbformat.read(checkout / "notebooks" / "03_rl_clip_variants.ipynb", as_version=4).metadata["jupytext"]
    assert meta == {"cell_metadata_filter": "tags,-all", "formats": "ipynb,py:percent",
                    "notebook_metadata_filter": "-all"}


def test_each_notebook_is_one_entry(checkout):
    cm = contents_manager(checkout, lab_config(checkout))
    names = sorted(item["name"] for item in cm.get("notebooks", content=True)["content"])
    assert names == sorted(NOTEBOOKS), names
    assert cm.get("notebooks/03_rl_clip_variants.py", content=True, type="notebook")["content"]["cells"]  # still opens


def test_a_quick_run_opens_a_prepared_copy_outside_the_tracked_files(checkout):
    layout = runner.Layout(repo_root=checkout, notebooks_dir=checkout / "notebooks", params_dir=checkout / "params",
                        output_root=checkout / "outputs")
    nb, name, params = runner.resolve("03", "smoke", ["seeds=0"], layout)
    copy = lab.prepare_copy(nb, name, "smoke", params, layout.output_root)
    assert copy == checkout / "outputs" / "lab" / "03_rl_clip_variants.smoke.ipynb"
    cells = nbformat.read(copy, as_version=4).cells
    injected = next(c for c in cells if "injected-parameters" in c.metadata.get("tags", []))
    src = injected.source
    assert 'sft_lr = 0.004' in src and 'rl_lr = 0.0001' in src and 'seeds = "0"' in src and "run_dir" not in src
    config = lab_config(checkout, copy)
    assert json.loads(config.read_text())["ServerApp"]["default_url"] == \
        "/lab/tree/outputs/lab/03_rl_clip_variants.smoke.ipynb"
    cm = contents_manager(checkout, config)
    rel = "outputs/lab/03_rl_clip_variants.smoke.ipynb"
    model = cm.get(rel, content=True, type="notebook")
    model["content"]["cells"][0]["source"] += "\nedited in Lab"
    cm.save(model, rel)
    assert sorted(p.name for p in copy.parent.iterdir() if not p.name.startswith(".")) == [
        "03_rl_clip_variants.smoke.ipynb", "jupyter_server_config.json", "jupytext.toml"]  # no .py pair
    assert git(checkout, "status", "--porcelain") == ""  # outputs/ is not tracked


def test_klear_lab_refuses_an_output_root_outside_the_repository(tmp_path, capsys):
    assert cli.main(["lab", "03", "--preset", "smoke", "--print-command", "--output-root", str(tmp_path)]) == 2
    assert "outside the repository" in capsys.readouterr().err


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_notebook_carries_the_metadata_a_lab_save_writes(name):
    """What jupytext's contents manager and klear_lib.lab.pre_save_hook write on a save, so that a save changes
    nothing: the jupytext filters of jupytext.toml and the committed kernelspec and language_info."""
    meta = nbformat.read(ROOT / "notebooks" / name, as_version=4).metadata
    assert meta == {"jupytext": {"cell_metadata_filter": "tags,-all", "formats": "ipynb,py:percent",
                                 "notebook_metadata_filter": "-all"}, **lab.COMMITTED_METADATA}


README = (ROOT / "README.md").read_text(encoding="utf-8")


def _venv_ready() -> str | None:
    """Why `make` here would set the environment up again (then a test that runs make as written is skipped), or
    None: the running interpreter is the Makefile's venv and its set-up is current."""
    venv = pathlib.Path(sys.prefix)
    if not (venv / ".klear-installed").is_file():
        return f"{venv} is not a venv made by `make setup` (no .klear-installed)"
    stamp = subprocess.run(["make", "-q", "-f", str(ROOT / "Makefile"), f"VENV={venv}", str(venv / ".klear-installed")],
                           cwd=ROOT, capture_output=True)
    return None if stamp.returncode == 0 else "the venv's set-up is older than pyproject.toml or the lock: `make setup`"


def _get(base: str, token: str, path: str) -> dict:
    request = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def _end_group(proc: subprocess.Popen) -> bool:
    """SIGTERM to ``proc``'s process group, then SIGKILL if it still runs 120 s later; whether SIGTERM ended it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        return True
    except ProcessLookupError:
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


def test_make_lab_nb_03_as_written_serves_the_prepared_copy(tmp_path):
    """The README's `make lab NB=03`, really started (make, `klear lab 03 --preset smoke`, jupyter_server): the
    server answers on its own port with the prepared copy (smoke's parameters injected) and the notebooks folder,
    one entry per notebook; SIGTERM ends it."""
    assert "`make lab NB=03`" in README
    if why := _venv_ready():
        pytest.skip(why)
    runtime, log = tmp_path / "runtime", tmp_path / "make-lab.log"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "BROWSER": "true"}  # the browser it opens: `true`
    with log.open("wb") as sink:
        proc = subprocess.Popen(["make", "-s", "lab", "NB=03", f"VENV={sys.prefix}"], cwd=ROOT, env=env,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        info, deadline = None, time.monotonic() + 300  # a margin for a busy machine; the server is up in seconds
        while info is None:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "no server after 300 s"
            time.sleep(0.5)
            for found in runtime.glob("jpserver-*.json"):  # maybe not written whole yet
                try:
                    info = json.loads(found.read_text())
                except ValueError:
                    pass
        base, token = f"http://127.0.0.1:{info['port']}", info["token"]
        copy = None
        while copy is None:  # the server binds its port in its event loop, maybe after writing that file
            try:
                copy = _get(base, token, "/api/contents/outputs/lab/03_rl_clip_variants.smoke.ipynb?content=1")
            except urllib.error.URLError as refused:
                assert isinstance(refused.reason, ConnectionRefusedError) and time.monotonic() < deadline, refused
                time.sleep(0.5)
        injected = [c for c in copy["content"]["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
        assert len(injected) == 1 and re.search(r"^sft_lr = 0\.004$", injected[0]["source"], re.M), injected
        names = sorted(item["name"] for item in _get(base, token, "/api/contents/notebooks")["content"])
        assert names == NOTEBOOKS  # the .py halves hidden
        assert info["root_dir"] == str(ROOT)
    finally:
        ended_on_term = _end_group(proc)
    assert ended_on_term, "the server did not end within 120 s of SIGTERM (killed)"
    out = log.read_text(errors="replace")
    assert "03_rl_clip_variants.smoke.ipynb" in out, out[-3000:]


def test_jupytext_sync_as_written_updates_the_ipynb_half(checkout):
    """The README's `.venv/bin/jupytext --sync notebooks/NN_name.py` after editing a .py half elsewhere: the
    .ipynb takes the edit and the pair agrees again."""
    command = re.search(r"`\.venv/bin/(jupytext --sync notebooks/NN_name\.py)`", README).group(1)
    jupytext_bin = pathlib.Path(sys.executable).with_name("jupytext")
    py = checkout / "notebooks" / "06_sft_loss_alpha.py"
    py.write_text(py.read_text(encoding="utf-8").replace("# %% [markdown]\n", "# %% [markdown]\n# edited as text\n#\n",
                                                          1), encoding="utf-8")
    argv = [str(jupytext_bin), *command.replace("NN_name", "06_sft_loss_alpha").split()[1:]]
    subprocess.run(argv, cwd=checkout, check=True, capture_output=True)
    cells = nbformat.read(checkout / "notebooks" / "06_sft_loss_alpha.ipynb", as_version=4).cells
    assert cells[0].source.startswith("edited as text"), cells[0].source[:80]
    assert sorted(git(checkout, "status", "--porcelain").split()) == [
        "M", "M", "notebooks/06_sft_loss_alpha.ipynb", "notebooks/06_sft_loss_alpha.py"]
    paired = jupytext.read(py)
    assert [c.source for c in paired.cells] == [c.source for c in cells]
