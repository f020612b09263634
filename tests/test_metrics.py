"""Evaluation metrics against hand-computed values and a brute-force enumeration."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klear_lib.evaluation.metrics import (avg_at_n, bootstrap_ci, maj_at_k, mean_pass_at_k, pass_at_k,
                                          per_problem_pass_at_k)


def brute_pass_at_k(n, c, k):
    """Over every k-subset of n samples (c of them correct): the share containing a correct one."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2)/C(4,2) = 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # C(3,3)/C(5,3)
    assert pass_at_k(5, 3, 3) == 1.0 and pass_at_k(8, 0, 8) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_brute_force(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    # math.comb gives the exact value; the product form must match it where floats can still hold the ratio
    n, c, k = 1024, 3, 64
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)
    assert 0 <= pass_at_k(10_000, 1, 5000) <= 1


@pytest.mark.parametrize("args", [(0, 0, 1), (4, 5, 1), (4, 1, 5), (4, 1, 0), (4.0, 1, 1)])
def test_pass_at_k_rejects_bad_counts(args):
    with pytest.raises((ValueError, TypeError)):
        pass_at_k(*args)


def test_avg_at_n_and_pass_at_1_agree():
    correct = np.array([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=bool)
    assert avg_at_n(correct) == pytest.approx((0.5 + 0 + 1) / 3)
    assert mean_pass_at_k(correct, 1) == pytest.approx(avg_at_n(correct))
    assert per_problem_pass_at_k(correct, 4).tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="row 0, sample 1"):
        avg_at_n([[1, 2]])
    with pytest.raises(ValueError, match="shape"):
        avg_at_n([1, 0])


def test_maj_at_k_by_hand():
    answers = [["5", "3", "5", "3"], ["1", None, "2", "2"], [None, None, None, None], ["7", "8", "8", "7"]]
    gold = ["5", "2", "1", "7"]
    # problem 0: 5 wins 2-2 tie by reaching 2 first; 1: 2; 2: no vote -> wrong; 3: 8 reaches 2 first -> wrong
    assert maj_at_k(answers, gold, 4) == pytest.approx(2 / 4)
    assert maj_at_k(answers, gold, 1) == pytest.approx(2 / 4)  # "5" and "7"
    with pytest.raises(ValueError, match="problem 0 has 4 samples, fewer than k=5"):
        maj_at_k(answers, gold, 5)


def test_bootstrap_interval_contains_the_mean_and_narrows_with_more_problems():
    rng = np.random.default_rng(0)
    small, large = rng.random(30), rng.random(3000)
    lo, hi = bootstrap_ci(small)
    assert lo <= small.mean() <= hi
    lo2, hi2 = bootstrap_ci(large)
    assert hi2 - lo2 < (hi - lo) / 5
    assert bootstrap_ci([1.0, 1.0, 1.0]) == (1.0, 1.0)
