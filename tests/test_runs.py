"""The run-directory contract (klear_lib.runs): what a run writes is what a reader gets back."""

import dataclasses
import json
import math
import os
import pathlib
import random
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

import klear_lib
from klear_lib import runs

HAS_GIT = shutil.which("git") is not None


@dataclasses.dataclass
class Optim:
    lr: float = 1e-4
    betas: tuple = (0.9, 0.99)


@dataclasses.dataclass
class Config:
    seed: int = 0
    out: pathlib.Path = pathlib.Path("outputs/x")
    optim: Optim = dataclasses.field(default_factory=Optim)
    loss: str = "gppo"


def test_create_run_dir_is_stamped_and_unique(tmp_path):
    first = runs.create_run_dir(tmp_path / "a" / "b", "03_rl", stamp="20250101-120000")
    second = runs.create_run_dir(tmp_path / "a" / "b", "03_rl", stamp="20250101-120000")
    third = runs.create_run_dir(tmp_path / "a" / "b", "03_rl", stamp="20250101-120000")
    assert first == tmp_path / "a" / "b" / "03_rl" / "20250101-120000"
    assert [second.name, third.name] == ["20250101-120000-2", "20250101-120000-3"]
    assert all(d.is_dir() and not any(d.iterdir()) for d in (first, second, third))
    default = runs.create_run_dir(tmp_path, "03_rl")
    assert len(default.name) == len("YYYYmmdd-HHMMSS") and default.name[8] == "-"
    with pytest.raises(ValueError):
        runs.create_run_dir(tmp_path, "../escape")


