"""Evaluation metrics of the paper's protocol (reference §7): pure functions over per-sample correctness, and
the math majority vote over extracted answers.

* avg@n: mean over problems of the fraction of n samples that are correct (an unbiased pass@1 estimate);
  Klear reports avg@64 on AIME24/25 and HMMT25, avg@8 on LiveCodeBench.
* pass@k (unbiased, Chen et al. 2021): 1 - C(n-c, k) / C(n, k) for a problem with c correct of n samples,
  computed as a product of ratios so that it stays exact for large n (no huge binomials, no cancellation).
* maj@k: the share of problems whose most frequent answer among the first k samples is the gold one.
  ``maj_at_k`` votes with equal strings (integers, labels); ``math_maj_at_k`` votes with math-verify
  equivalence classes, so that ``\\frac{1}{2}``, ``0.5`` and ``\\dfrac12`` are one vote (the evaluation uses it).
* Bootstrap confidence intervals over problems (the samples of a problem stay together).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from klear_lib.rewards.result import RewardResult


def _check_nck(n: int, c: int, k: int) -> None:
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {v!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples: 1 - C(n-c, k)/C(n, k).

    C(n-c, k)/C(n, k) = prod_{i=0}^{k-1} (n-c-i)/(n-i), which is 0 as soon as n - c < k (then pass@k = 1).
    """
    _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    fail = 1.0
    for i in range(k):
        fail *= (n - c - i) / (n - i)
    return 1.0 - fail


def _as_matrix(correct) -> np.ndarray:
    arr = np.asarray(correct)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"correct must be a non-empty (problems, n) array, got shape {arr.shape}")
    if arr.dtype != bool and not np.isin(arr, (0, 1)).all():
        bad = np.argwhere(~np.isin(arr, (0, 1)))[0]
        raise ValueError(f"correct must hold 0/1 or booleans; row {bad[0]}, sample {bad[1]} is {arr[tuple(bad)]!r}")
    return arr.astype(np.float64)


def avg_at_n(correct) -> float:
    """avg@n of a (problems, n) array of 0/1 or booleans: the mean over problems of each row's mean."""
    return float(_as_matrix(correct).mean(axis=1).mean())


def per_problem_pass_at_k(correct, k: int) -> np.ndarray:
    """(problems,) unbiased pass@k of each row of a (problems, n) correctness array."""
    m = _as_matrix(correct)
    n = m.shape[1]
    return np.array([pass_at_k(n, int(row.sum()), k) for row in m])


def mean_pass_at_k(correct, k: int) -> float:
    """Mean over problems of the unbiased pass@k (pass@1 equals avg@n)."""
    return float(per_problem_pass_at_k(correct, k).mean())


def _check_votes(answers: Sequence[Sequence], gold: Sequence, k: int) -> None:
    if len(answers) != len(gold) or not answers:
        raise ValueError(f"answers ({len(answers)} problems) and gold ({len(gold)}) must be non-empty and "
                         f"equal in length")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    for i, row in enumerate(answers):
        if len(row) < k:
            raise ValueError(f"problem {i} has {len(row)} samples, fewer than k={k}")


def maj_at_k(answers: Sequence[Sequence[Hashable | None]], gold: Sequence[Hashable], k: int) -> float:
    """Share of problems whose majority answer among the first ``k`` samples equals the gold answer.

    ``answers[i]`` are problem i's extracted answers (None: no answer, never a vote). Ties go to the answer that
    reached the top count first in sample order; a problem with no answer at all counts as wrong. Answers vote
    by equality (``==``), which suits integers and labels; math answers vote with ``math_maj_at_k``.
    """
    _check_votes(answers, gold, k)
    hits = 0
    for row, g in zip(answers, gold):
        votes = Counter()
        best, best_count = None, 0
        for a in row[:k]:
            if a is None:
                continue
            votes[a] += 1
            if votes[a] > best_count:
                best, best_count = a, votes[a]
        hits += best is not None and best == g
    return hits / len(answers)


# ---------------------------------------------------------------------------------------------------------
# maj@k by math-verify equivalence
# ---------------------------------------------------------------------------------------------------------
def _parse_answer(text: str, seconds: int):
    """``(text parsed, math-verify's parse)`` of one answer, or None when nothing can be parsed.

    First as the judge parses the text after ``</think>`` (``parse(text)``: LaTeX with ``\\boxed{}`` first, then
    other LaTeX, then plain expressions); when that finds no math object, as the judge parses a gold answer
    (``gold_source``: bare LaTeX such as ``\\dfrac12`` or ``(0,1]`` is read inside ``\\boxed{}``).
    """
    from math_verify import parse

    from klear_lib.rewards.math import gold_source

    found = None
    for candidate in dict.fromkeys((text, gold_source(text))):  # the second only when it differs
        try:
            parsed = parse(candidate, parsing_timeout=seconds, raise_on_error=True)
        except Exception:  # noqa: BLE001 - a timeout or a sympy/antlr error: this reading has no answer
            continue
        if any(not isinstance(x, str) for x in parsed):  # a math object (strings are math-verify's fallback)
            return candidate, parsed
        if parsed and found is None:
            found = candidate, parsed
    return found


