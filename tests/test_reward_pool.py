"""The reward manager (klear_lib/rewards/pool.py): order, timeouts, dead workers, invalid scores, memory, start
failures, groups, cleanup, the TRL adapter."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import textwrap
import time

import numpy as np
import pytest

from klear_lib.rewards.math import score_math
from klear_lib.rewards.pool import POOL_REASONS, RewardPool, WorkerStartError, completion_text, make_trl_reward_func
from klear_lib.rewards.result import RewardResult

POOL_TIMEOUT_S = 3.0
# Pools that test the pool's own logic fork their workers (≈10 ms) instead of spawning them (≈1 s, the default,
# exercised by the module's shared pools and by the start-failure tests, where a fresh interpreter is the point).
FORK = {"start_method": "fork"}
SLOW_ANSWER = "<think>x</think> $\\boxed{9^{9^{9^{9}}}}$"  # math-verify's comparison of it never finishes


def behave(kind: str, value: float = 0.0, **kwargs) -> RewardResult:
    """A judge that misbehaves on request; module-level so that spawned workers can import it."""
    if kind == "echo":
        return RewardResult(float(value), "echo")
    if kind == "sleep":
        time.sleep(value)
        return RewardResult(0.0, "slept")
    if kind == "exit":
        os._exit(1)
    if kind == "exit0":  # an early exit that reports success
        os._exit(0)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "score":  # a RewardResult whose score is whatever the test passes
        return RewardResult(value, "echo")
    if kind == "allocate":  # value MiB, touched
        return RewardResult(float(len(bytearray(int(value) << 20))), "allocated")
    if kind == "raise":
        raise ValueError(f"judge failed on {value}")
    if kind == "not_a_result":
        return value
    if kind == "math":
        return score_math(**kwargs)
    if kind == "pid":  # which worker graded it
        time.sleep(value)
        return RewardResult(0.0, "pid", detail=str(os.getpid()))
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def pool():
    with RewardPool(behave, workers=2, timeout_s=POOL_TIMEOUT_S) as p:
        yield p


def test_order_preserved_on_a_mixed_batch(pool):
    items = []
    for i in range(12):
        items.append({"kind": "echo", "value": i})
        if i % 4 == 0:
            items.append({"kind": "math", "response": "<think>x</think> \\boxed{\\frac{3}{4}}", "gold": "0.75"})
        if i == 5:
            items.append({"kind": "raise", "value": i})
    results = pool.score_batch(items)
    assert len(results) == len(items)
    for item, r in zip(items, results):
        expected = {"echo": ("echo", item.get("value")), "math": ("correct", 1.0), "raise": ("error", -1.0)}
        reason, score = expected[item["kind"]]
        assert (r.reason, r.score) == (reason, float(score)), (item, r)


def test_empty_batch(pool):
    assert pool.score_batch([]) == []


def test_timeout_is_a_score_not_a_hang(pool):
    t0 = time.monotonic()
    results = pool.score_batch([{"kind": "sleep", "value": 60}, {"kind": "echo", "value": 1}])
    elapsed = time.monotonic() - t0
    assert results[0] == RewardResult(-1.0, "timeout", detail=f"item ran past {POOL_TIMEOUT_S:g} s")
    assert results[1].reason == "echo"
    assert elapsed < POOL_TIMEOUT_S + 2.0


@pytest.mark.parametrize("kind, how", [("exit", "exit status 1"), ("exit0", "exit status 0"),
                                       ("sigkill", "killed by SIGKILL"), ("segfault", "killed by SIGSEGV")])
def test_dead_worker_is_reported_at_once_and_the_pool_recovers(pool, kind, how):
    t0 = time.monotonic()
    (r,) = pool.score_batch([{"kind": kind}])
    elapsed = time.monotonic() - t0
    assert r == RewardResult(-1.0, "worker_died", detail=f"the worker process ended while grading ({how})")
    assert elapsed < POOL_TIMEOUT_S / 2  # seen when the process ends, not when the item's limit runs out
    # the dead worker was replaced: the next batch on the same pool is scored normally
    again = pool.score_batch([{"kind": "echo", "value": v} for v in range(4)])
    assert [r.score for r in again] == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "0.5", None, True, 1j])
def test_non_finite_or_non_numeric_score_is_invalid_score(pool, value):
    (r,) = pool.score_batch([{"kind": "score", "value": value}])
    assert (r.score, r.reason) == (-1.0, "invalid_score")
    assert "judge's reason 'echo'" in r.detail


def test_numpy_and_integer_scores_come_back_as_floats(pool):
    results = pool.score_batch([{"kind": "score", "value": np.float32(0.5)}, {"kind": "score", "value": 2}])
    assert results == [RewardResult(0.5, "echo"), RewardResult(2.0, "echo")]
    assert all(type(r.score) is float for r in results)


def test_memory_cap_gives_memory_exceeded_and_the_worker_goes_on():
    """memory_mb is address space on top of what the worker holds once started (RLIMIT_AS)."""
    with RewardPool(behave, workers=1, timeout_s=10.0, memory_mb=64, **FORK) as p:
        before, big, small, after = p.score_batch([{"kind": "pid"}, {"kind": "allocate", "value": 256},
                                                   {"kind": "allocate", "value": 16}, {"kind": "pid"}])
    assert (big.score, big.reason) == (-1.0, "memory_exceeded") and big.detail.startswith("MemoryError")
    assert small == RewardResult(float(16 << 20), "allocated")  # within the cap
    assert before.detail == after.detail  # the same worker process went on
    with RewardPool(behave, workers=1, timeout_s=10.0, memory_mb=None, **FORK) as p:  # no cap
        assert p.score(kind="allocate", value=256) == RewardResult(float(256 << 20), "allocated")


def test_exception_and_bad_return_are_errors(pool):
    raised, bad = pool.score_batch([{"kind": "raise", "value": 7}, {"kind": "not_a_result", "value": 0.5}])
    assert (raised.score, raised.reason) == (-1.0, "error") and "ValueError: judge failed on 7" in raised.detail
    assert (bad.score, bad.reason) == (-1.0, "error") and "expected RewardResult" in bad.detail
    # an argument the judge does not take is an error of that item only
    (r,) = pool.score_batch([{"kind": "math", "response": "<think></think>1", "gold": "1", "nonsense": 1}])
    assert r.reason == "error" and "unknown math reward option" in r.detail


def test_math_verify_timeouts_fire_inside_workers(pool):
    """score_math's own SIGALRM budget (1 s) fires in the worker, before the pool's limit (3 s)."""
    t0 = time.monotonic()
    items = [{"kind": "math", "response": SLOW_ANSWER, "gold": "3", "timeout_s": 1.0},
             {"kind": "math", "response": "<think>x</think> \\boxed{3}", "gold": "3"}]
    slow, fast = pool.score_batch(items)
    assert (slow.reason, slow.detail) == ("timeout", "verifying the answer")  # the judge's reason, not the pool's
    assert fast.reason == "correct"
    assert time.monotonic() - t0 < POOL_TIMEOUT_S + 2.0


def test_pool_timeout_backs_up_a_slow_judge():
    """A judge budget above the pool's limit: the pool kills the worker and says so."""
    with RewardPool(score_math, workers=1, timeout_s=1.5, **FORK) as p:
        t0 = time.monotonic()
        (r,) = p.score_batch([{"response": SLOW_ANSWER, "gold": "3", "timeout_s": 30.0}])
        assert (r.score, r.reason, r.detail) == (-1.0, "timeout", "item ran past 1.5 s")
        assert time.monotonic() - t0 < 1.5 + 2.0
        assert p.score(response="<think>x</think> \\boxed{3}", gold="3").reason == "correct"