def test_metadata_files_and_config_round_trip(tmp_path):
    runs.write_run_metadata(tmp_path, Config(seed=7))
    text = (tmp_path / "config.json").read_text()
    assert json.loads(text) == {
        "seed": 7,
        "out": "outputs/x",
        "optim": {"lr": 1e-4, "betas": [0.9, 0.99]},
        "loss": "gppo",
    }
    assert text.index('"loss"') < text.index('"optim"') < text.index('"out"') < text.index('"seed"')  # sorted
    assert text.startswith('{\n  "')  # indent 2

    versions = json.loads((tmp_path / "versions.json").read_text())
    assert set(runs.TRACKED_PACKAGES) | {"python", "platform", "cpu", "cpu_id", "cpu_count",
                                          "cpu_capability"} == set(versions)
    assert versions["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # e.g. AVX2, AVX512
    assert versions["cpu_count"] == str(os.cpu_count())
    if pathlib.Path("/proc/cpuinfo").is_file():
        cpuinfo = pathlib.Path("/proc/cpuinfo").read_text(errors="replace")
        assert f": {versions['cpu']}" in cpuinfo or "model name" not in cpuinfo
        first = cpuinfo.split("\n\n")[0]  # the first processor: its family, model and stepping, read a second way
        fields = dict(re.findall(r"^(cpu family|model|stepping)\s*:\s*(\S+)", first, flags=re.M))
        if fields:
            assert versions["cpu_id"] == f"{fields['cpu family']}/{fields['model']}/{fields['stepping']}"
    assert versions["torch"] == torch.__version__
    assert versions["numpy"] == np.__version__
    assert versions["klear_lib"].startswith(klear_lib.__version__)
    assert runs.package_versions(["surely-not-installed-pkg"]) == {"surely-not-installed-pkg": "not installed"}

    git = json.loads((tmp_path / "git.json").read_text())
    assert {"commit", "dirty", "branch"} <= set(git)

    runs.write_run_metadata(tmp_path / "from_dict", {"b": {"c": 1}, "a": np.float32(0.5)})
    assert (tmp_path / "from_dict" / "config.json").read_text() == '{\n  "a": 0.5,\n  "b": {\n    "c": 1\n  }\n}\n'
    with pytest.raises(TypeError):
        runs.write_run_metadata(tmp_path, ["not", "a", "config"])


@pytest.mark.skipif(not HAS_GIT, reason="needs git")
def test_git_commit_is_head_of_the_checkout_holding_klear_lib():
    pkg_dir = pathlib.Path(klear_lib.__file__).resolve().parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=pkg_dir, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("klear_lib is not in a git checkout with commits")
    assert runs.git_info()["commit"] == head.stdout.strip()


@pytest.mark.skipif(not HAS_GIT, reason="needs git")
def test_git_info_dirty_flag_and_outside_a_repo(tmp_path):
    outside = tmp_path / "plain"
    outside.mkdir()
    assert runs.git_info(outside) == {"commit": "unknown", "dirty": None, "branch": None, "root": None}

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    (repo / "f.txt").write_text("1")
    subprocess.run([*git, "add", "f.txt"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "c"], cwd=repo, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    info = runs.git_info(outside, repo)  # the first folder is not a checkout: the second one is used
    assert info == {"commit": sha, "dirty": False, "branch": "main", "root": str(repo.resolve())}
    (repo / "untracked.txt").write_text("run output")
    assert runs.git_info(repo)["dirty"] is False  # untracked files do not count
    (repo / "f.txt").write_text("2")
    assert runs.git_info(repo)["dirty"] is True


def test_metrics_round_trip_with_numpy_torch_nan_and_inf(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [
        {"step": np.int64(1), "loss": np.float32(0.25), "acc": torch.tensor(0.5), "ok": np.bool_(True)},
        {"step": 2, "loss": float("nan"), "grad": torch.tensor([1.0, 2.0]), "kl": math.inf, "low": -math.inf},
        {"step": 3, "nested": {"a": float("nan"), "b": [np.float64(1.5)]}, "phase": "rl"},
    ]
    with runs.MetricsWriter(path) as log:
        for r in records:
            log.write(r)
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    assert all(json.loads(line) for line in lines)  # strict JSON: no NaN/Infinity tokens
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()

    back = runs.read_metrics(path)
    assert back[0] == {"step": 1, "loss": 0.25, "acc": 0.5, "ok": True}
    assert type(back[0]["step"]) is int and type(back[0]["ok"]) is bool
    assert math.isnan(back[1]["loss"]) and back[1]["kl"] == math.inf and back[1]["low"] == -math.inf
    assert back[1]["grad"] == [1.0, 2.0]
    assert math.isnan(back[2]["nested"]["a"]) and back[2]["nested"]["b"] == [1.5] and back[2]["phase"] == "rl"


def test_metrics_are_on_disk_before_close_and_appended_on_reopen(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = runs.MetricsWriter(path)
    log.write({"step": 1})
    assert runs.read_metrics(path) == [{"step": 1}]  # flushed as written: a crash now loses nothing
    log.close()
    with runs.MetricsWriter(path) as log:  # a resumed run continues the file
        log.write({"step": 2})
    assert [r["step"] for r in runs.read_metrics(path)] == [1, 2]
    with pytest.raises(TypeError):
        with runs.MetricsWriter(path) as log:
            log.write({"step": object()})


def test_truncated_last_line_is_skipped_with_a_warning_and_cut_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')  # crashed mid-write
    with pytest.warns(UserWarning, match=r"metrics.jsonl:3"):
        assert runs.read_metrics(path) == [{"step": 1}, {"step": 2}]
    with pytest.warns(UserWarning, match="partial last line"):
        with runs.MetricsWriter(path) as log:
            log.write({"step": 3})
    assert runs.read_metrics(path) == [{"step": 1}, {"step": 2}, {"step": 3}]


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
    with pytest.raises(runs.MetricsFormatError, match=rf"{path}:2"):
        runs.read_metrics(path)
    path.write_text('{"step": 1}\n[1, 2]\n')
    with pytest.raises(runs.MetricsFormatError, match=r":2: a record must be a JSON object"):
        runs.read_metrics(path)


def test_summary_round_trip_and_contract_check(tmp_path):
    assert runs.check_run_dir(tmp_path) == list(runs.RUN_CONTRACT)
    runs.write_summary(tmp_path, {"avg@4": np.float64(0.375), "steps": torch.tensor(12), "best": None})
    assert runs.read_summary(tmp_path) == {"avg@4": 0.375, "steps": 12, "best": None}
    runs.write_run_metadata(tmp_path, {"seed": 0})
    assert runs.check_run_dir(tmp_path) == ["metrics.jsonl"]
    with runs.MetricsWriter(tmp_path / "metrics.jsonl"):
        pass  # opening creates the file, so a run that logs nothing still meets the contract
    assert runs.check_run_dir(tmp_path) == []
    assert runs.check_run_dir(tmp_path, runs.RUN_CONTRACT + (runs.NOTEBOOK_FILE,)) == ["notebook.ipynb"]
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temporaries


def test_set_seed_makes_random_streams_repeat():
    def draw():
        return torch.rand(4), np.random.rand(3), random.random()

    runs.set_seed(1234)
    a = draw()
    runs.set_seed(1234)
    b = draw()
    runs.set_seed(4321)
    c = draw()
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    assert not torch.equal(a[0], c[0]) and not np.array_equal(a[1], c[1]) and a[2] != c[2]


def test_set_seed_leaves_the_states_transformers_set_seed_leaves_without_importing_it():
    import subprocess
    import sys

    import transformers

    def states():
        return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()

    transformers.set_seed(77)
    theirs = states()
    runs.set_seed(77)
    ours = states()
    assert torch.equal(theirs[0], ours[0]) and np.array_equal(theirs[1], ours[1]) and theirs[2] == ours[2]
    code = "import sys; from klear_lib import runs; runs.set_seed(0); print('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == \
        "False"
