"""The reward pool wired into KlearGRPOTrainer as its reward function: math-verify in worker processes grades
real rollouts, every completion gets a reason, and the trainer sees the scores."""

import pytest
from test_rl_trainer import make_trainer

from klear_lib.recipe import KlearLossConfig
from klear_lib.rewards.math import score_math
from klear_lib.rewards.pool import RewardPool
from klear_lib.rewards.pool_wrappers import make_trl_reward_func


def test_pool_backed_math_reward_in_the_trainer(tiny, tmp_path):
    with RewardPool(score_math, workers=2, timeout_s=10.0, failure_score=-1.0) as pool:
        reward = make_trl_reward_func(pool, {"gold": "answer"}, "math_verify")
        records = []
        trainer = make_trainer(tiny, tmp_path, klear=KlearLossConfig(loss_name="gppo", filter_groups=False,
                                                                     oversample_factor=1.0),
                               steps=2, updates=2, reward_funcs=[reward], on_rollout=(lambda tr, r: records.append(r),))
        trainer.train()
    # one rollout batch of 2 mini-batches x 8 completions; a random model writes no </think>: the released
    # format rule scores that -0.5 with reason no_think_close (or -2.0 without <think>)
    assert sum(reward.reason_counts.values()) == 16
    assert set(reward.reason_counts) <= {"no_think_close", "no_think_open", "no_answer", "wrong", "correct"}
    logged = [r for r in records if "rewards/math_verify/mean" in r]
    assert logged and logged[0]["rewards/math_verify/mean"] == pytest.approx(
        sum(r.score for r in reward.last_results) / 16)
