"""The SFT data pipeline as one call: per-source decontamination and de-duplication, then a report.

The same function serves the tiny stand-in (synthetic sources from ``klear_lib.data.teachers``) and real data
(``klear_lib.data.hub.load_sft_source`` per source, ``hub.load_eval_problems`` for the references), so a
paper-scale selection runs the code the notebooks test. Selection (``selection.top_k_sources``, the correctness
filters) comes after; see notebooks 01 and 02.
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass

from klear_lib.data import selection


def _as_dict(sample, where: str) -> dict:
    if is_dataclass(sample):
        return asdict(sample)
    if isinstance(sample, dict):
        return sample
    raise TypeError(f"{where} must be a dict or an SFTSample, got {type(sample).__name__}")


DEDUP_MODES = ("prompt", "response", None)


def _share(values: list) -> float | None:
    flags = [v for v in values if isinstance(v, bool)]
    return sum(flags) / len(flags) if flags else None


def expected_correct(raw: list[dict], kept: list[dict]) -> float | None:
    """The share of correct responses the kept samples would have if de-duplication kept each level's samples
    at random: the teacher's accuracy per ``level`` over ``raw``, weighted by ``kept``'s level counts. Compare
    it with the kept share of correct responses: a gap means de-duplication chose by correctness. None when a
    sample lacks a ``level`` or a bool ``verdict``, or nothing is kept."""
    if not kept or any("level" not in r or not isinstance(r.get("verdict"), bool) for r in raw + kept):
        return None
    by_level: dict = {}
    for r in raw:
        by_level.setdefault(r["level"], []).append(r["verdict"])
    return sum(sum(by_level[k["level"]]) / len(by_level[k["level"]]) for k in kept) / len(kept)


def prepare_pool(samples_by_source: dict, references: list[str], *, decontamination_n: int = 9,
                 dedup: str | None = "response") -> tuple[list[dict], list[dict]]:
    """Clean every source's samples and pool them.

    ``samples_by_source``: source name -> samples (dicts or ``hub.SFTSample``s with ``prompt`` and ``response``).
    Each sample's ``source`` is set to its key. Per source: drop samples whose prompt shares a word
    ``decontamination_n``-gram with any of ``references`` (the evaluation problems; reference §5: 9-grams), then
    de-duplicate inside the source (the first is kept; across sources nothing is dropped, since the same problem
    answered by two teachers is two samples):

    * ``dedup="response"``: exact duplicates of prompt + response (real, sampled teachers);
    * ``dedup="prompt"``: one response per prompt. On deterministic synthetic teachers the exact rule drops
      correct responses first (a careful teacher answers an easy question the same way every time, its errors
      differ), so the kept pool is enriched in errors; keeping the first response per prompt keeps a random one;
    * ``None``: no de-duplication.

    Returns ``(pool, report)``: the kept samples as dicts, source by source, and one report row per source:
    ``samples``, ``contaminated``, ``duplicates``, ``kept``, ``teacher_correct`` (share of correct responses among
    all of the source's samples), ``kept_correct`` (among the kept ones) and ``expected_correct``
    (``expected_correct``: what the kept share would be at the kept levels if de-duplication were blind to
    correctness); the shares are None where samples carry no bool ``verdict`` (and ``level``).
    """
    if dedup not in DEDUP_MODES:
        raise ValueError(f"dedup must be one of {DEDUP_MODES}, got {dedup!r}")
    pool, report = [], []
    for name, samples in samples_by_source.items():
        rows = [dict(_as_dict(s, f"sample {i} of source {name!r}"), source=name) for i, s in enumerate(samples)]
        for i, r in enumerate(rows):
            if not isinstance(r.get("prompt"), str) or not isinstance(r.get("response"), str):
                raise ValueError(f"sample {i} of source {name!r} needs str 'prompt' and 'response'")
        keep = selection.decontaminate([r["prompt"] for r in rows], references, n=decontamination_n)
        decon = [r for r, k in zip(rows, keep) if k]
        kept = decon
        if dedup is not None:
            keys = [r["prompt"] if dedup == "prompt" else r["prompt"] + "\n" + r["response"] for r in decon]
            kept = [r for r, k in zip(decon, selection.deduplicate(keys)) if k]
        report.append({
            "source": name, "samples": len(rows), "contaminated": len(rows) - len(decon),
            "duplicates": len(decon) - len(kept), "kept": len(kept),
            "teacher_correct": _share([r.get("verdict") for r in rows]),
            "kept_correct": _share([r.get("verdict") for r in kept]),
            "expected_correct": expected_correct(rows, kept),
        })
        pool += kept
    return pool, report
