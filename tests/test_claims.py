"""The one verdict rule: a paired bootstrap interval over seeds, read against the paper's direction."""

import math
import random

import pytest

from klear_lib import claims


def test_bootstrap_of_one_value_and_of_identical_values_is_that_value():
    assert claims.paired_bootstrap([0.3]) == (0.3, 0.3, 0.3)
    mean, lo, hi = claims.paired_bootstrap([0.25] * 5)
    assert mean == lo == hi == pytest.approx(0.25)


def test_bootstrap_interval_against_a_brute_force_enumeration():
    """For 3 differences every resample is one of 27 equally likely tuples: the bootstrap distribution of the mean
    is known exactly, and 20,000 draws put the 2.5% / 97.5% quantiles near its exact quantiles."""
    diffs = [0.0, 0.1, 0.5]
    exact = sorted(sum(t) / 3 for t in ((a, b, c) for a in diffs for b in diffs for c in diffs))
    mean, lo, hi = claims.paired_bootstrap(diffs, n_boot=20_000)
    assert mean == pytest.approx(0.2)
    # exact quantiles of the 27-point distribution (each point has mass 1/27 ≈ 3.7%): the lowest is 0, the highest 0.5
    assert lo == pytest.approx(exact[0], abs=0.04) and hi == pytest.approx(exact[-1], abs=0.04)
    assert claims.paired_bootstrap(diffs, n_boot=20_000) == (mean, lo, hi)  # fixed seed: same interval


def test_interval_covers_the_true_mean_about_95_percent_for_many_seeds():
    rng = random.Random(1)
    hits = 0
    for _ in range(200):
        diffs = [rng.gauss(0.1, 0.2) for _ in range(30)]
        _, lo, hi = claims.paired_bootstrap(diffs, n_boot=2000, seed=rng.randrange(10**6))
        hits += lo <= 0.1 <= hi
    assert 0.88 <= hits / 200 <= 0.99


@pytest.mark.parametrize("lo, hi, direction, expected", [
    (0.01, 0.2, 1, "reproduced"), (-0.2, -0.01, 1, "reversed"), (-0.1, 0.1, 1, "inconclusive"),
    (0.0, 0.1, 1, "inconclusive"),  # an interval that touches 0 does not exclude it
    (-0.2, -0.01, -1, "reproduced"), (0.01, 0.2, -1, "reversed"), (-0.1, 0.1, -1, "inconclusive"),
])
def test_verdict_rule(lo, hi, direction, expected):
    assert claims.verdict(lo, hi, direction) == expected


def test_paired_claim_pairs_by_seed_and_validates():
    a = {0: 0.8, 1: 0.7, 2: 0.9, 3: 0.85, 9: 1.0}  # seed 9 has no partner: left out
    b = {0: 0.6, 1: 0.65, 2: 0.7, 3: 0.75}
    c = claims.paired_claim("x", "a beats b", "Table 1", "final accuracy", a, b)
    assert c["seeds"] == 4 and c["effect"] == pytest.approx((0.2 + 0.05 + 0.2 + 0.1) / 4)
    assert c["per_seed"] == {"0": pytest.approx(0.2), "1": pytest.approx(0.05), "2": pytest.approx(0.2),
                             "3": pytest.approx(0.1)}
    assert c["verdict"] == "reproduced" and c["ci_low"] >= 0.05 - 1e-12
    reverse = claims.paired_claim("y", "b beats a", "Table 1", "final accuracy", a, b, direction=-1)
    assert reverse["verdict"] == "reversed"
    assert claims.validate_claims([c, reverse]) == [c, reverse]


@pytest.mark.parametrize("change, message", [
    (dict(verdict="reproduced", ci_low=-0.1), "does not follow from the interval"),
    (dict(verdict="maybe"), "verdict must be one of"),
    (dict(effect=float("nan")), "effect must be a finite number"),
    (dict(seeds=0), "seeds must be a positive int"),
    (dict(effect=5.0), "outside its interval"),
    (dict(colour="red"), "unknown field"),
])
def test_validate_claims_names_the_claim_and_the_field(change, message):
    good = claims.paired_claim("x", "a beats b", "Fig. 3", "auc", {0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.5})
    with pytest.raises(ValueError, match=message):
        claims.validate_claims([{**good, **change}])
    bad = dict(good)
    del bad["source"]
    with pytest.raises(ValueError, match=r"claims\[0\] \(x\): missing field\(s\) \['source'\]"):
        claims.validate_claims([bad])
    with pytest.raises(ValueError, match="used twice"):
        claims.validate_claims([good, good])


def test_area_under_curve_and_first_crossing():
    assert claims.area_under_curve([0, 1, 2], [0.0, 1.0, 1.0]) == pytest.approx((0.5 + 1.0) / 2)
    assert claims.area_under_curve([2, 0, 1], [1.0, 0.0, 1.0]) == pytest.approx(0.75)  # order does not matter
    assert claims.area_under_curve([0, 1, 2], [0.2, float("nan"), 0.2]) == pytest.approx(0.2)
    assert claims.first_crossing([0, 2, 4], [0.1, 0.6, 0.9], 0.5, censored=5) == 2
    assert claims.first_crossing([0, 2, 4], [0.1, 0.3, 0.4], 0.5, censored=5) == 5
    with pytest.raises(ValueError, match="two points"):
        claims.area_under_curve([0], [1.0])
    assert math.isclose(claims.area_under_curve([0, 4], [0.0, 1.0]), 0.5)
