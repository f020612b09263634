"""The verl adapter says what it runs with: its resolved options (KLEAR_VERL_LOSS over verl's actor config) are
logged when verl loads it and when verl's tracker starts, added to the config the tracker records and written beside
verl's checkpoints (trainer.default_local_dir). verl as in tests/test_verl.py (its loss code from <venv>/verl-nodeps).
"""

import importlib.util
import inspect
import json
import os
import pathlib
import subprocess
import sys

import pytest

VERL_DIR = pathlib.Path(os.environ.get("KLEAR_VERL_DIR") or pathlib.Path(sys.prefix) / "verl-nodeps")
if VERL_DIR.is_dir() and str(VERL_DIR) not in sys.path:
    sys.path.append(str(VERL_DIR))  # before klear_lib.integrations.verl, which loads verl when it can find it
if importlib.util.find_spec("verl") is None:
    if os.environ.get("KLEAR_REQUIRE_VERL") == "1":
        raise RuntimeError(f"KLEAR_REQUIRE_VERL=1 but verl is not installed (neither importable nor in {VERL_DIR})")
    pytest.skip("verl is not installed", allow_module_level=True)

from klear_lib.integrations import verl as kv  # noqa: E402 (after the skip: it loads verl)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _env(**extra) -> dict:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH"), str(VERL_DIR)]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def test_loading_through_verl_logs_the_resolved_options(tmp_path):
    out = subprocess.run([sys.executable, "-c", "import verl"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120, env=_env(VERL_USE_EXTERNAL_MODULES="klear_lib.integrations.verl",
                                               KLEAR_VERL_LOSS='{"erc_low": 0.9, "sft_alpha": 0.05}'))
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("klear_lib.integrations.verl: ")]
    assert lines == ["klear_lib.integrations.verl: registered ['gppo', 'gppo_erc', 'ppo_clip_erc'] in verl 0.9.1's "
                     "policy-loss registry; KLEAR_VERL_LOSS={\"erc_low\": 0.9, \"sft_alpha\": 0.05}: sft_alpha=0.05, "
                     "beta_low=1.0, beta_high=1.0, ERC bounds {'gppo_erc': (0.9, 1.2), 'ppo_clip_erc': (0.9, 1.2)} "
                     "(clip ranges: verl's actor config)"], out.stderr[-2000:]


def _run_config(folder) -> dict:
    """The plain dict verl's trainers hand their tracker (OmegaConf.to_container of the run config), trimmed."""
    return {"trainer": {"default_local_dir": str(folder), "project_name": "p", "experiment_name": "e"},
            "actor_rollout_ref": {"actor": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0,
                                            "loss_agg_mode": "token-mean",
                                            "policy_loss": {"loss_mode": "gppo_erc"}}}}


def test_the_tracker_records_the_options_and_they_are_written_beside_the_checkpoints(tmp_path, monkeypatch, caplog):
    from verl.utils.tracking import Tracking

    monkeypatch.setenv(kv.OPTIONS_ENV, '{"erc_low": 0.85, "erc_high": 1.15, "beta_high": 0.5}')
    config = _run_config(tmp_path / "ckpt")
    Tracking(project_name="p", experiment_name="e", default_backend=[], config=config)
    written = json.loads((tmp_path / "ckpt" / kv.OPTIONS_FILE).read_text())
    assert config[kv.OPTIONS_KEY] == written  # what wandb, mlflow, swanlab, clearml record as the run's config
    assert written["loss_mode"] == "gppo_erc" and written["sft_alpha"] == 0.1
    used = written["losses"]["gppo_erc"]
    assert (used["klear_loss"], used["clip_ratio_low"], used["clip_ratio_high"], used["clip_ratio_c"]) == (
        "gppo", 0.2, 0.28, 10.0)  # verl's actor config
    assert (used["erc_low"], used["erc_high"], used["beta_high"], used["beta_low"]) == (0.85, 1.15, 0.5, 1.0)
    assert written["losses"]["gppo"]["erc_low"] is None  # the plain GPPO loss has no ERC
    assert written["env"] == {kv.OPTIONS_ENV: '{"erc_low": 0.85, "erc_high": 1.15, "beta_high": 0.5}'}


def test_bad_options_fail_when_the_tracker_starts_not_steps_later(tmp_path, monkeypatch):
    from verl.utils.tracking import Tracking

    monkeypatch.setenv(kv.OPTIONS_ENV, '{"erc_lo": 0.8}')
    with pytest.raises(ValueError, match=r"KLEAR_VERL_LOSS: unknown key\(s\) \['erc_lo'\]"):
        Tracking(project_name="p", experiment_name="e", default_backend=[], config=_run_config(tmp_path))


def test_pinned_verl_tracker_the_options_hook_relies_on():
    """verl 0.9.1's trainers build ``Tracking`` with the whole run config as a plain dict, and its ``__init__`` takes
    (project_name, experiment_name, default_backend, config)."""
    from verl.utils.tracking import Tracking

    assert getattr(Tracking.__init__, "_klear_hooked", False)
    params = list(inspect.signature(inspect.unwrap(Tracking.__init__)).parameters)
    assert params == ["self", "project_name", "experiment_name", "default_backend", "config"]
    for rel in ("trainer/ppo/v1/trainer_base.py", "trainer/ppo/ray_trainer.py"):
        src = (pathlib.Path(importlib.util.find_spec("verl").origin).parent / rel).read_text()
        assert "config=OmegaConf.to_container(self.config, resolve=True)" in src, rel