def _judge_module(folder, name: str, failure: str) -> None:
    """A judge module that imports in this process and fails in any other (a worker)."""
    (folder / f"{name}.py").write_text(textwrap.dedent(f"""
        import os, sys
        if os.environ.setdefault("{name.upper()}_PARENT", str(os.getpid())) != str(os.getpid()):
            {failure}
        from klear_lib.rewards.result import RewardResult
        def judge(**item):
            return RewardResult(1.0, "ok")
    """))


@pytest.mark.parametrize("failure, message", [
    ("import a_dependency_only_the_parent_has",
     "ModuleNotFoundError: No module named 'a_dependency_only_the_parent_has'"),
    ("sys.exit(0)", "SystemExit: 0"),  # a module that quits on import: pebble lost its tasks (440 s)
])
def test_judge_that_cannot_start_in_a_worker_fails_the_pool_at_once(tmp_path, monkeypatch, failure, message):
    name = f"judge_{abs(hash(failure)) % 10**6}"
    _judge_module(tmp_path, name, failure)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers get this process's sys.path
    judge = __import__(name).judge
    before = {c.pid for c in multiprocessing.active_children()}
    t0 = time.monotonic()
    with pytest.raises(WorkerStartError, match=f"score_fn {name}.judge could not start") as e:
        RewardPool(judge, workers=2, timeout_s=5.0)
    assert time.monotonic() - t0 < 10.0
    assert message in str(e.value) and f"{name}.py" in str(e.value)  # the worker's traceback, its last line
    assert {c.pid for c in multiprocessing.active_children()} - before == set()  # no worker left behind


