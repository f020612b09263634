"""The SFT data notebooks' base model as a unit of work, one per seed: a replicate of such a notebook is its own
base, its own data and its arms (issue 34: seeds around one shared model are not replicates).

``base_unit`` trains (or reuses, from the cache in the output root) the base model of one seed
(``sft_jobs.base_model``, keyed by its content: the seed, the corpus, the samples, the stage) and evaluates it on
held-out problems. ``seed_bases`` runs one per seed side by side in the worker pool and returns ``SeedBases``,
whose ``summary()`` is what the report reads (``start_per_seed``: "a start each"). The RL counterpart is
``klear_lib.train.rl_jobs.seed_starts``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from klear_lib.train import sft_jobs

if TYPE_CHECKING:
    import pandas as pd


def base_unit(*, config: dict, corpus: str, samples: str, stage: dict, cache_root: str, out_dir: str,
              problems: list[dict], evaluation: dict, tags: dict, metrics_path: str) -> dict:
    """The base model of ``config`` (``SFTExperimentConfig`` fields; its ``seed`` initialises the model) after SFT
    on the samples in ``samples`` (a JSONL file) with ``stage`` (``SFTStageConfig`` fields), its tokenizer from the
    texts in ``corpus`` (a JSON list), trained once per content into the cache under ``cache_root``
    (``sft_jobs.base_model``; ``out_dir/base.json`` records which). Then held-out avg@n on ``problems`` with
    ``evaluate_heldout``'s keywords in ``evaluation``, after ``runs.set_seed(seed)``. Returns the model's folder,
    the evaluation (``base``) and the sha256 of its weights, with ``tags`` (the unit's result: no metric records)."""
    import torch

    from klear_lib import models, runs
    from klear_lib.cache import weights_sha256
    from klear_lib.config import SFTExperimentConfig
    from klear_lib.data.tasks import Problem
    from klear_lib.evaluation.heldout import evaluate_heldout
    from klear_lib.train.sft import SFTStageConfig

    cfg = SFTExperimentConfig.from_params(config)
    texts = json.loads(Path(corpus).read_text(encoding="utf-8"))
    final = sft_jobs.base_model(cfg, texts, sft_jobs.read_samples(samples), SFTStageConfig(**stage),
                                cache_root=cache_root, out_dir=out_dir, progress=lambda *_: None)
    model, tok = models.load_model_and_tokenizer(final, dtype=torch.float32)
    runs.set_seed(cfg.seed)  # the same evaluation whether the base was trained here or reused
    result = evaluate_heldout(model, tok, [Problem(**{**p, "operands": tuple(p["operands"])}) for p in problems],
                              **evaluation)
    return {"model_dir": str(final), "base": result, "weights_sha256": weights_sha256(Path(final)), **tags}


@dataclass(frozen=True)
class SeedBases:
    """One base model per seed: ``dirs[s]`` its folder, ``evals[s]`` its held-out evaluation (``evaluate_heldout``'s
    result: ``avg_at_n``, ``by_level``), ``weights[s]`` the sha256 of its weights (``cache.weights_sha256``),
    ``table`` one row per seed (avg@n and each level's)."""

    dirs: dict
    evals: dict
    weights: dict
    table: pd.DataFrame
    seconds: float

    def summary(self) -> dict:
        """The notebook summary's record of its bases: every seed's evaluation (``bases``) and weights' sha256
        (``base_sha256``: whether two runs, on two machines say, began from the same models), ``start_per_seed``
        (the report then says "a start each": the intervals cover how the base varies), and ``base``, the mean
        evaluation over the seeds (``avg_at_n``, ``by_level``)."""
        levels = sorted({lvl for e in self.evals.values() for lvl in e["by_level"]})
        n = len(self.evals)
        mean = {"avg_at_n": sum(e["avg_at_n"] for e in self.evals.values()) / n,
                "by_level": {lvl: sum(e["by_level"][lvl] for e in self.evals.values()) / n for lvl in levels},
                "seeds": n}
        return {"base": mean, "bases": {str(s): e for s, e in self.evals.items()}, "start_per_seed": True,
                "base_sha256": {str(s): h for s, h in self.weights.items()}}

    def describe(self) -> str:
        t = self.table
        return (f"{len(self.dirs)} base models in {self.seconds:.0f}s; test avg@n {t['avg@n'].min():.3f}-"
                f"{t['avg@n'].max():.3f}; {len(set(self.weights.values()))} distinct weights")


def seed_bases(cfg, seeds, run_path, *, corpus: list[str], samples: dict, stage, problems: list, evaluation: dict,
               cache_root, workers: int = 2) -> SeedBases:
    """Seed s's base model for every s in ``seeds``: ``cfg`` (an ``SFTExperimentConfig``) with ``seed=s``, SFT on
    ``samples[s]`` with ``stage`` (its ``seed`` set to s: the data order), the tokenizer from ``corpus``;
    ``base_unit``s run side by side into ``run_path/bases`` (resumable: a done seed is not redone), their inputs
    and records under ``run_path/base/seed=<s>``, the models in the cache under ``cache_root``, where a base
    trained by an earlier run into the same output root (same content) is reused."""
    import pandas as pd

    from klear_lib import experiment

    run_path, clock = Path(run_path), time.perf_counter()
    corpus_path = run_path / "base" / "corpus.json"
    corpus_path.parent.mkdir(parents=True, exist_ok=True)
    corpus_path.write_text(json.dumps(corpus), encoding="utf-8")
    jobs = []
    for s in seeds:
        folder = run_path / "base" / f"seed={s}"
        path = sft_jobs.write_samples(folder / "samples.jsonl", samples[s])
        jobs.append(experiment.Job(f"base/seed={s}", "klear_lib.train.base_jobs:base_unit", {
            "config": {**vars(cfg.replace(seed=s))}, "corpus": str(corpus_path), "samples": str(path),
            "stage": {**vars(stage), "seed": s}, "cache_root": str(cache_root), "out_dir": str(folder),
            "problems": [p.to_dict() for p in problems], "evaluation": evaluation, "tags": {"seed": s}}))
    results = experiment.run_jobs(jobs, run_path / "bases", workers=workers)
    by_seed = {s: results[f"base/seed={s}"] for s in seeds}
    evals = {s: {**r["base"], "by_level": {int(k): v for k, v in r["base"]["by_level"].items()}}
             for s, r in by_seed.items()}
    table = pd.DataFrame([{"seed": s, "avg@n": e["avg_at_n"], **{f"level {k}": v for k, v in e["by_level"].items()},
                           "seconds": by_seed[s].get("seconds")} for s, e in evals.items()]).set_index("seed")
    return SeedBases({s: r["model_dir"] for s, r in by_seed.items()}, evals,
                     {s: r["weights_sha256"] for s, r in by_seed.items()}, table, time.perf_counter() - clock)
