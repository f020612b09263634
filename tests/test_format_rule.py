"""The judge's think-format rule is one setting (RLExperimentConfig.format_rule) that the RL reward, the held-out
evaluation and klear_lib.train.launch's math judge all read: a think-less answer scores under `none` only."""

import pathlib

import pytest

from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.train import launch
from klear_lib.train.rl_run import correctness_reward, task_reward

ROOT = pathlib.Path(__file__).resolve().parents[1]
THINKLESS = [[{"role": "assistant", "content": "The sum is \\boxed{7}."}],
             [{"role": "assistant", "content": "<think>\n3 + 4 = 7\n</think>\n\\boxed{7}"}],
             [{"role": "assistant", "content": "\\boxed{8}"}]]


def test_the_rl_reward_reads_the_rule_and_keeps_its_reasons():
    assert task_reward("released") is correctness_reward
    assert correctness_reward(THINKLESS, [7, 7, 7]) == [0.0, 1.0, 0.0]
    assert [r.reason for r in correctness_reward.last_results] == ["no_think_close", "correct", "no_think_close"]
    lenient = task_reward("none")
    assert lenient.__name__ == "correctness_reward" and lenient.format_rule == "none"
    assert lenient(THINKLESS, [7, 7, 7]) == [1.0, 1.0, 0.0]
    assert [r.reason for r in lenient.last_results] == ["correct", "correct", "wrong"]
    assert lenient.reward_range == (0.0, 1.0)


def test_the_rule_is_a_checked_config_key_of_the_notebooks_and_launch():
    assert RLExperimentConfig().format_rule == "released"
    with pytest.raises(ValueError, match=r"format_rule must be one of \['released', 'paper', 'none'\]"):
        RLExperimentConfig(format_rule="strict")
    rl, _ = launch.load_config(ROOT / "configs" / "rl" / "cpu_tiny.yaml", {"format_rule": "none"})
    assert rl.format_rule == "none"
    with pytest.raises(ValueError, match="format_rule"):
        launch.load_config(ROOT / "configs" / "rl" / "cpu_tiny.yaml", {"format_rule": "loose"})


def test_the_rules_are_the_math_judges():
    from klear_lib.rewards import math as math_judge

    assert tasks.FORMAT_RULES == math_judge.FORMAT_RULES
    with pytest.raises(ValueError, match="format_rule='strict'"):
        tasks.exact_answer_reward("\\boxed{1}", 1, "strict")
