"""Verifiable rewards (reference section 5): the math judge, the code sandbox and reward, a process-pool manager.

    score_math(response, gold, **options) -> RewardResult        klear_lib.rewards.math
    score_code(response, tests, *, mode="soft", **options)        klear_lib.rewards.code
    run_python(code, *, stdin="", timeout_s=10.0, memory_mb=1024) klear_lib.rewards.sandbox
    run_python_tests(program, tests, *, timeout_s=10.0, ...)      klear_lib.rewards.sandbox (one sandbox per sample)
    RewardPool(score_fn, ...), make_trl_reward_func(pool, ...)    klear_lib.rewards.pool

The submodules are imported on use (math-verify and the sandbox have start-up costs a loss-only user skips).
"""

from klear_lib.rewards.result import RewardResult

__all__ = ["RewardResult"]
