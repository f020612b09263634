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


def prepare_pool(samples_by_source: dict, references: list[str], *, decontamination_n: int = 9,
                 dedup: bool = True) -> tuple[list[dict], list[dict]]:
    """Clean every source's samples and pool them.

    ``samples_by_source``: source name -> samples (dicts or ``hub.SFTSample``s with ``prompt`` and ``response``).
    Each sample's ``source`` is set to its key. Per source: drop samples whose prompt shares a word
    ``decontamination_n``-gram with any of ``references`` (the evaluation problems; reference §5: 9-grams), then
    exact duplicates of prompt + response inside the source (the first is kept; across sources nothing is
    dropped, since the same problem answered by two teachers is two samples). Returns ``(pool, report)``: the
    kept samples as dicts, source by source, and one report row per source with the counts.
    """
    pool, report = [], []
    for name, samples in samples_by_source.items():
        rows = [dict(_as_dict(s, f"sample {i} of source {name!r}"), source=name) for i, s in enumerate(samples)]
        for i, r in enumerate(rows):
            if not isinstance(r.get("prompt"), str) or not isinstance(r.get("response"), str):
                raise ValueError(f"sample {i} of source {name!r} needs str 'prompt' and 'response'")
        keep = selection.decontaminate([r["prompt"] for r in rows], references, n=decontamination_n)
        decon = [r for r, k in zip(rows, keep) if k]
        kept = decon
        if dedup:
            unique = selection.deduplicate([r["prompt"] + "\n" + r["response"] for r in decon])
            kept = [r for r, k in zip(decon, unique) if k]
        verdicts = [r["verdict"] for r in kept if isinstance(r.get("verdict"), bool)]
        report.append({
            "source": name, "samples": len(rows), "contaminated": len(rows) - len(decon),
            "duplicates": len(decon) - len(kept), "kept": len(kept),
            "teacher_correct": sum(verdicts) / len(verdicts) if verdicts else None,
        })
        pool += kept
    return pool, report
