"""GRPO group advantages and zero-advantage group filtering (reference §2).

Rewards arrive flat, (N,), ordered so that each consecutive block of `group_size` entries holds the
responses to one prompt (the layout of `n` rollouts per prompt in TRL and verl).
"""
from __future__ import annotations

import torch
from torch import Tensor

STD_MODES = ("unbiased", "population", "none")
FILTER_RULES = ("klear", "dapo")


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    """(N,) -> (N / group_size, group_size), with errors naming what disagrees."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(f"the number of rewards N={rewards.shape[0]} is not divisible by "
                         f"group_size={group_size}")
    return rewards.reshape(-1, group_size)  # (G, n)


def grpo_advantages(rewards: Tensor, group_size: int, *, std: str = "unbiased", eps: float = 1e-6) -> Tensor:
    """GRPO advantage per response: (R - mean_group) / (std_group + eps), (N,) -> (N,).

    std="unbiased": the N-1 std of Klear's released code (and verl's torch.std); "population": the N std
    the Klear paper writes; "none": R - mean_group, no division (Dr. GRPO, arXiv 2503.20783). Reference §2;
    eps = 1e-6 as Klear. A group of one response has advantage 0 (its std is taken as 0, not NaN; verl
    instead passes the raw reward through).
    """
    if std not in STD_MODES:
        raise ValueError(f"unknown std mode {std!r}; valid: {list(STD_MODES)}")
    rewards = rewards if rewards.is_floating_point() else rewards.float()  # int/bool rewards: float math
    g = _groups(rewards, group_size)  # (G, n)
    centred = g - g.mean(dim=-1, keepdim=True)  # (G, n)
    if std == "none":
        return centred.reshape(-1)
    if group_size == 1:
        return torch.zeros_like(centred).reshape(-1)
    # GRPO (Shao et al. 2024): Â_i = (r_i - mean(r)) / (std(r) + eps), std with N-1 or N in the denominator
    sd = g.std(dim=-1, correction=1 if std == "unbiased" else 0, keepdim=True)  # (G, 1)
    return (centred / (sd + eps)).reshape(-1)


def zero_advantage_group_mask(rewards: Tensor, group_size: int, *, rule: str = "klear",
                              max_reward: float | None = None) -> Tensor:
    """Which responses to keep (True) after dropping groups whose advantages would all be zero, (N,) bool.

    rule="klear" (reference §2): indicator = (reward == max_reward), exact equality; keep a group iff the
    std of its indicator is > 0, i.e. it holds both fully correct and not fully correct responses. A group
    of partial rewards (e.g. 0.5 and 0.25 with max 1) is dropped even though its rewards differ.
    max_reward defaults to 1.0, the maximum of Klear's math (±1) and code (2·pass_rate - 1) rewards; pass
    it for other scales. It is never inferred from the batch, so one batch cannot redefine "correct".
    rule="dapo" (DAPO's dynamic sampling): keep a group iff the std of its rewards is > 0.
    std > 0 is tested as max != min (the same condition, free of round-off). What is done with the kept
    groups (oversampling, packing into mini-batches) is the trainer's business (klear_lib.train.rl).
    """
    if rule not in FILTER_RULES:
        raise ValueError(f"unknown filter rule {rule!r}; valid: {list(FILTER_RULES)}")
    if rule == "dapo" and max_reward is not None:
        raise ValueError("max_reward applies to rule='klear' only; rule='dapo' compares the rewards")
    g = _groups(rewards, group_size)  # (G, n)
    if rule == "klear":
        g = (g == (1.0 if max_reward is None else max_reward)).to(torch.int8)  # (G, n) fully-correct indicator
    keep = g.amax(dim=-1) != g.amin(dim=-1)  # (G,) std > 0
    return keep.repeat_interleave(group_size)  # (N,)