def _failing_initializer():
    raise RuntimeError("warm-up failed")


def test_initializer_failure_and_unpicklable_judge_fail_at_construction():
    with pytest.raises(WorkerStartError, match="RuntimeError: warm-up failed"):
        RewardPool(behave, workers=1, initializer=_failing_initializer)
    with pytest.raises(TypeError, match="module-level function"):
        RewardPool(lambda **item: RewardResult(0.0, "x"), workers=1)


def test_group_key_grades_a_group_in_one_worker():
    """Consecutive items with the same gold are one task: one worker grades the group (and parses its gold once)."""
    items = [{"kind": "pid", "gold": f"g{g}"} for g in range(6) for _ in range(8)]
    items += [{"kind": "pid", "gold": "long"}] * 5  # longer than max_group=4: split in 4 + 1
    with RewardPool(behave, workers=2, timeout_s=POOL_TIMEOUT_S, group_key="gold", max_group=4, **FORK) as p:
        results = p.score_batch(items)
    assert [r.reason for r in results] == ["pid"] * len(items)
    for start in range(0, 48, 4):
        assert len({r.detail for r in results[start:start + 4]}) == 1  # one task, one worker


def test_a_hang_or_death_in_a_group_costs_only_its_own_item():
    """The limit is per item inside a group: the items before a hang keep their results, the ones after it are
    graded (together, by one worker) after the kill, and the batch takes one timeout, not a group's worth."""
    hangs = [{"kind": "echo", "value": 1}, {"kind": "sleep", "value": 60}] + [{"kind": "pid"}] * 8
    dies = [{"kind": "echo", "value": 3}, {"kind": "sigkill"}, {"kind": "raise", "value": 4},
            {"kind": "echo", "value": 5}]
    items = [dict(it, gold="a") for it in hangs] + [dict(it, gold="b") for it in dies]
    with RewardPool(behave, workers=2, timeout_s=1.0, group_key="gold", **FORK) as p:
        t0 = time.monotonic()
        results = p.score_batch(items)
        elapsed = time.monotonic() - t0
    assert [(r.score, r.reason) for r in results] == [(1.0, "echo"), (-1.0, "timeout")] + [(0.0, "pid")] * 8 + [
        (3.0, "echo"), (-1.0, "worker_died"), (-1.0, "error"), (5.0, "echo")]
    assert results[1].detail == "item ran past 1 s"
    assert len({r.detail for r in results[2:10]}) == 1  # the rest of group "a" went to one worker, as a group
    assert "ValueError: judge failed on 4" in results[12].detail
    # one timeout (1 s) plus a worker restart; the old per-group limit alone was 10 items x 1 s
    assert elapsed < 1.0 + 3.0


def _children() -> set[int]:
    """Live child processes of this process, from /proc, leaving out multiprocessing's resource tracker.

    The resource tracker is one helper per interpreter, started on first use of a spawn-context lock and kept
    until the interpreter exits; it is not a pool worker.
    """
    me, found = os.getpid(), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
        if ppid == me and b"resource_tracker" not in cmdline:
            found.add(int(pid))
    return found


