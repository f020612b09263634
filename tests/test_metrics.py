"""Evaluation metrics against hand-computed values and a brute-force enumeration; maj@k by math-verify
equivalence against hand-made votes and against the string vote where the two must agree."""

import itertools
import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klear_lib.data import tasks
from klear_lib.evaluation.metrics import (
    avg_at_n,
    bootstrap_ci,
    maj_at_k,
    math_maj_at_k,
    math_majority,
    mean_pass_at_k,
    pass_at_k,
    per_problem_pass_at_k,
)
from klear_lib.rewards.math import extract_answer
from klear_lib.rewards.pool import RewardPool


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


# --- maj@k by math-verify equivalence ----------------------------------------------------------------------------

def test_a_fraction_a_decimal_and_dfrac_are_one_class():
    votes = [r"\frac{1}{2}", "0.5", r"\dfrac12", "1", "1"]
    r = math_majority(votes, "1/2")
    assert (r.score, r.reason, r.detail) == (1.0, "correct", r"3 of 5 votes: \frac{1}{2}")
    assert maj_at_k([votes], ["1/2"], 5) == 0.0  # as strings, "1" wins 2 to 1
    assert math_maj_at_k([votes], [r"\frac{1}{2}"], 5) == 1.0
    assert math_maj_at_k([votes], ["1"], 5) == 0.0


def test_sets_in_any_order_are_one_class_and_intervals_keep_their_ends():
    assert math_majority([r"\{1,2\}", r"\{3\}", r"\{2,1\}"], r"\{1,2\}").detail == r"2 of 3 votes: \{1,2\}"
    # (0,1] and [0,1) differ: [0,1) wins 2 to 1 and is not the gold (0,1]
    assert math_majority(["(0,1]", "[0,1)", "[0,1)"], "(0,1]").reason == "wrong"
    assert math_majority(["(0,1]", "[0,1)", "[0,1)"], "[0,1)").detail == "2 of 3 votes: [0,1)"
    assert math_maj_at_k([["(0,1]", "[0,1)"]], ["(0,1]"], 2) == 1.0  # a 1-1 tie: the first to get there


def test_ties_go_to_the_class_that_reached_the_top_count_first():
    # 1 appears first, but the class of 2 reaches two votes at sample 2, the class of 1 only at sample 3
    votes = ["1", "2", "4/2", r"\frac{2}{2}"]
    assert math_majority(votes, "2").detail == "2 of 4 votes: 2"
    assert math_maj_at_k([votes, votes], ["2", "1"], 4) == 0.5
    assert math_maj_at_k([votes], ["1"], 3) == 0.0 and math_maj_at_k([votes], ["1"], 1) == 1.0


def test_none_and_unparseable_answers_never_vote():
    assert math_majority([None, "", None, "7"], "7").detail == "1 of 1 votes: 7"  # "" first would win a tie
    nothing = math_majority([None, "  ", None], "7")
    assert (nothing.score, nothing.reason) == (0.0, "no_answer")
    assert math_maj_at_k([[None, None, "3"], [None, None, None]], ["3", "3"], 3) == 0.5


def test_only_the_first_k_answers_vote():
    votes = [["2", "2", "1", "1", "1"]]
    assert math_maj_at_k(votes, ["2"], 2) == 1.0
    assert math_maj_at_k(votes, ["2"], 4) == 1.0  # 2-2: the class of 2 got there first
    assert math_maj_at_k(votes, ["2"], 5) == 0.0
    with pytest.raises(ValueError, match="problem 0 has 5 samples, fewer than k=6"):
        math_maj_at_k(votes, ["2"], 6)
    with pytest.raises(ValueError, match="equal in length"):
        math_maj_at_k(votes, ["2", "3"], 1)


def test_an_hmmt_fraction_can_now_win():
    """HMMT answers are often fractions with radicals, written many ways; the tiny task's regex cannot even read
    them (nested braces), so under the old string vote the two plain wrong answers won."""
    gold = r"\frac{9\sqrt{23}}{23}"
    responses = [f"<think>work</think> So the answer is $\\boxed{{{a}}}$." for a in
                 (r"\frac{9\sqrt{23}}{23}", r"\frac{9}{\sqrt{23}}", "2", r"\dfrac{9\sqrt{23}}{23}", "2")]
    old = [[tasks.extract_answer(r) for r in responses]]
    assert old[0] == [None, None, "2", None, "2"] and maj_at_k(old, [gold], 5) == 0.0
    new = [[extract_answer(r) for r in responses]]  # the judge's extraction: the text after </think>
    assert math_maj_at_k(new, [gold], 5) == 1.0
    assert math_majority(new[0], gold).detail.startswith("3 of 5 votes: So the answer is")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["0", "1", "2", "10", None]), min_size=3, max_size=3), min_size=1,
                max_size=3).flatmap(lambda rows: st.tuples(st.just(rows),
                                                           st.lists(st.sampled_from(["0", "1", "2"]),
                                                                    min_size=len(rows), max_size=len(rows)))))
def test_on_plain_integers_the_math_vote_is_the_string_vote(case):
    answers, gold = case  # integers written one way: equivalence is string equality
    for k in (1, 3):
        assert math_maj_at_k(answers, gold, k) == maj_at_k(answers, gold, k)


def test_the_vote_runs_in_a_pool_and_refuses_threads():
    answers = [[r"\frac{1}{2}", "0.5", "3"], ["3", None, r"\frac{6}{2}"], [None, None, None]]
    gold = ["0.5", "3", "1"]
    here = math_maj_at_k(answers, gold, 3)
    assert here == pytest.approx(2 / 3)
    with RewardPool(math_majority, workers=1, timeout_s=30.0) as pool:
        assert math_maj_at_k(answers, gold, 3, pool=pool) == here
    with RewardPool(maj_at_k, workers=1) as wrong:
        with pytest.raises(ValueError, match="needs a RewardPool of math_majority"):
            math_maj_at_k(answers, gold, 3, pool=wrong)
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, math_majority, ["1"], "1")))
    t.start()
    t.join()
    assert "main thread" in str(errors[0].value)


def test_bootstrap_interval_contains_the_mean_and_narrows_with_more_problems():
    rng = np.random.default_rng(0)
    small, large = rng.random(30), rng.random(3000)
    lo, hi = bootstrap_ci(small)
    assert lo <= small.mean() <= hi
    lo2, hi2 = bootstrap_ci(large)
    assert hi2 - lo2 < (hi - lo) / 5
    assert bootstrap_ci([1.0, 1.0, 1.0]) == (1.0, 1.0)
