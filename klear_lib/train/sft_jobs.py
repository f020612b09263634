"""Units of work of the SFT data notebooks (01, 02), run by ``klear_lib.experiment.run_jobs`` in worker processes,
and the base model they all continue from, trained once and cached.

``sft_unit`` is one arm × one seed: continue SFT from the base on the arm's samples (a JSONL file the notebook
wrote, so the run directory keeps what every arm trained on), evaluate on held-out problems, write one record.
The RL counterpart is ``klear_lib.train.rl_jobs.rl_unit``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from klear_lib import runs
from klear_lib.data.tasks import Problem
from klear_lib.experiment import unit_tracking_dir


def write_samples(path: str | os.PathLike, samples: list[dict]) -> Path:
    """``samples`` (dicts with ``prompt`` and ``response``, or chat rows) as JSON lines at ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(s, sort_keys=True) + "\n" for s in samples), encoding="utf-8")
    return path


def read_samples(path: str | os.PathLike) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def data_stats(samples: list[dict]) -> dict:
    """What an arm trained on: ``samples``, ``distinct_prompts``, ``teacher_correct`` (share of samples whose
    ``verdict`` is True; NaN when none has one) and the count per ``level`` (``level_<L>``)."""
    verdicts = [s["verdict"] for s in samples if isinstance(s.get("verdict"), bool)]
    out = {"samples": len(samples), "distinct_prompts": len({s.get("prompt") for s in samples}),
           "teacher_correct": sum(verdicts) / len(verdicts) if verdicts else float("nan")}
    for lvl in sorted({s["level"] for s in samples if "level" in s}):
        out[f"level_{lvl}"] = sum(s.get("level") == lvl for s in samples)
    return out


def evaluation_record(result: dict, prefix: str = "eval") -> dict:
    """``evaluate_heldout``'s result as metric keys: ``<prefix>/avg_at_n``, ``<prefix>/format_rate``,
    ``<prefix>/avg_at_n_level<L>``."""
    rec = {f"{prefix}/avg_at_n": result["avg_at_n"], f"{prefix}/format_rate": result["format_rate"]}
    rec.update({f"{prefix}/avg_at_n_level{lvl}": v for lvl, v in result["by_level"].items()})
    return rec


def sft_unit(*, start: str, data: str, stage: dict, problems: list[dict], evaluation: dict, tags: dict,
             metrics_path: str) -> dict:
    """Continued SFT from the model saved at ``start`` on the samples in ``data`` (``SFTStageConfig`` fields in
    ``stage``; its ``seed`` seeds the run), then held-out avg@n on ``problems`` (``Problem`` dicts) with
    ``evaluate_heldout``'s keywords in ``evaluation``. Writes one record (``tags``, ``data_stats``, ``eval/*``) and
    returns it. The fine-tuned model is deleted: the numbers are kept, not one model per arm and seed."""
    from klear_lib.evaluation.heldout import evaluate_heldout
    from klear_lib.train.sft import SFTStageConfig, sft_from, sft_token_stats

    cfg = SFTStageConfig(**stage)
    samples = read_samples(data)
    out = Path(metrics_path).with_suffix(".model")
    runs.set_seed(cfg.seed)
    model, tok = sft_from(start, samples, out, SFTStageConfig(**{**stage, "resume": False}),
                          tracking_dir=unit_tracking_dir(metrics_path, cfg.report_to))
    result = evaluate_heldout(model, tok, [Problem(**{**p, "operands": tuple(p["operands"])}) for p in problems],
                              **evaluation)
    tokens = sft_token_stats(out) or {}
    shutil.rmtree(out, ignore_errors=True)
    record = {**tags, **data_stats(samples), **evaluation_record(result),
              **({"sft/padding_share": tokens["padding_share"]} if "padding_share" in tokens else {})}
    with runs.MetricsWriter(metrics_path) as writer:
        writer.write(record)
    return record


# -- the base model: SFT from scratch, once per content ------------------------------------------------------------
_BASE_SOURCES = ("train/sft.py", "models.py")


def base_payload(cfg, corpus: list[str], samples: list[dict], stage) -> dict:
    """Everything the base model depends on: the model fields of ``cfg`` (``model``, ``tiny_hidden``,
    ``tiny_layers``, ``vocab_size``, ``seed``), digests of the tokenizer corpus and of the samples, the
    ``SFTStageConfig``, the source of the modules that build it and the versions of torch, transformers and trl
    (recorded in the cache's manifest)."""
    from dataclasses import asdict

    from klear_lib.cache import digest

    root = Path(__file__).resolve().parent.parent
    return {
        "model": {f: getattr(cfg, f) for f in ("model", "tiny_hidden", "tiny_layers", "vocab_size", "seed")},
        "corpus": digest(corpus), "samples": digest(samples), "stage": asdict(stage),
        "source": {s: hashlib.sha256((root / s).read_bytes()).hexdigest() for s in _BASE_SOURCES},
        "versions": runs.package_versions(("torch", "transformers", "trl")),
    }


def base_key(cfg, corpus: list[str], samples: list[dict], stage) -> str:
    """A digest of ``base_payload``: equal keys, interchangeable base models."""
    from klear_lib.cache import digest

    return digest(base_payload(cfg, corpus, samples, stage))[:16]


def base_model(cfg, corpus: list[str], samples: list[dict], stage, *, cache_root: str | os.PathLike | None,
               out_dir: str | os.PathLike, progress=print) -> Path:
    """The folder of a base model: a fresh ``models.model_for(cfg, corpus)`` after SFT on ``samples`` with
    ``stage``. With ``cache_root`` it is trained once per ``base_key`` into ``cache_root/<key>/final`` and reused
    once ``klear_lib.cache.verify`` checked it against its manifest (written atomically: a concurrent run finds a
    whole model or none; a damaged or mismatched entry is trained again, with one line saying why); without,
    trained into ``out_dir``. ``out_dir/base.json`` records which model was used. Either way the random streams
    are then seeded from ``cfg.seed`` (``runs.set_seed``), so what follows does not depend on whether it trained."""
    import time

    from klear_lib import cache, models
    from klear_lib.train.sft import chat_rows, run_sft

    clock = time.perf_counter()
    payload = base_payload(cfg, corpus, samples, stage)
    key = cache.digest(payload)[:16]

    def build(work: Path) -> None:
        runs.set_seed(cfg.seed)
        model, tokenizer = models.model_for(cfg, corpus)
        progress(f"base model: {cfg.model}, {models.count_parameters(model):,} parameters, vocabulary "
                 f"{len(tokenizer)}; SFT on {len(samples)} samples")
        run_sft(model, tokenizer, chat_rows(samples), work, stage)
        progress(f"base model trained in {time.perf_counter() - clock:.0f}s")

    if cache_root is not None:
        final, _ = cache.ensure(cache_root, key, payload, build, label="base model", progress=progress)
    else:
        build(Path(out_dir))
        final = Path(out_dir) / "final"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from klear_lib.train.sft import sft_token_stats

    runs.write_atomic(out_dir / "base.json", json.dumps(
        {"key": key, "model_dir": str(final), "sft_tokens": sft_token_stats(Path(final).parent)}, indent=2) + "\n")
    runs.set_seed(cfg.seed)
    return final
