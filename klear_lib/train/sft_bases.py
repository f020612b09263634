"""A base model per seed for the SFT data notebooks, and the units that score sources from it, as units of work.

A replicate of an SFT data ablation is the whole procedure from its seed: seed s trains its own base (``base_unit``:
``sft_jobs.base_model`` on the samples the notebook drew from seed s, cached by content under the output root's
``.cache/``, then evaluated on held-out problems), and whatever is measured from a base to decide what the arms train
on (notebook 01's source scores: ``score_unit``, an ``sft_jobs.sft_unit`` from seed s's base whose record is
cached under ``.cache/scores/`` by what it depends on) comes from seed s's base too. Each is one unit in the worker
pool (``klear_lib.experiment.run_jobs``, one thread each), so a rerun or a resume into the same output root reuses
them. ``seed_bases`` runs one ``base_unit`` per seed side by side, as ``rl_jobs.seed_starts`` does for the RL
notebooks' SFT starts, and checks that every base learned the task.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from klear_lib import runs
from klear_lib.train import sft_jobs

if TYPE_CHECKING:
    import pandas as pd

SCORES_DIR = "scores"  # under the cache root: one JSON file per score_unit key
_SCORE_SOURCES = ("train/sft.py", "models.py", "train/sft_jobs.py", "evaluation/heldout.py")


def _problems(problems: list[dict]) -> list:
    from klear_lib.data.tasks import Problem

    return [Problem(**{**p, "operands": tuple(p["operands"])}) for p in problems]


def base_unit(*, config: dict, corpus: str, data: str, stage: dict, problems: list[dict], evaluation: dict,
              cache_root: str, out_dir: str, tags: dict, metrics_path: str) -> dict:
    """One seed's base model as a unit of work: ``sft_jobs.base_model`` with the model fields of ``config``
    (``SFTExperimentConfig`` fields; its ``seed`` is the base's), the tokenizer corpus in the JSON file ``corpus``,
    the samples in the JSONL file ``data`` and the ``SFTStageConfig`` fields ``stage``, trained once per content into
    the cache under ``cache_root`` (its record in ``out_dir/base.json``); then held-out avg@n on ``problems`` with
    ``evaluate_heldout``'s keywords ``evaluation``, after ``runs.set_seed(seed)``, whether the model was trained or
    reused. Writes one record (``tags`` and ``eval/*``) and returns the model's folder, its evaluation and the sha256
    of its weights (``cache.weights_sha256``: two runs' bases are bit-identical where these agree), with ``tags``."""
    import torch

    from klear_lib import models
    from klear_lib.cache import weights_sha256
    from klear_lib.config import SFTExperimentConfig
    from klear_lib.evaluation.heldout import evaluate_heldout
    from klear_lib.train.sft import SFTStageConfig

    cfg = SFTExperimentConfig.from_params(config)
    texts = json.loads(Path(corpus).read_text(encoding="utf-8"))
    samples = sft_jobs.read_samples(data)
    model_dir = sft_jobs.base_model(cfg, texts, samples, SFTStageConfig(**stage), cache_root=cache_root,
                                    out_dir=out_dir, progress=lambda *_: None)
    key = json.loads((Path(out_dir) / "base.json").read_text(encoding="utf-8"))["key"]
    model, tok = models.load_model_and_tokenizer(model_dir, dtype=torch.float32)
    runs.set_seed(cfg.seed)
    result = evaluate_heldout(model, tok, _problems(problems), **evaluation)
    with runs.MetricsWriter(metrics_path) as writer:
        writer.write({**tags, **sft_jobs.evaluation_record(result)})
    return {"model_dir": str(model_dir), "key": key, "weights_sha256": weights_sha256(Path(model_dir)),
            "eval": {"avg_at_n": result["avg_at_n"], "format_rate": result["format_rate"],
                     "by_level": {str(k): v for k, v in result["by_level"].items()}}, **tags}


# A base learned the task when it answers at least BASE_LEARNED_MIN of the test samples right: chance is 10% (a
# digit), a base past the tiny model's transition answers most of them; one that is not has learned nothing the arms
# could shift smoothly (docs/design.md, "SFT data ablations on the tiny task").
BASE_LEARNED_MIN = 0.3


def bases_criterion(minimum: float = BASE_LEARNED_MIN, levels: tuple = (), mean_minimum: float | None = None) -> str:
    """The words of the bases' check: over all test samples, or on each of ``levels``; with ``mean_minimum``, also
    the bases' mean."""
    mean = "" if mean_minimum is None else f", and their mean >= {mean_minimum:.0%}"
    if levels:
        return (f"every seed's base answers >= {minimum:.0%} of the test problems of each of its levels "
                f"{list(levels)}{mean}")
    return f"every seed's base answers >= {minimum:.0%} of the test samples right (chance: 10%){mean}"


BASES_CRITERION = bases_criterion()


@dataclass(frozen=True)
class SeedBases:
    """One base model per seed: ``dirs[s]`` its folder, ``evals[s]`` its held-out evaluation (``avg_at_n``,
    ``format_rate``, ``by_level``), ``weights[s]`` the sha256 of its weights, ``table`` one row per seed,
    ``learned`` the check of ``BASES_CRITERION``."""

    dirs: dict
    evals: dict
    weights: dict
    table: pd.DataFrame
    learned: bool
    seconds: float

    def check(self, declared, id: str = "bases_learned", *, levels: tuple = (), minimum: float = BASE_LEARNED_MIN,
              mean_minimum: float | None = None) -> dict:
        """The notebook's declared check ``id`` (``claims.declared_check``): every seed's base answers at least
        ``minimum`` of the test samples, over all levels (01: ``BASES_CRITERION``), or on each of ``levels``, where a
        base learns some levels only (02: the hardest is new to it by design); with ``mean_minimum``, the mean over
        the seeds (of each level) at least that too. The value is the lowest; the note gives the spread over seeds
        (mean, sd, range) of each level read, so that a reader sees how far the lowest sits in its tail."""
        from klear_lib import claims

        cols = [f"level {lvl}" for lvl in levels] or ["avg@n"]
        low = float(self.table[cols].min().min())
        mean = float(self.table[cols].mean().min())
        passed = low >= minimum and (mean_minimum is None or mean >= mean_minimum)
        spread = "; ".join(f"{c}: mean {self.table[c].mean():.3f}, sd {self.table[c].std(ddof=1):.3f}, "
                           f"{self.table[c].min():.3f}-{self.table[c].max():.3f}" for c in cols)
        words = bases_criterion(minimum, levels, mean_minimum)
        note = f"over the seeds' bases: {spread}" if len(self.table) > 1 else ""
        return claims.declared_check(declared, id, passed, low, criterion=words, seeds=len(self.dirs), note=note)

    def summary(self) -> dict:
        """The notebook summary's record of its bases: the first seed's (``base``), every seed's (``bases``),
        ``start_per_seed`` (the report then says the intervals cover how the base varies) and ``base_sha256``,
        each seed's weights' sha256 (whether two runs, on two machines say, began from the same models)."""
        return {"base": next(iter(self.evals.values())), "bases": {str(s): e for s, e in self.evals.items()},
                "start_per_seed": True, "base_sha256": {str(s): h for s, h in self.weights.items()}}

    def describe(self) -> str:
        t = self.table
        return (f"{len(self.dirs)} base models in {self.seconds:.0f}s; test avg@n {t['avg@n'].min():.3f}-"
                f"{t['avg@n'].max():.3f}")


def seed_bases(jobs_for: dict, run_path, *, workers: int = 2) -> SeedBases:
    """Run the ``base_unit`` jobs ``jobs_for[s]`` (an ``experiment.Job`` per seed) side by side into
    ``run_path/bases`` and gather them (``SeedBases``); a base already in the cache is reused, not trained."""
    import pandas as pd

    from klear_lib import experiment

    clock = time.perf_counter()
    results = experiment.run_jobs(list(jobs_for.values()), Path(run_path) / "bases", workers=workers)
    got = {s: results[job.key] for s, job in jobs_for.items()}
    evals = {s: r["eval"] for s, r in got.items()}
    rows = [{"seed": s, "avg@n": e["avg_at_n"], "format rate": e["format_rate"],
             **{f"level {lvl}": v for lvl, v in e["by_level"].items()}, "weights sha256": got[s]["weights_sha256"][:12]}
            for s, e in evals.items()]
    table = pd.DataFrame(rows).set_index("seed")
    learned = bool((table["avg@n"] >= BASE_LEARNED_MIN).all())
    return SeedBases({s: r["model_dir"] for s, r in got.items()}, evals,
                     {s: r["weights_sha256"] for s, r in got.items()}, table, learned, time.perf_counter() - clock)


def score_payload(*, base_sha256: str, samples: list[dict], stage: dict, problems: list[dict],
                  evaluation: dict) -> dict:
    """Everything a source score depends on: the base's weights (their sha256), the samples, the SFT stage (its
    seed among it), the problems and the evaluation's keywords (digests of the lists), the source of the modules
    that train and evaluate, and the versions of torch, transformers and trl."""
    from klear_lib.cache import digest

    root = Path(__file__).resolve().parent.parent
    return {"base": base_sha256, "samples": digest(samples), "stage": stage, "problems": digest(problems),
            "evaluation": evaluation,
            "source": {s: hashlib.sha256((root / s).read_bytes()).hexdigest() for s in _SCORE_SOURCES},
            "versions": runs.package_versions(("torch", "transformers", "trl"))}


def score_unit(*, base_sha256: str, cache_root: str, start: str, data: str, stage: dict, problems: list[dict],
               evaluation: dict, tags: dict, metrics_path: str) -> dict:
    """``sft_jobs.sft_unit`` (continued SFT from ``start`` on the samples in ``data``, held-out avg@n on
    ``problems``), its record cached under ``cache_root/scores/<key>.json`` by ``score_payload``: a second call with
    the same base weights (``base_sha256``, the start's), samples, stage, problems, evaluation, code and versions
    reads the record back instead of training (with ``tags`` as given now and ``"cached": True`` in the result).
    A cache file that cannot be read, or whose payload differs, is trained again and rewritten."""
    from klear_lib.cache import digest

    payload = score_payload(base_sha256=base_sha256, samples=sft_jobs.read_samples(data), stage=stage,
                            problems=problems, evaluation=evaluation)
    key = digest(payload)[:16]
    path = Path(cache_root) / SCORES_DIR / f"{key}.json"
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        cached = entry["record"] if entry.get("payload") == json.loads(json.dumps(payload)) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        cached = None
    if isinstance(cached, dict):
        record = {**cached, **tags}
        with runs.MetricsWriter(metrics_path) as writer:
            writer.write(record)
        return {**record, "cached": True}
    record = sft_jobs.sft_unit(start=start, data=data, stage=stage, problems=problems, evaluation=evaluation,
                               tags=tags, metrics_path=metrics_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    runs.write_atomic(path, runs.to_json_text({"key": key, "payload": payload, "record": record}, "score",
                                              sort_keys=True) + "\n")
    return record
