"""One checkpoint on one benchmark under the evaluation protocol: sample, judge, score, write.

``evaluate_benchmark(engine, bench, sampling, out_dir)`` samples ``sampling.n`` completions per problem with
``rollout.generate_to_file`` (resumable: an interrupted evaluation redoes only unfinished chunks), judges them
with the benchmark's own judge (``bench.judge``, from its registry entry in ``benchmarks``: math-verify for
math, the sandboxed tests for code, correct only if every test passes), and writes beside the samples

* ``<bench>.samples.jsonl``   the completions, one line per problem (written as they are generated);
* ``<bench>.judged.jsonl``    per problem: id, meta, correct flags and the judge's reason per sample;
* ``<bench>.result.json``     the scores below.

Scores (``klear_lib.evaluation.metrics``): avg@n with a 95% bootstrap interval over problems, unbiased pass@k
for k = 1, 2, 4, ... ≤ n, the share of samples that kept the format (the judge's format failures), the count of
each judge reason, and the judge's extra scores: maj@n on math, a vote over math-verify equivalence classes of
the answers the judge read (``metrics.math_maj_at_k``). Nothing here depends on the kind of benchmark.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from klear_lib.evaluation import benchmarks
from klear_lib.evaluation.metrics import avg_at_n, bootstrap_ci, math_maj_at_k, mean_pass_at_k
from klear_lib.rewards.math import THINK_OPEN
from klear_lib.rollout import SamplingConfig, generate_to_file

#: Judge reasons that mean the response broke the format rather than answered wrongly (both judges' together;
#: ``evaluate_benchmark`` uses its benchmark's own, ``bench.judge.format_failures``).
FORMAT_FAILURES = benchmarks.MATH_JUDGE.format_failures | benchmarks.CODE_JUDGE.format_failures


def ks_up_to(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else ks + [n]


def score(correct, reasons: list[list[str]], *, answers=None, gold=None, seed: int = 0,
          format_failures: frozenset[str] = FORMAT_FAILURES) -> dict:
    """The scores of a (problems, n) correctness array (see the module docstring).

    ``answers``/``gold``: math answers as ``metrics.math_maj_at_k`` takes them, to add ``maj_at_n`` (voted in
    this process, which must then be a main thread)."""
    correct = np.asarray(correct, dtype=bool)
    n = correct.shape[1]
    lo, hi = bootstrap_ci(correct.mean(axis=1), seed=seed)
    flat = [r for row in reasons for r in row]
    out = {
        "problems": int(correct.shape[0]),
        "n": int(n),
        "avg_at_n": avg_at_n(correct),
        "ci_low": lo,
        "ci_high": hi,
        "pass_at_k": {str(k): mean_pass_at_k(correct, k) for k in ks_up_to(n)},
        "format_rate": sum(r not in format_failures for r in flat) / max(len(flat), 1),
        "reasons": dict(Counter(flat).most_common()),
    }
    if answers is not None:
        out["maj_at_n"] = math_maj_at_k(answers, gold, n)
    return out


def template_opens_think(engine, messages) -> bool:
    """Whether the engine's chat template ends the generation prompt with ``<think>`` (some reasoning models'
    templates do): the completions then lack the opening tag the judge's format rule requires."""
    tok = getattr(engine, "tokenizer", None)
    if tok is None or not getattr(tok, "chat_template", None):
        return False
    text = tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return text.rstrip().endswith(THINK_OPEN)


def evaluate_benchmark(engine, bench, sampling: SamplingConfig, out_dir: str | Path, *, pool=None,
                       chunk_size: int = 16, progress: bool = True, label: str = "", workers: int = 2,
                       judge_options: dict | None = None) -> dict:
    """Sample, judge and score ``bench`` with ``engine``; returns the scores plus ``benchmark`` and ``kind``
    (and writes the three files of the module docstring into ``out_dir``). ``pool``: an open ``RewardPool`` of
    the benchmark's judge to reuse (``benchmarks.open_judge_pool``); None opens one of ``workers`` processes for
    the call. Extra scores (math's maj@n) open their own pool of ``workers`` processes. ``judge_options``: keyword
    arguments of every judgement (math: ``{"format_rule": ...}``, ``rewards.math.MathRewardOptions``)."""
    out_dir = Path(out_dir)
    items = [(p.id, p.messages) for p in bench.problems]
    completions = generate_to_file(engine, items, sampling, out_dir / f"{bench.name}.samples.jsonl",
                                   chunk_size=chunk_size, progress=progress,
                                   desc=f"{label} {bench.name}".strip())
    if bench.problems and template_opens_think(engine, bench.problems[0].messages):
        completions = [[THINK_OPEN + "\n" + c for c in row] for row in completions]  # judge what the model wrote
    correct, reasons = benchmarks.judge(bench, completions, pool, workers=workers, **(judge_options or {}))
    result = {"benchmark": bench.name, "kind": bench.kind, "source": bench.source,
              **score(correct, reasons, seed=sampling.seed, format_failures=bench.judge.format_failures),
              **bench.judge.extra_scores(bench, completions, reasons, workers=workers)}
    for key in ("level", "difficulty"):
        if any(key in p.meta for p in bench.problems):
            result[f"by_{key}"] = by_meta(bench, correct, key)
    with (out_dir / f"{bench.name}.judged.jsonl").open("w", encoding="utf-8") as f:
        for p, row, why in zip(bench.problems, correct, reasons):
            f.write(json.dumps({"id": p.id, "meta": p.meta, "correct": [bool(x) for x in row], "reasons": why}) + "\n")
    (out_dir / f"{bench.name}.result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def by_meta(bench, correct, key: str) -> dict:
    """avg@n per value of ``problem.meta[key]`` (e.g. level or difficulty)."""
    groups: dict = {}
    for p, row in zip(bench.problems, np.asarray(correct, dtype=float)):
        groups.setdefault(p.meta.get(key), []).append(row.mean())
    return {k: float(np.mean(v)) for k, v in sorted(groups.items(), key=lambda kv: str(kv[0]))}
