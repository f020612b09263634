"""GRPO advantages and zero-advantage group filtering (reference §2), on hand-computed groups."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from klear_lib.advantages import grpo_advantages, zero_advantage_group_mask

DT = torch.float64
EPS = 1e-6

# Two groups of 3: [2, -1, -1] and [1, 1, 1].
# Group 0: mean 0, centred [2, -1, -1], Σ(x - mean)² = 4 + 1 + 1 = 6
#   unbiased std = √(6/2) = √3, population std = √(6/3) = √2
# Group 1: all equal, centred 0, std 0 → 0 / (0 + eps) = 0 in every mode
REWARDS = torch.tensor([2.0, -1.0, -1.0, 1.0, 1.0, 1.0], dtype=DT)


@pytest.mark.parametrize("std,expected", [
    ("unbiased", [2 / (math.sqrt(3) + EPS), -1 / (math.sqrt(3) + EPS), -1 / (math.sqrt(3) + EPS), 0, 0, 0]),
    ("population", [2 / (math.sqrt(2) + EPS), -1 / (math.sqrt(2) + EPS), -1 / (math.sqrt(2) + EPS), 0, 0, 0]),
    ("none", [2.0, -1.0, -1.0, 0, 0, 0]),  # Dr. GRPO: centred only
])
def test_grpo_advantages_hand_values(std, expected):
    adv = grpo_advantages(REWARDS, 3, std=std)
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=DT), atol=1e-12, rtol=0)


def test_grpo_binary_group_and_eps():
    # [1, 0, 0, 1]: mean 0.5, centred ±0.5; unbiased std √(4·0.25/3) = 0.57735 → ±0.866025
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=DT), 4)
    torch.testing.assert_close(adv, torch.tensor([1, -1, -1, 1], dtype=DT) * 0.5 / (math.sqrt(1 / 3) + EPS))
    # population std 0.5 with eps = 0.5: 0.5 / (0.5 + 0.5) = 0.5
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=DT), 4, std="population", eps=0.5)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=DT))


def test_grpo_groups_are_independent_and_ints_work():
    base = grpo_advantages(REWARDS, 3)
    shifted = REWARDS.clone()
    shifted[3:] += 10.0  # another group's rewards change: group 0's advantages must not
    torch.testing.assert_close(grpo_advantages(shifted, 3)[:3], base[:3])
    torch.testing.assert_close(grpo_advantages(torch.tensor([1, 0]), 2),
                               torch.tensor([1, -1], dtype=torch.float32) * 0.5 / (math.sqrt(0.5) + EPS))


def test_group_of_one_has_zero_advantage_not_nan():
    for std in ("unbiased", "population", "none"):
        assert (grpo_advantages(torch.tensor([1.0, -1.0, 0.5]), 1, std=std) == 0).all()


def test_grpo_bad_input():
    with pytest.raises(ValueError, match=r"N=5.*group_size=2"):
        grpo_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="unbiased"):
        grpo_advantages(torch.zeros(4), 2, std="sample")
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        grpo_advantages(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="group_size"):
        grpo_advantages(torch.zeros(4), 0)


# Groups of 4: all correct, all wrong, mixed, partial rewards only, partial plus one fully correct.
GROUPS = torch.tensor([
    1.0, 1.0, 1.0, 1.0,  # all correct: every advantage 0 → drop under both rules
    -1.0, -1.0, -1.0, -1.0,  # all wrong → drop
    1.0, -1.0, -1.0, 1.0,  # mixed → keep
    0.5, 0.25, 0.5, 0.0,  # partial (code pass rates): no reward equals 1 → klear drops, dapo keeps
    1.0, 0.5, 0.5, 0.5,  # one fully correct among partials → keep under both
])


def test_filter_klear_rule():
    keep = zero_advantage_group_mask(GROUPS, 4)
    assert keep.dtype == torch.bool and keep.shape == (20,)
    assert keep.tolist() == [False] * 4 + [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4


def test_filter_klear_rule_with_explicit_max_reward():
    # max_reward 0.5: group 3's indicator is [1, 0, 1, 0] → keep; group 4's is [0, 1, 1, 1] → keep;
    # group 0's and group 2's rewards never equal 0.5 → drop
    keep = zero_advantage_group_mask(GROUPS, 4, max_reward=0.5).reshape(5, 4)[:, 0]
    assert keep.tolist() == [False, False, False, True, True]


def test_filter_dapo_rule():
    keep = zero_advantage_group_mask(GROUPS, 4, rule="dapo").reshape(5, 4)[:, 0]
    assert keep.tolist() == [False, False, True, True, True]


def test_filter_bad_input():
    with pytest.raises(ValueError, match="klear"):
        zero_advantage_group_mask(GROUPS, 4, rule="std")
    with pytest.raises(ValueError, match="N=20.*group_size=3"):
        zero_advantage_group_mask(GROUPS, 3)
    with pytest.raises(ValueError, match="max_reward"):
        zero_advantage_group_mask(GROUPS, 4, rule="dapo", max_reward=1.0)


@settings(max_examples=40, deadline=None)
@given(groups=st.lists(st.lists(st.sampled_from([-1.0, 0.0, 0.25, 0.5, 1.0]), min_size=3, max_size=3),
                       min_size=1, max_size=5))
def test_dapo_filter_keeps_exactly_the_groups_with_a_nonzero_advantage(groups):
    rewards = torch.tensor([r for g in groups for r in g], dtype=DT)
    nonzero = grpo_advantages(rewards, 3).reshape(-1, 3).ne(0).any(-1).repeat_interleave(3)
    assert zero_advantage_group_mask(rewards, 3, rule="dapo").tolist() == nonzero.tolist()
