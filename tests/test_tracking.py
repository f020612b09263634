"""`report_to`: TRL's trainers log to an experiment tracker (here TensorBoard, on the CPU) in the run's tracking
folder, step metrics and the rollout records (held-out evaluation) alike; metrics.jsonl is written either way."""

import pytest
import torch

from klear_lib import models, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.train.rl import run_rl

pytest.importorskip("tensorboard")


def scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in folder.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    return tags


def test_rl_run_writes_tensorboard_events_with_step_and_rollout_metrics(tmp_path):
    cfg = RLExperimentConfig(n_train=64, n_heldout=4, levels="1,2", rollouts=1, rollout_prompts=2,
                             mini_batch_prompts=1, num_generations=4, max_completion_length=12, eval_n=1,
                             eval_every=1, filter_groups=False, report_to="tensorboard", fork_facts="")
    train, held = tasks.make_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, cfg.level_list)
    tok = models.build_tokenizer(tasks.corpus(train))
    spec = models.TinyModelSpec(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                intermediate_size=64)
    model = models.build_tiny_model(tok, spec)
    with runs.MetricsWriter(tmp_path / "metrics.jsonl") as w:
        run_rl(cfg, model, tok, train, held, w, tags={"seed": 0}, tracking_dir=tmp_path / "tracking",
               progress=lambda *_: None)
    tags = scalars(tmp_path / "tracking")
    assert {"train/actor/pg_loss", "train/grad_norm"} <= tags, sorted(tags)  # a step's metrics
    assert any(t.endswith("eval/avg_at_n") for t in tags), sorted(tags)  # a rollout record's evaluation
    assert any("actor/pg_loss" in r for r in runs.read_metrics(tmp_path / "metrics.jsonl"))


def test_an_unknown_tracker_is_refused_before_any_work():
    with pytest.raises(ValueError, match=r"report_to must be one of \['none', 'tensorboard', 'trackio', 'wandb'\]"):
        RLExperimentConfig(report_to="mlflow")
    assert torch.__version__  # the import above is the CPU torch


def test_every_optimizer_step_has_its_record_when_rollout_records_are_tracked(tmp_path):
    """The rollout records reach the tracker through the callbacks' on_log, which clears `should_log`: the step that
    ends a rollout must still be logged (one record per optimizer step, steps 1..N)."""
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
    tags = scalars(tmp_path / "run" / "tracking" / "arm_seed=0")
    assert {"train/train_loss", "train/mean_token_accuracy"} <= tags, sorted(tags)
