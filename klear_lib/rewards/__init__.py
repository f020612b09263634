"""Verifiable rewards (reference section 5): the math judge, the code sandbox and reward, a process-pool manager."""

from klear_lib.rewards.result import RewardResult

__all__ = ["RewardResult"]
