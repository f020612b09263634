"""verl reward function for Klear's RL data: ``reward.custom_reward_function.path`` points at this file.

``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` judges math with
``klear_lib.rewards.math.score_math`` (Klear's released format rule and ±1 scores) and code with
``klear_lib.rewards.code.score_code`` in the bubblewrap sandbox (``soft``: the fraction of tests passed;
``KLEAR_CODE_REWARD=hard`` or ``signed`` for the other modes). Code ground truths are the records' JSON strings
of tests, read with ``klear_lib.rewards.code.parse_tests`` (integers of any size). ``score_code`` never raises
on a response (whatever its program does, a failure scores the mode's ``failure_score``, the score of an honest
wrong answer), so one hostile response cannot end verl's step, whose reward loop catches only timeouts; a
malformed ground truth (a data error) or a machine that cannot sandbox still raises, naming it; so does a machine
where the sandbox cannot make a cgroup (its CPU time and memory only polled), unless
``KLEAR_SANDBOX_ALLOW_NO_CGROUP=1`` opts in (``sandbox.require_metered``). Code is graded in the calling thread,
with no pool, so no limit of ours can cut a slow but correct sample short of the sandbox's own budget.

It returns ``{"score": s, "acc": 1.0 if s == FULL_SCORE else 0.0}``. verl 0.9.1's reward loop puts ``score`` into
``rm_scores`` (the reward) and every key of the dict into the trajectory's ``reward_extra_info``, which is what
``algorithm.filter_groups.metric`` names. So ``metric=acc`` is Klear's group filter (keep a group iff its
fully-correct indicator varies, ``klear_lib.advantages.zero_advantage_group_mask(rule="klear")``) and
``metric=score`` is DAPO's (keep a group iff its rewards vary, ``rule="dapo"``). Klear's own script names the same
metric ``acc``. A float return value would make verl set ``acc = score`` itself, i.e. DAPO's rule under Klear's
name: the dict is what makes ``acc`` mean "fully correct".

Threads. math-verify's timeouts use SIGALRM, which works only in a process's main thread, and verl 0.9.1's reward
loop calls a synchronous ``compute_score`` from a thread pool (``loop.run_in_executor(None, ...)`` in its reward
managers). Outside the main thread, math is therefore graded in a small process pool
(``klear_lib.rewards.pool.RewardPool``: 2 spawned workers per reward process, 10 s per item, a timeout or crash
scores ``wrong_score`` −1); in the main thread it is graded in place. Code runs in sandboxed subprocesses and is
graded in the calling thread either way.

The module imports nothing heavy at load time: ``klear_lib.integrations.verl`` (loaded in every verl process)
imports ``FULL_SCORE`` from it.
"""

from __future__ import annotations

import atexit
import os
import threading

#: The reward of a fully-correct response: the maximum of Klear's math (±1) and code rewards (soft k/n, hard 0/1,
#: signed 2k/n − 1); the loss's positive-sample term uses the same definition (klear_lib.integrations.verl).
FULL_SCORE = 1.0
#: Worker processes and per-item limit of the math pool used off the main thread.
MATH_POOL_WORKERS = 2
MATH_POOL_TIMEOUT_S = 10.0

_pool = None
_pool_lock = threading.Lock()


def is_fully_correct(score: float) -> bool:
    """Klear's "fully correct": the reward equals ``FULL_SCORE`` exactly (reference §2)."""
    return float(score) == FULL_SCORE


def _math_pool():
    global _pool
    with _pool_lock:
        if _pool is None:
            from klear_lib.rewards.math import MathRewardOptions, score_math
            from klear_lib.rewards.pool import RewardPool

            _pool = RewardPool(score_math, workers=MATH_POOL_WORKERS, timeout_s=MATH_POOL_TIMEOUT_S,
                               failure_score=MathRewardOptions().wrong_score)
            atexit.register(close_pool)
        return _pool


def close_pool() -> None:
    """Stop the math pool's workers (if one was started); a later call off the main thread starts a new one."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.close(wait=False)


def _score(data_source, solution_str, ground_truth, extra_info) -> float:
    from klear_lib.data.code_tests import is_code_record  # here, not at the top: the loss module imports FULL_SCORE

    ability = (extra_info or {}).get("ability", "") if isinstance(extra_info, dict) else ""
    if is_code_record(str(data_source), str(ability)):
        from klear_lib.rewards.code import parse_tests, score_code
        from klear_lib.rewards.sandbox import require_metered

        require_metered("verl's code reward")  # raises without a cgroup unless opted in; warns once if opted in
        tests = parse_tests(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
        return score_code(solution_str, tests, mode=os.environ.get("KLEAR_CODE_REWARD", "soft")).score
    if threading.current_thread() is threading.main_thread():
        from klear_lib.rewards.math import score_math

        return score_math(solution_str, str(ground_truth)).score
    return _math_pool().score(response=solution_str, gold=str(ground_truth)).score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl's ``compute_score``: ``{"score": reward, "acc": 1.0 iff the reward is FULL_SCORE}`` (module doc)."""
    score = float(_score(data_source, solution_str, ground_truth, extra_info))
    return {"score": score, "acc": 1.0 if is_fully_correct(score) else 0.0}
