"""klear_lib.notebook: runs land in the checkout's outputs/ whatever the working directory (JupyterLab starts
kernels in notebooks/), list parameters fail with the parameter's name, configs come from a notebook's names."""

import pytest

from klear_lib import notebook
from klear_lib.config import RLExperimentConfig


def test_runs_land_in_the_checkouts_outputs_whatever_the_working_directory(tmp_path, monkeypatch):
    root = notebook.repo_root()
    assert root is not None and (root / "notebooks").is_dir()
    monkeypatch.delenv(notebook.OUTPUT_ROOT_ENV, raising=False)
    monkeypatch.chdir(root / "notebooks")  # where JupyterLab starts a kernel
    assert notebook.output_root() == root / "outputs"
    monkeypatch.setenv(notebook.OUTPUT_ROOT_ENV, str(tmp_path / "elsewhere"))
    run = notebook.start_run("99_example", "", {"x": 1})
    assert run.parent.parent == tmp_path / "elsewhere" and (run / "config.json").is_file()


@pytest.mark.parametrize("value, message", [
    ("abc", "seeds = 'abc': 'abc' is not a valid int"),
    ("", "seeds = '': expected a comma-separated list without empty items"),
    ("0,,1", "without empty items"),
    (None, "seeds = None: expected a comma-separated list"),
    ("0,0", "an item is repeated"),
])
def test_parse_list_names_the_parameter(value, message):
    with pytest.raises(ValueError, match=message):
        notebook.parse_list(value, "seeds", int)


def test_parse_list_values():
    assert notebook.parse_list(1, "seeds", int) == [1]  # -p seeds=1 arrives as an int
    assert notebook.parse_list("0, 1,2", "seeds", int) == [0, 1, 2]
    assert notebook.parse_list("a,b", "arms", allowed={"a": 1, "b": 2}) == ["a", "b"]
    with pytest.raises(ValueError, match=r"unknown \['c'\]; valid: \['a', 'b'\]"):
        notebook.parse_list("a,c", "arms", allowed={"a": 1, "b": 2})


def test_config_from_takes_the_fields_a_notebook_defines():
    names = {"rollouts": 3, "rl_lr": 1e-4, "seeds": "0,1", "time": object(), "loss_name_typo": 1}
    cfg = notebook.config_from(RLExperimentConfig, names, sft_alpha=0.0)
    assert (cfg.rollouts, cfg.rl_lr, cfg.sft_alpha) == (3, 1e-4, 0.0)
    with pytest.raises(ValueError, match="rl_lr must be > 0"):
        notebook.config_from(RLExperimentConfig, {"rl_lr": -1.0})


def test_a_runs_cache_is_in_its_own_output_root(tmp_path):
    run = tmp_path / "root" / "03_rl_clip_variants" / "20260101-000000"
    assert notebook.cache_root(run) == tmp_path / "root" / ".cache"