@dataclass
class _Class:
    """One equivalence class of answers: its representative (the first member) and its votes."""

    text: str  # what was parsed: the answer, or the answer inside \\boxed{}
    parsed: list  # math-verify's parse of ``text``
    written: str  # the answer as the sample wrote it
    votes: int = 0


def _join(answer: str, classes: list[_Class], seconds: int) -> _Class | None:
    """The class ``answer`` belongs to: the first whose representative verifies equal to it, else a new one
    appended to ``classes``; None when the answer cannot be parsed at all."""
    from math_verify import verify

    parsed = _parse_answer(answer, seconds)
    if parsed is None:
        return None
    for c in classes:
        if verify(c.parsed, parsed[1], timeout_seconds=seconds):  # a timeout or an error reads as "not equal"
            return c
    classes.append(_Class(*parsed, written=answer))
    return classes[-1]


def math_majority(answers: Sequence[str | None], gold: str, *, timeout_s: float = 5.0) -> RewardResult:
    """The majority answer of one problem by math-verify equivalence, judged against ``gold``.

    Samples are taken in order; each joins the first class whose representative (its first member) it equals
    (same text, or ``verify(representative, answer)``), else opens a class. The largest class wins, ties going
    to the class that reached the top count first; its representative is judged by ``score_math`` (the
    evaluation's judge, format rule off since the answer is already the text after ``</think>``).
    None answers, and answers math-verify cannot parse at all, never vote.

    Returns a ``RewardResult`` so that a ``RewardPool`` can run it (``RewardPool(math_majority)``, one item
    ``{"answers", "gold"}`` per problem): score 1.0 when the majority is correct, else 0.0; the reason is the
    judge's (``no_answer`` when nothing voted); ``detail`` says how many votes the winner had, and which answer.
    Every parse and comparison is bounded by ``timeout_s`` (math-verify's SIGALRM): main thread only.
    """
    from klear_lib.rewards.math import score_math

    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("math_majority needs a process's main thread (math-verify's timeouts are SIGALRM); "
                           "run it through a RewardPool from other threads")
    seconds = max(1, math.ceil(timeout_s))
    classes: list[_Class] = []
    class_of: dict[str, _Class | None] = {}  # each distinct answer text is parsed and compared once
    best, votes = None, 0
    for a in answers:
        if a is None:
            continue
        if a not in class_of:
            class_of[a] = _join(a, classes, seconds)
        c = class_of[a]
        if c is None:
            continue
        c.votes += 1
        votes += 1
        if best is None or c.votes > best.votes:  # strictly more: a tie stays with the class that got there first
            best = c
    if best is None:
        return RewardResult(0.0, "no_answer", detail=f"no answer among {len(answers)} samples")
    verdict = score_math(best.text, gold, format_rule="none", timeout_s=timeout_s)
    shown = best.written.strip()
    shown = shown if len(shown) <= 80 else "..." + shown[-77:]
    return RewardResult(float(verdict.reason == "correct"), verdict.reason,
                        detail=f"{best.votes} of {votes} votes: {shown}")


def math_maj_at_k(answers: Sequence[Sequence[str | None]], gold: Sequence[str], k: int, *, pool=None,
                  timeout_s: float = 5.0) -> float:
    """maj@k of math answers: the share of problems whose largest math-verify equivalence class among the first
    ``k`` answers verifies against the gold answer (see ``math_majority`` for the vote and the tie rule).

    ``answers[i][j]``: what the judge reads of sample j of problem i, i.e. ``klear_lib.rewards.math
    .extract_answer(response)`` (the text after the last ``</think>``), or a bare answer (``\\frac{1}{2}``);
    None never votes (pass None for samples that failed the format). ``pool``: an open
    ``RewardPool(math_majority)`` that grades one problem per task in its workers (a hung comparison costs that
    problem, counted wrong); None runs every problem here, which must be a main thread.
    """
    _check_votes(answers, gold, k)
    items = [{"answers": list(row[:k]), "gold": str(g), "timeout_s": timeout_s} for row, g in zip(answers, gold)]
    if pool is None:
        results = [math_majority(**item) for item in items]
    else:
        if pool.score_fn is not math_majority:
            raise ValueError(f"math_maj_at_k needs a RewardPool of math_majority, got one of "
                             f"{getattr(pool.score_fn, '__name__', pool.score_fn)}")
        results = pool.score_batch(items)
    return sum(r.reason == "correct" for r in results) / len(items)


def bootstrap_ci(per_problem, *, level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``per_problem`` scores (resampling problems)."""
    x = np.asarray(per_problem, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"per_problem must be a non-empty 1-D array, got shape {x.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
