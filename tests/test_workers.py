"""``workers: auto``: a notebook's worker count defaults to the cores this process may use, so that ``make reproduce``
scales with the machine (issue 34, item 6). One rule, ``presets.resolve_workers``, serves ``klear run``'s checks
before a kernel starts and the notebooks' config cells (papermill, JupyterLab); a count above the cores, 0 or a
negative is refused naming the parameter; the number used lands in the run directory (``params.json``'s
``workers_resolved``, the notebook's ``config.json``). The count changes how many units run at once, never a unit's
numbers: each runs with a fixed number of torch threads (``experiment.run_jobs``; the last test)."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from klear_lib import cli, experiment, presets

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "workers"
DIRS = ["--notebooks-dir", str(FIXTURES / "nb"), "--params-dir", str(FIXTURES / "params")]


@pytest.fixture
def two_cores(monkeypatch):
    """This process may run on CPUs 0 and 1 only, whatever the machine has."""
    monkeypatch.setattr(presets.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)


def test_auto_is_the_cpus_this_process_may_use(monkeypatch):
    monkeypatch.setattr(presets.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    monkeypatch.setattr(presets.os, "cpu_count", lambda: 64)  # the affinity mask wins over the machine's count
    assert presets.usable_cpus() == 3
    assert presets.resolve_workers("auto") == 3 and presets.resolve_workers(2) == 2
    monkeypatch.delattr(presets.os, "sched_getaffinity", raising=False)  # macOS, Windows
    assert presets.resolve_workers("auto", "judge_workers") == 64


@pytest.mark.parametrize("bad,message", [
    (8, "workers = 8: this machine gives this process 2 cores; use workers: auto or at most 2"),
    (0, "workers = 0: expected an integer >= 1 or 'auto'"),
    (-1, "workers = -1: expected an integer >= 1 or 'auto'"),
    (1.5, "workers = 1.5: expected an integer >= 1 or 'auto'"),
    (True, "workers = True: expected an integer >= 1 or 'auto'"),
    ("all", "workers = 'all': expected an integer >= 1 or 'auto'"),
])
def test_a_count_the_machine_lacks_or_below_one_is_refused_naming_it(two_cores, bad, message):
    with pytest.raises(ValueError) as err:
        presets.resolve_workers(bad)
    assert str(err.value).startswith(message), str(err.value)


def test_klear_run_refuses_more_workers_than_cores_before_a_kernel_starts(two_cores, tmp_path, capsys):
    argv = ["run", "03", "--preset", "smoke", "-p", "workers=8", "--output-root", str(tmp_path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "workers = 8: this machine gives this process 2 cores; use workers: auto or at most 2 (from -p)" in err
    assert len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.rglob("*.ipynb"))  # no run directory, no kernel


@pytest.mark.parametrize("nb,key", [("03_rl_clip_variants", "workers"), ("07_evaluation", "judge_workers")])
def test_the_notebooks_config_cells_resolve_auto_and_refuse_a_bad_count(two_cores, nb, key):
    """What a papermill or JupyterLab run meets (klear run meets check_types first): the config cell's rule."""
    tiny = presets.load_params(nb, "tiny", params_dir=ROOT / "params")
    assert tiny[key] == "auto"
    for bad in (0, -1, 3):
        with pytest.raises(presets.KlearError, match=f"{key} = {bad}: "):
            presets.dry_run_config(ROOT / "notebooks" / f"{nb}.ipynb", {**tiny, key: bad})


def test_the_resolved_count_lands_in_the_run_directory(tmp_path, capsys):
    out_root = tmp_path / "outputs"
    assert cli.main(["run", "95_workers", "--output-root", str(out_root), *DIRS]) == 0
    [run_dir] = sorted((out_root / "95_workers").iterdir())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    record = json.loads((run_dir / "params.json").read_text())
    assert record["params"]["workers"] == "auto" and record["workers_resolved"] == {"workers": cores}
    assert json.loads((run_dir / "config.json").read_text()) == {"workers": cores}  # what the notebook used


def test_a_units_numbers_do_not_depend_on_how_many_ran_beside_it(tmp_path):
    """Every unit runs on ``threads`` torch threads whatever ``workers`` is, so its float results are the same
    bits alone or beside others (a matrix product's sum depends on the thread count's split of the work)."""
    def run(workers: int, name: str) -> list:
        jobs = [experiment.Job(f"facts/{i}", "jobfns:worker_facts", {"threads_op": True}) for i in range(2)]
        results = experiment.run_jobs(jobs, tmp_path / name, workers=workers, progress=lambda *_: None)
        return [(r["threads"], r["checksum"]) for r in results.values()]

    alone, beside = run(1, "one"), run(2, "two")
    assert alone == beside and {t for t, _ in alone} == {1}
