"""Units of work of the RL notebooks, run by ``klear_lib.experiment.run_jobs`` in worker processes.

``rl_unit`` is one arm × one seed on the arithmetic task: load the SFT start, seed, run RL, write its records. Its
result (read back on resume) holds what the notebooks' read-outs need without re-reading metrics. ``start_unit`` is
one SFT start (``train.sft.arithmetic_warm_start``), so that a notebook with a start per seed trains them side by
side.
"""

from __future__ import annotations

import torch

from klear_lib import models, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.experiment import unit_tracking_dir


def rl_unit(*, config: dict, start: str, tags: dict, metrics_path: str) -> dict:
    """RL from the SFT model saved at ``start`` with ``config`` (``RLExperimentConfig`` fields; its ``seed`` is
    the run's seed), records tagged with ``tags``. Returns the last evaluation (``eval/*``) and the step count."""
    from klear_lib.train.rl import run_rl

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
    own calls do), its record in ``out_dir/sft_start.json``. Returns the model's folder and the start's held-out
    evaluation, with ``tags``."""
    from klear_lib.train.sft import arithmetic_warm_start

    ws = arithmetic_warm_start(RLExperimentConfig.from_params(config), out_dir, cache_root=cache_root,
                               progress=lambda *_: None)
    return {"model_dir": str(ws.sft_dir), "start": ws.start, **tags}
