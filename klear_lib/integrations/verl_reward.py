"""verl reward function for Klear's RL data: ``reward.custom_reward_function.path`` points at this file.

``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` judges math with
``klear_lib.rewards.math.score_math`` (Klear's released format rule and ±1 scores) and code with
``klear_lib.rewards.code.score_code`` in the bubblewrap sandbox (``soft``: the fraction of tests passed;
``KLEAR_CODE_REWARD=hard`` or ``signed`` for the other modes). Code ground truths are the records' JSON strings
of tests. math-verify's timeouts need the process's main thread: verl's reward workers call the function there;
called from another thread, ``score_math`` raises instead of grading without a timeout.
"""

from __future__ import annotations

import json
import os

from klear_lib.data.hub import is_code_record


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    ability = (extra_info or {}).get("ability", "") if isinstance(extra_info, dict) else ""
    if is_code_record(str(data_source), str(ability)):
        from klear_lib.rewards.code import score_code

        tests = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
        return score_code(solution_str, tests, mode=os.environ.get("KLEAR_CODE_REWARD", "soft")).score
    from klear_lib.rewards.math import score_math

    return score_math(solution_str, str(ground_truth)).score
