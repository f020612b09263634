"""Evaluation metrics of the paper's protocol (reference §7), pure functions over per-sample correctness.

* avg@n: mean over problems of the fraction of n samples that are correct (an unbiased pass@1 estimate);
  Klear reports avg@64 on AIME24/25 and HMMT25, avg@8 on LiveCodeBench.
* pass@k (unbiased, Chen et al. 2021): 1 - C(n-c, k) / C(n, k) for a problem with c correct of n samples,
  computed as a product of ratios so that it stays exact for large n (no huge binomials, no cancellation).
* maj@k: the share of problems whose most frequent answer among the first k samples is the gold one.
* Bootstrap confidence intervals over problems (the samples of a problem stay together).
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Sequence

import numpy as np


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


def maj_at_k(answers: Sequence[Sequence[Hashable | None]], gold: Sequence[Hashable], k: int) -> float:
    """Share of problems whose majority answer among the first ``k`` samples equals the gold answer.

    ``answers[i]`` are problem i's extracted answers (None: no answer, never a vote). Ties go to the answer that
    reached the top count first in sample order; a problem with no answer at all counts as wrong.
    """
    if len(answers) != len(gold) or not answers:
        raise ValueError(f"answers ({len(answers)} problems) and gold ({len(gold)}) must be non-empty and equal in length")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    hits = 0
    for i, (row, g) in enumerate(zip(answers, gold)):
        if len(row) < k:
            raise ValueError(f"problem {i} has {len(row)} samples, fewer than k={k}")
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