def test_interrupted_batch_leaves_the_pool_usable_and_no_stale_result():
    """Ctrl-C during a batch: the workers still on it are replaced, so the next batch gets its own results."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    with RewardPool(behave, workers=2, timeout_s=30.0, **FORK) as p:
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(KeyboardInterrupt):
                p.score_batch([{"kind": "sleep", "value": 0.8}, {"kind": "sleep", "value": 0.8}])
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        time.sleep(0.8)  # long enough for the interrupted items to have finished, had their workers lived
        assert p.score_batch([{"kind": "echo", "value": 7}, {"kind": "echo", "value": 8}]) == [
            RewardResult(7.0, "echo"), RewardResult(8.0, "echo")]


def test_max_tasks_replaces_workers():
    with RewardPool(behave, workers=1, timeout_s=POOL_TIMEOUT_S, max_tasks=1, **FORK) as p:
        pids = [r.detail for r in p.score_batch([{"kind": "pid"}] * 3)]
    assert len(set(pids)) == 3


def test_pool_reasons_are_documented():
    assert set(POOL_REASONS) == {"timeout", "worker_died", "memory_exceeded", "invalid_score", "error"}


def test_no_worker_left_after_with():
    # other pools of this module (fixtures) may be open: look only at what this pool adds
    before, mp_before = _children(), {c.pid for c in multiprocessing.active_children()}
    with RewardPool(behave, workers=2, timeout_s=1.0, **FORK) as p:
        p.score_batch([{"kind": "echo", "value": 1}, {"kind": "sigkill"}, {"kind": "sleep", "value": 30}])
        assert len(_children() - before) >= 1  # the workers are there while the pool is open
    assert {c.pid for c in multiprocessing.active_children()} - mp_before == set()
    assert _children() - before == set()
    with pytest.raises(RuntimeError, match="closed"):
        p.score_batch([{"kind": "echo"}])


# ---------------------------------------------------------------------------------------------------------------
# TRL adapter: TRL calls f(prompts=..., completions=..., completion_ids=..., **dataset columns, trainer_state,
# log_extra, log_metric), completions being plain strings or lists of chat messages.
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def math_pool():
    with RewardPool(score_math, workers=2, timeout_s=POOL_TIMEOUT_S, group_key="gold") as p:
        yield p


def test_grouped_math_pool_gives_what_score_math_gives(math_pool):
    answers = ["\\boxed{3/4}", "$0.75$", "\\boxed{0.7}", "", "\\boxed{\\frac{1}{"]
    items = [{"response": f"<think>x</think> {a}", "gold": gold} for gold in ("3/4", "\\frac{3}{4}") for a in answers]
    items.append({"response": "<think>x", "gold": "1"})
    assert math_pool.score_batch(items) == [score_math(**it) for it in items]


TEXTS = ["<think>3/4 of it</think> $\\boxed{\\frac{3}{4}}$", "<think>hmm</think> \\boxed{2}",
         "no think at all \\boxed{5}"]
GOLDS = ["0.75", "3", "5"]


def _call_like_trl(func, completions, **extra):
    logged = {}
    scores = func(prompts=["q"] * len(completions), completions=completions, completion_ids=[[1]] * len(completions),
                  answer=GOLDS, trainer_state=None, log_extra=lambda col, vals: logged.setdefault(col, vals),
                  log_metric=lambda name, value: None, **extra)
    return scores, logged


def test_trl_adapter_conversational_and_plain(math_pool):
    f = make_trl_reward_func(math_pool, {"gold": "answer"}, "math_reward")
    assert f.__name__ == "math_reward"
    conversational = [[{"role": "assistant", "content": t}] for t in TEXTS]
    for completions in (conversational, TEXTS):
        scores, logged = _call_like_trl(f, completions)
        assert scores == [1.0, -1.0, -0.5]
        assert logged == {"math_reward_reason": ["correct", "wrong", "no_think_close"]}
    assert f.reason_counts == {"correct": 2, "wrong": 2, "no_think_close": 2}
    assert [r.reason for r in f.last_results] == ["correct", "wrong", "no_think_close"]


def test_trl_adapter_without_log_extra_and_with_options(math_pool):
    f = make_trl_reward_func(math_pool, {"gold": "answer"}, "math_paper", score_kwargs={"format_rule": "paper"})
    assert f(completions=TEXTS, answer=GOLDS) == [1.0, -1.0, -1.0]  # the paper rule: format failure → −1
    assert f.reason_counts["no_think_close"] == 1
    with pytest.raises(KeyError, match="answer"):
        f(completions=TEXTS, solution=GOLDS)


def test_trl_adapter_completion_prefix(math_pool):
    """A chat template that opens <think> in the prompt: the completion starts inside the thinking block."""
    completions = ["3/4 of it</think> $\\boxed{0.75}$"]
    plain = make_trl_reward_func(math_pool, {"gold": "answer"}, "plain")
    prefixed = make_trl_reward_func(math_pool, {"gold": "answer"}, "prefixed", completion_prefix="<think>")
    assert plain(completions=completions, answer=GOLDS[:1]) == [-2.0]  # released rule: no <think>
    assert prefixed(completions=completions, answer=GOLDS[:1]) == [1.0]


def test_completion_text():
    assert completion_text("plain") == "plain"
    msgs = [{"role": "assistant", "content": "a"}, {"role": "tool", "content": "t"},
            {"role": "assistant", "content": "b"}]
    assert completion_text(msgs) == "a\nb"
    # a response parser that moved the thinking out of `content` gets it back inside <think>...</think>
    assert completion_text([{"role": "assistant", "reasoning_content": "r", "content": "c"}]) == "<think>r</think>c"


def test_batches_from_several_threads_each_get_their_own_results(pool):
    """verl calls the reward from a thread pool: concurrent batches on one pool must not mix their results."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as threads:
        futures = [threads.submit(pool.score_batch, [{"kind": "echo", "value": 10 * t + i} for i in range(5)])
                   for t in range(8)]
        for t, fut in enumerate(futures):
            assert [r.score for r in fut.result()] == [float(10 * t + i) for i in range(5)]


