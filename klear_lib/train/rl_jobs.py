"""Units of work of the RL notebooks, run by ``klear_lib.experiment.run_jobs`` in worker processes.

``rl_unit`` is one arm × one seed on the arithmetic task: load the SFT start, seed, run RL, write its records. Its
result (read back on resume) holds what the notebooks' read-outs need without re-reading metrics. ``start_unit`` is
one SFT start (``train.sft.arithmetic_warm_start``); ``seed_starts`` runs one per seed side by side, so that a
replicate of an RL notebook is a start and an RL run, and checks that each start learned its teacher.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from klear_lib import models, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.experiment import unit_tracking_dir

if TYPE_CHECKING:
    import pandas as pd


def rl_unit(*, config: dict, start: str, tags: dict, metrics_path: str) -> dict:
    """RL from the SFT model saved at ``start`` with ``config`` (``RLExperimentConfig`` fields; its ``seed`` is
    the run's seed), records tagged with ``tags``. Returns the last evaluation (``eval/*``) and the step count."""
    from klear_lib.train.rl_run import run_rl

    cfg = RLExperimentConfig.from_params(config)
    train, heldout = tasks.make_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, cfg.level_list)
    model, tok = models.load_model_and_tokenizer(start, dtype=torch.float32)
    runs.set_seed(cfg.seed)  # after the load: every stream of the run from the config, whatever loading drew
    with runs.MetricsWriter(metrics_path) as writer:
        _, history = run_rl(cfg, model, tok, train, heldout, writer, tags=tags, progress=lambda *_: None,
                            tracking_dir=unit_tracking_dir(metrics_path, cfg.report_to))
    last = history[-1] if history else {}
    return {"final": {k: v for k, v in last.items() if k.startswith("eval/")}, "steps": last.get("step", 0),
            "rollouts": last.get("rollout", 0)}


def start_unit(*, config: dict, cache_root: str, out_dir: str, tags: dict, metrics_path: str) -> dict:
    """The SFT start of ``config`` (``RLExperimentConfig`` fields; its ``seed`` is the start's) as a unit of work:
    ``arithmetic_warm_start`` into the cache under ``cache_root`` (trained there once per key, as the notebooks'
    own calls do), its record in ``out_dir/sft_start.json``. Returns the model's folder, the start's held-out
    evaluation and the sha256 of its weights (two runs' starts are bit-identical where these agree), with ``tags``."""
    from klear_lib.cache import weights_sha256
    from klear_lib.train.sft import arithmetic_warm_start

    ws = arithmetic_warm_start(RLExperimentConfig.from_params(config), out_dir, cache_root=cache_root,
                               progress=lambda *_: None)
    return {"model_dir": str(ws.sft_dir), "start": ws.start,
            "weights_sha256": weights_sha256(Path(ws.sft_dir)), **tags}


# A start learned its teacher (who answers every non-fork problem right and gives the right digit at a fork with p
# 0.2) when it answers at least START_REST_MIN of the non-fork held-out samples right and its fork probe is at most
# START_FORK_P_MAX. Both are far from a start that failed: a 2-epoch start that had not learned gave 0.391.
START_REST_MIN, START_FORK_P_MAX = 0.9, 0.35
STARTS_CRITERION = (f"every seed's SFT start answers >= {START_REST_MIN:.0%} of the non-fork held-out samples right "
                    f"and gives the right digit at the forks with p <= {START_FORK_P_MAX} (the teacher: 100%, 0.2)")


@dataclass(frozen=True)
class SeedStarts:
    """One SFT start per seed: ``dirs[s]`` the model's folder, ``starts[s]`` its held-out evaluation
    (``WarmStart.start``), ``table`` one row per seed, ``learned`` the check of ``STARTS_CRITERION``, ``weights[s]``
    the sha256 of its weights (``cache.weights_sha256``)."""

    dirs: dict
    starts: dict
    table: pd.DataFrame
    learned: bool
    seconds: float
    weights: dict

    def check(self, declared) -> dict:
        """The notebook's declared check ``starts_learned`` (``claims.declared_check``)."""
        from klear_lib import claims

        return claims.declared_check(declared, "starts_learned", self.learned, float(self.table["the rest"].min()),
                                     criterion=STARTS_CRITERION, seeds=len(self.dirs))

    def summary(self) -> dict:
        """The notebook summary's record of its starts: the first seed's, every seed's, ``start_per_seed`` (the
        report then says these intervals cover how the start varies) and ``sft_start_sha256``, each seed's weights'
        sha256 (whether two runs, on two machines say, began from the same models)."""
        return {"sft_start": next(iter(self.starts.values())),
                "sft_starts": {str(s): st for s, st in self.starts.items()}, "start_per_seed": True,
                "sft_start_sha256": {str(s): h for s, h in self.weights.items()}}

    def describe(self) -> str:
        t = self.table
        return (f"{len(self.dirs)} SFT starts in {self.seconds:.0f}s; the rest: {t['the rest'].min():.3f}-"
                f"{t['the rest'].max():.3f}, p(right digit) at the forks: {t['p(right digit) at the forks'].min():.3f}-"
                f"{t['p(right digit) at the forks'].max():.3f}")


def seed_starts(base: RLExperimentConfig, seeds, run_path, *, cache_root, workers: int = 2) -> SeedStarts:
    """Seed s's SFT start for every s in ``seeds`` (``base`` with ``seed=s``): ``start_unit``s run side by side
    into ``run_path/starts``, their records in ``run_path/sft/seed=<s>``, the models in the cache under
    ``cache_root``, where a start trained by another notebook into the same output root (same key) is reused."""
    import pandas as pd

    from klear_lib import experiment

    run_path, clock = Path(run_path), time.perf_counter()
    jobs = [experiment.Job(f"start/seed={s}", "klear_lib.train.rl_jobs:start_unit", {
        "config": {**vars(base.replace(seed=s))}, "cache_root": str(cache_root),
        "out_dir": str(run_path / "sft" / f"seed={s}"), "tags": {"seed": s}}) for s in seeds]
    results = experiment.run_jobs(jobs, run_path / "starts", workers=workers)
    dirs = {s: results[f"start/seed={s}"]["model_dir"] for s in seeds}
    starts = {s: results[f"start/seed={s}"]["start"] for s in seeds}
    table = pd.DataFrame([{"seed": s, "avg@n": st["avg_at_n"], "fork problems": st["avg_at_n_fork"],
                           "the rest": st["avg_at_n_rest"], "p(right digit) at the forks": st["p_correct_fork"]}
                          for s, st in starts.items()]).set_index("seed")
    learned = bool((table["the rest"] >= START_REST_MIN).all()
                   and (table["p(right digit) at the forks"] <= START_FORK_P_MAX).all())
    weights = {s: results[f"start/seed={s}"].get("weights_sha256") for s in seeds}
    return SeedStarts(dirs, starts, table, learned, time.perf_counter() - clock, weights)
