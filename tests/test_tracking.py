"""`report_to`: TRL's trainers log to an experiment tracker (here TensorBoard, on the CPU; trackio and wandb where
installed) under the run directory's `tracking/` folder, the notebook as the project and the unit as the run, step
metrics and the rollout records (held-out evaluation) alike, each under its own name (no `train/` on `eval/*`);
TensorBoard also gets the resolved config as hparams; metrics.jsonl is written either way; a tracker that is not
installed is refused before any work."""

import os
import tempfile

import pytest
import torch

from klear_lib import cli, config, experiment, models, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.experiment import UnitTracking
from klear_lib.train import tracking
from klear_lib.train.rl_run import run_rl

pytest.importorskip("tensorboard")


def scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in folder.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    return tags


def hparams_of(folder) -> dict:
    """The hparams a TensorBoard run holds (the HPARAMS tab's session start info), read from the event files."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    out = {}
    for events in folder.rglob("events.out.tfevents.*"):
        for event in EventFileLoader(str(events)).Load():
            for value in event.summary.value:
                if value.tag == "_hparams_/session_start_info":
                    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    for k, v in data.session_start_info.hparams.items():
                        out[k] = getattr(v, v.WhichOneof("kind"))
    return out


def tiny_rl(tmp_path, report_to="tensorboard", tracking_dir=None, rollouts=1):
    cfg = RLExperimentConfig(n_train=64, n_heldout=4, levels="1,2", rollouts=rollouts, rollout_prompts=2,
                             mini_batch_prompts=1, num_generations=4, max_completion_length=12, eval_n=1,
                             eval_every=1, filter_groups=False, report_to=report_to, fork_facts="")
    train, held = tasks.make_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, cfg.level_list)
    tok = models.build_tokenizer(tasks.corpus(train))
    spec = models.TinyModelSpec(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                intermediate_size=64)
    model = models.build_tiny_model(tok, spec)
    with runs.MetricsWriter(tmp_path / "metrics.jsonl") as w:
        run_rl(cfg, model, tok, train, held, w, tags={"seed": 0}, tracking_dir=tracking_dir,
               output_dir=tmp_path / "out", progress=lambda *_: None)
    return cfg


def test_rl_run_writes_tensorboard_events_under_the_unit_with_own_names_and_hparams(tmp_path):
    unit = UnitTracking("tensorboard", tmp_path / "tracking", "03_rl_clip_variants", "gppo/lr=0.0001/seed=0")
    cfg = tiny_rl(tmp_path, tracking_dir=unit)
    folder = tmp_path / "tracking" / "tensorboard" / "gppo" / "lr=0.0001" / "seed=0"
    assert os.fspath(unit) == str(folder)
    tags = scalars(folder)
    # a step's metrics keep their namespaces; TRL's clip names beside them; flat keys get transformers' train/
    assert {"actor/pg_loss", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
            "train/grad_norm"} <= tags, sorted(tags)
    assert "eval/avg_at_n" in tags and not any(t.startswith("train/eval/") for t in tags), sorted(tags)
    assert not any(t.startswith("train/actor/") for t in tags)
    hp = hparams_of(folder)
    assert (hp["rl_lr"], hp["loss_name"], hp["rollouts"], hp["use_cpu"]) == (cfg.rl_lr, "gppo", 1, True), hp
    assert hp["clip_ratio_c"] == 10.0 and hp["erc_low"] == "None"
    records = runs.read_metrics(tmp_path / "metrics.jsonl")
    step = next(r for r in records if "actor/pg_loss" in r)
    low, high = step["actor/pg_clipfrac_low"], step["actor/pg_clipfrac_high"]
    assert step["clip_ratio/region_mean"] == pytest.approx(low + high)
    assert step["clip_ratio/low_mean"] == step["actor/pg_clipfrac_low"]


def test_a_unit_tracks_into_its_notebook_run_directory_named_after_its_key(tmp_path):
    """Through run_jobs (worker processes): the folder, the project (the notebook) and the run (the unit's key, '/'
    kept), also for units that run_jobs runs in a subfolder of the run directory (03's control/)."""
    run_dir = runs.create_run_dir(tmp_path / "outputs", "03_rl_clip_variants")
    runs.write_run_metadata(run_dir, {"x": 1})
    jobs = [experiment.Job("gppo/lr=0.0001/seed=0", "jobfns:where_it_tracks", {"report_to": "tensorboard"})]
    got = experiment.run_jobs(jobs, run_dir, workers=1, progress=lambda *_: None)["gppo/lr=0.0001/seed=0"]
    assert got["folder"] == str(run_dir / "tracking" / "tensorboard" / "gppo" / "lr=0.0001" / "seed=0")
    assert (got["project"], got["run_name"]) == ("03_rl_clip_variants", "gppo/lr=0.0001/seed=0")
    control = [experiment.Job("control/ppo_clip", "jobfns:where_it_tracks", {"report_to": "trackio"})]
    got = experiment.run_jobs(control, run_dir / "control", workers=1, progress=lambda *_: None)["control/ppo_clip"]
    for timing in ("seconds", "cpu_seconds", "started_at", "ended_at"):
        got.pop(timing)
    assert got == {"folder": str(run_dir / "tracking" / "trackio"), "project": "03_rl_clip_variants",
                   "run_name": "control/ppo_clip"}  # one trackio database per run directory, the unit its run


def test_namespaced_keys_keep_their_names_and_flat_keys_get_transformers_prefix():
    from transformers.integrations import integration_utils

    before = integration_utils.rewrite_logs
    with tracking.tracking_env(UnitTracking("tensorboard", __import__("pathlib").Path("/tmp/klear-x"), "p", "u")):
        rewrite = integration_utils.rewrite_logs
        assert rewrite({"eval/avg_at_n": 1, "loss": 2, "eval_loss": 3, "actor/pg_loss": 4}) == {
            "eval/avg_at_n": 1, "actor/pg_loss": 4, "train/loss": 2, "eval/loss": 3}
        assert os.environ["TENSORBOARD_LOGGING_DIR"].endswith("tensorboard/u") and os.environ["WANDB_PROJECT"] == "p"
        assert "TRACKIO_DIR" not in os.environ  # set for trackio only (its folder is per run, read at import)
    assert integration_utils.rewrite_logs is before and "WANDB_PROJECT" not in os.environ


def test_an_unknown_tracker_is_refused_before_any_work():
    with pytest.raises(ValueError, match=r"report_to must be one of \['none', 'tensorboard', 'trackio', 'wandb'\]"):
        RLExperimentConfig(report_to="mlflow")
    assert torch.__version__  # the import above is the CPU torch


def test_a_tracker_that_is_not_installed_is_refused_before_any_work(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(config.TRACKER_PACKAGES, "wandb", "klear_no_such_tracker_package")
    with pytest.raises(ValueError, match=r"RLExperimentConfig\.report_to = 'wandb': klear_no_such_tracker_package is "
                                         r"not installed .*`pip install klear_no_such_tracker_package`"):
        RLExperimentConfig(report_to="wandb")
    # klear run: refused by the dry run of the config cell, before a kernel starts
    assert cli.main(["run", "06", "--preset", "smoke", "-p", "report_to=wandb", "--output-root", str(tmp_path)]) == 2
    assert "report_to = 'wandb': klear_no_such_tracker_package is not installed" in capsys.readouterr().err
    assert not list(tmp_path.rglob("notebook.ipynb"))


def test_every_optimizer_step_has_its_record_when_rollout_records_are_tracked(tmp_path, monkeypatch):
    """The rollout records reach the tracker through the callbacks' on_log, which clears `should_log`: the step that
    ends a rollout must still be logged (one record per optimizer step, steps 1..N). With no ``output_dir`` the
    trainer's scratch folder is gone after the run (every unit of a notebook runs so)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    cfg = RLExperimentConfig(n_train=64, n_heldout=4, levels="1,2", rollouts=2, rollout_prompts=2,
                             mini_batch_prompts=1, num_generations=4, max_completion_length=10, eval_n=1,
                             eval_every=1, filter_groups=False, fork_facts="")
    train, held = tasks.make_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, cfg.level_list)
    tok = models.build_tokenizer(tasks.corpus(train))
    spec = models.TinyModelSpec(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                intermediate_size=64)
    with runs.MetricsWriter(tmp_path / "metrics.jsonl") as w:
        run_rl(cfg, models.build_tiny_model(tok, spec), tok, train, held, w, tags={"seed": 0},
               progress=lambda *_: None)
    steps = [r["step"] for r in runs.read_metrics(tmp_path / "metrics.jsonl") if "actor/pg_loss" in r]
    assert steps == [1, 2, 3, 4]
    assert not list(scratch.iterdir()), "run_rl left its scratch folder behind"


def test_an_sft_unit_tracks_into_the_run_directory_and_the_events_outlive_its_model(tmp_path):
    """Notebooks 01 and 02: `report_to` reaches the SFT units; their tracker files go to <run dir>/tracking/<unit>,
    not into the fine-tuned model's folder (which the unit deletes)."""
    from klear_lib.config import SFTExperimentConfig
    from klear_lib.data import teachers
    from klear_lib.train import sft_jobs
    from klear_lib.train.sft import SFTStageConfig

    cfg = SFTExperimentConfig.from_params({"tiny_hidden": 32, "tiny_layers": 1, "vocab_size": 400})
    train, held = tasks.make_splits(0, 64, 2)
    samples = teachers.source_samples(teachers.SOURCES["clean"], train, 16, seed=0)
    stage = SFTStageConfig(learning_rate=3e-3, epochs=1.0, batch_size=8, use_cpu=True, bf16=False)
    start = sft_jobs.base_model(cfg, tasks.corpus(train), samples, stage, cache_root=None, out_dir=tmp_path / "base")
    data = sft_jobs.write_samples(tmp_path / "arm.jsonl", samples)
    unit = tmp_path / "run" / "units" / "arm_seed=0.jsonl"
    sft_jobs.sft_unit(start=str(start), data=str(data), stage={**vars(stage), "report_to": "tensorboard"},
                      problems=[p.to_dict() for p in held], evaluation={"n": 1, "max_new_tokens": 8},
                      tags={"variant": "arm", "seed": 0}, metrics_path=str(unit))
    assert not unit.with_suffix(".model").exists()
    tags = scalars(tmp_path / "run" / "tracking" / "tensorboard" / "arm_seed=0")
    assert {"train/train_loss", "train/mean_token_accuracy"} <= tags, sorted(tags)
    assert hparams_of(tmp_path / "run" / "tracking")["learning_rate"] == pytest.approx(3e-3)


@pytest.mark.parametrize("tracker", ["tensorboard", "trackio", "wandb"])
def test_units_of_one_worker_are_separate_runs_under_the_run_directory(tmp_path, tracker, monkeypatch):
    """Two RL units in one worker process (the case where trackio's import-time folder and wandb's open run made two
    units one run): each is its own run, named after its key, in the notebook's project, under <run dir>/tracking/,
    and nothing lands in the home cache. trackio and wandb are optional: the test runs where they are installed."""
    if tracker != "tensorboard":
        pytest.importorskip(tracker)
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / ".cache" / "huggingface"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = runs.create_run_dir(tmp_path / "outputs", "03_rl_clip_variants")
    cfg = RLExperimentConfig(n_train=64, n_heldout=4, levels="1,2", rollouts=1, rollout_prompts=2,
                             mini_batch_prompts=1, num_generations=4, max_completion_length=12, eval_n=1,
                             eval_every=1, filter_groups=False, fork_facts="", report_to=tracker)
    runs.write_run_metadata(run_dir, cfg)
    train, _ = tasks.make_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, cfg.level_list)
    tok = models.build_tokenizer(tasks.corpus(train))
    spec = models.TinyModelSpec(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                intermediate_size=64)
    start = tmp_path / "start"
    models.build_tiny_model(tok, spec).save_pretrained(start)
    tok.save_pretrained(start)
    keys = ["ppo_clip/lr=0.0001/seed=0", "gppo/lr=0.0001/seed=0"]
    jobs = [experiment.Job(k, "klear_lib.train.rl_jobs:rl_unit", {
        "config": {**vars(cfg.replace(loss_name=k.split("/")[0]))}, "start": str(start), "tags": {"seed": 0}})
        for k in keys]
    experiment.run_jobs(jobs, run_dir, workers=1, progress=lambda *_: None)
    root = run_dir / "tracking"
    if tracker == "tensorboard":
        for k in keys:
            assert "eval/avg_at_n" in scalars(root / "tensorboard" / k)
    elif tracker == "trackio":
        import sqlite3

        [db] = (root / "trackio").glob("*.db")
        assert db.stem == "03_rl_clip_variants"
        with sqlite3.connect(db) as con:
            assert sorted({r[0] for r in con.execute("select run_name from metrics")}) == sorted(keys)
            metric_keys = set().union(*(__import__("json").loads(m) for (m,) in con.execute("select metrics from "
                                                                                               "metrics")))
        assert "eval/avg_at_n" in metric_keys and not any(k.startswith("train/eval/") for k in metric_keys)
    else:
        for k in keys:
            [run_file] = (root / "wandb" / k / "wandb").glob("offline-run-*/run-*.wandb")
            data = run_file.read_bytes()
            assert k.encode() in data and b"03_rl_clip_variants" in data and b"train/eval/" not in data
    assert not any(p.name in ("trackio", "wandb") for p in home.rglob("*")), sorted(home.rglob("*"))