# -- MemoPool: each distinct item judged once -------------------------------------------------------------------
class _CountingPool:
    """A stand-in pool: score = len(response), reason 'timeout' for responses starting with 't'."""

    def __init__(self):
        self.batches = []

    def score_batch(self, items):
        self.batches.append([dict(it) for it in items])
        return [RewardResult(float(len(it["response"])), "timeout" if it["response"].startswith("t") else "ok")
                for it in items]


def test_memo_pool_judges_each_distinct_item_once_and_keeps_order():
    from klear_lib.rewards.pool import MemoPool

    inner = _CountingPool()
    memo = MemoPool(inner)
    items = [{"response": "ab", "tests": [1]}, {"response": "abc", "tests": [1]}, {"tests": [1], "response": "ab"}]
    assert [r.score for r in memo.score_batch(items)] == [2.0, 3.0, 2.0]
    assert inner.batches == [[{"response": "ab", "tests": [1]}, {"response": "abc", "tests": [1]}]]  # dedup in batch
    assert [r.score for r in memo.score_batch([{"response": "abc", "tests": [1]}, {"response": "ab", "tests": [2]}])] \
        == [3.0, 2.0]
    assert inner.batches[-1] == [{"response": "ab", "tests": [2]}]  # other tests: another item
    assert (memo.judged, memo.hits) == (3, 2)


def test_memo_pool_does_not_keep_load_dependent_failures():
    from klear_lib.rewards.pool import MemoPool

    inner = _CountingPool()
    memo = MemoPool(inner)
    memo.score_batch([{"response": "tx"}])
    memo.score_batch([{"response": "tx"}])  # a timeout is judged again, never served from the memo
    assert len(inner.batches) == 2 and memo.judged == 2 and memo.hits == 0
    assert memo.score_batch([]) == [] and len(inner.batches) == 2  # nothing to judge: the pool is not called
