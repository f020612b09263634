"""One base model per seed for the SFT data notebooks (klear_lib.train.base_jobs): each seed's base is a unit in the
worker pool, the cache entry of its own content, evaluated as a call in this process would, and reused by a
second run into the same output root."""

import hashlib
import json
from pathlib import Path

import torch

from klear_lib import models, runs
from klear_lib.config import SFTExperimentConfig
from klear_lib.data import tasks, teachers
from klear_lib.evaluation.heldout import evaluate_heldout
from klear_lib.train import base_jobs, sft_jobs
from klear_lib.train.sft import SFTStageConfig, sft_samples


def test_seed_bases_train_a_base_per_seed_side_by_side_and_a_second_run_reuses_them(tmp_path):
    cfg = SFTExperimentConfig.from_params({"tiny_hidden": 32, "tiny_layers": 1, "vocab_size": 400})
    train, held = tasks.make_splits(0, 64, 4)
    corpus = teachers.corpus([teachers.GRADED_TEACHER], train, per_source=8)
    samples = {s: sft_samples(train[:24], error_rate=0.2, seed=100 + s) for s in (0, 1)}
    stage = SFTStageConfig(learning_rate=3e-3, epochs=1.0, batch_size=8, use_cpu=True, bf16=False)
    evaluation = {"n": 2, "max_new_tokens": 8}
    cache_root = tmp_path / "cache"
    bases = base_jobs.seed_bases(cfg, [0, 1], tmp_path / "nb_a", corpus=corpus, samples=samples, stage=stage,
                                 problems=held, evaluation=evaluation, cache_root=cache_root, workers=2)
    for s in (0, 1):
        seeded = cfg.replace(seed=s)
        stage_s = SFTStageConfig(**{**vars(stage), "seed": s})
        key = sft_jobs.base_key(seeded, corpus, samples[s], stage_s)  # seed s's own content: its own entry
        assert bases.dirs[s] == str(cache_root / key / "final")
        record = json.loads((tmp_path / "nb_a" / "base" / f"seed={s}" / "base.json").read_text())
        assert record == {"key": key, "model_dir": bases.dirs[s]}
        model, tok = models.load_model_and_tokenizer(bases.dirs[s], dtype=torch.float32)
        runs.set_seed(s)
        here = evaluate_heldout(model, tok, held, **evaluation)
        assert bases.evals[s] == here
        assert bases.table.loc[s, "avg@n"] == here["avg_at_n"]
    blobs = [(Path(bases.dirs[s]) / "model.safetensors").read_bytes() for s in (0, 1)]
    assert blobs[0] != blobs[1] and bases.dirs[0] != bases.dirs[1]
    assert [bases.weights[s] for s in (0, 1)] == [hashlib.sha256(b).hexdigest() for b in blobs]
    summary = bases.summary()
    assert summary["start_per_seed"] is True and summary["base_sha256"] == {"0": bases.weights[0],
                                                                           "1": bases.weights[1]}
    assert summary["bases"] == {"0": bases.evals[0], "1": bases.evals[1]} and summary["base"]["seeds"] == 2
    assert summary["base"]["avg_at_n"] == (bases.evals[0]["avg_at_n"] + bases.evals[1]["avg_at_n"]) / 2
    # Another run into the same root: the bases come from the cache (the same models and evaluations).
    again = base_jobs.seed_bases(cfg, [1, 0], tmp_path / "nb_b", corpus=corpus, samples=samples, stage=stage,
                                 problems=held, evaluation=evaluation, cache_root=cache_root, workers=1)
    assert again.dirs == bases.dirs and again.evals == bases.evals and again.weights == bases.weights
    assert sorted(p.name for p in cache_root.iterdir()) == sorted(
        Path(d).parent.name for d in bases.dirs.values())  # two entries, no third
