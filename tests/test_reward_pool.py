"""The reward manager (klear_lib/rewards/pool.py, pebble's ProcessPool under a thin layer): order, timeouts, dead
workers, exits pebble does not report, lost tasks and the batch deadline, a broken pebble pool, invalid scores,
memory, start failures, groups, cleanup, the TRL adapter."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import shutil
import signal
import sys
import textwrap
import time
import types

import numpy as np
import pytest

from klear_lib.rewards import pool as pool_module
from klear_lib.rewards.math import score_math
from klear_lib.rewards.pool import POOL_REASONS, RewardPool, WorkerStartError
from klear_lib.rewards.pool_wrappers import MemoPool, completion_text, make_trl_reward_func
from klear_lib.rewards.result import RewardResult

POOL_TIMEOUT_S = 3.0
# Pools that test the pool's own logic fork their workers (≈10 ms) instead of spawning them (≈1 s, the default,
# exercised by the module's shared pools and by the start-failure tests, where a fresh interpreter is the point).
FORK = {"start_method": "fork"}
SLOW_ANSWER = "<think>x</think> $\\boxed{9^{9^{9^{9}}}}$"  # math-verify's comparison of it never finishes
# Time bounds below are far above what a quiet machine needs (a few tenths of a second) and far below what the
# failure they guard against would take (a 60 s sleep, a group's whole limit, pebble's 3 s SIGTERM grace).


def behave(kind: str, value: float = 0.0, **kwargs) -> RewardResult:
    """A judge that misbehaves on request; module-level so that spawned workers can import it."""
    if kind == "echo":
        return RewardResult(float(value), "echo")
    if kind == "sleep":
        time.sleep(value)
        return RewardResult(0.0, "slept", detail=str(os.getpid()))
    if kind == "exit":
        os._exit(1)
    if kind == "exit0":  # an early exit that reports success: pebble does not notice it
        os._exit(0)
    if kind == "sys_exit":
        sys.exit(3)
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
    if kind == "sigterm":  # what SIGTERM does while a judge runs
        return RewardResult(0.0, "sigterm", detail=str(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL))
    if kind == "busy_in_c":  # one C call that never checks for signals: no Python signal handler runs meanwhile
        return RewardResult(float(sum(range(10**14))), "summed")
    raise AssertionError(kind)


class EndsTheReceiver:
    """An item value whose unpickling ends the process that receives it: the worker dies while taking the task
    from pebble's pipe, before acknowledging it. ``how``: "sys_exit" raises SystemExit(0) (pebble's channel lock
    is released on the way out), "os_exit" ends the process holding the lock."""

    def __init__(self, how: str):
        self.how = how

    def __reduce__(self):
        return (sys.exit, (0,)) if self.how == "sys_exit" else (os._exit, (0,))


@pytest.fixture(scope="module")
def pool():
    with RewardPool(behave, workers=2, timeout_s=POOL_TIMEOUT_S) as p:
        p.score_batch([{"kind": "echo"}] * 4)  # the spawned workers are up before any test times anything
        yield p


def _worker(pid: int) -> multiprocessing.Process:
    """This process's multiprocessing child with that pid (a pebble worker)."""
    (proc,) = [c for c in multiprocessing.active_children() if c.pid == pid]
    return proc


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


def test_timeout_is_a_score_and_the_worker_is_replaced():
    with RewardPool(behave, workers=1, timeout_s=1.0, **FORK) as p:
        t0 = time.monotonic()
        before, hung, after = p.score_batch([{"kind": "pid"}, {"kind": "sleep", "value": 60}, {"kind": "pid"}])
        elapsed = time.monotonic() - t0
    assert (hung.score, hung.reason) == (-1.0, "timeout")
    assert hung.detail.startswith("item 1 ran past its limit of 1 s (wall time); its worker was killed; ended after")
    assert 1.0 <= float(hung.detail.rpartition(" after ")[2].removesuffix(" s")) <= 2.0  # within twice the limit
    assert (before.reason, after.reason) == ("pid", "pid")
    assert before.detail != after.detail  # the hung worker was killed; a new process graded the next item
    assert elapsed < 30.0  # not the 60 s sleep


@pytest.mark.parametrize("kind, how", [("exit", "exit status 1"), ("sigkill", "killed by SIGKILL"),
                                       ("segfault", "killed by SIGSEGV")])
def test_dead_worker_is_worker_died_and_the_pool_recovers(pool, kind, how):
    """pebble reports these deaths itself (ProcessExpired), with the exit status: when the process ends, not when
    the item's limit runs out (that would be "timeout")."""
    (r,) = pool.score_batch([{"kind": kind}])
    assert r == RewardResult(-1.0, "worker_died", detail=f"the worker process ended while grading ({how})")
    # the dead worker was replaced: the next batch on the same pool is scored normally
    again = pool.score_batch([{"kind": "echo", "value": v} for v in range(4)])
    assert [r.score for r in again] == [0.0, 1.0, 2.0, 3.0]


def test_exit_status_0_while_grading_is_worker_died_not_a_timeout():
    """pebble ignores a worker that exits with status 0 (its item would wait for its timeout and come back as
    one); the layer sees the process gone from the progress file and says so, long before the 60 s limit."""
    with RewardPool(behave, workers=2, timeout_s=60.0, group_key="gold", **FORK) as p:
        t0 = time.monotonic()
        alone, *group = p.score_batch([{"kind": "exit0"}] + [dict(it, gold="g") for it in (
            {"kind": "echo", "value": 1}, {"kind": "exit0"}, {"kind": "echo", "value": 2})])
        elapsed = time.monotonic() - t0
    died = RewardResult(-1.0, "worker_died", detail="the worker process ended while grading (exit status 0)")
    assert alone == died
    assert group == [RewardResult(1.0, "echo"), died, RewardResult(2.0, "echo")]  # in a group: that item only
    assert elapsed < 20.0


def test_sys_exit_in_the_judge_is_an_error_of_that_item(pool):
    (r,) = pool.score_batch([{"kind": "sys_exit"}])
    assert r == RewardResult(-1.0, "error", detail="SystemExit: 3")


def test_a_task_lost_by_pebble_is_worker_died():
    """A worker that ends while taking a task (before acknowledging it) loses the task in pebble: it never
    starts, so no timeout runs. Tasks are taken in order: once a later one has started, the lost one is known."""
    with RewardPool(behave, workers=2, timeout_s=30.0, **FORK) as p:
        t0 = time.monotonic()
        results = p.score_batch([{"kind": "echo", "value": 1}, {"kind": "echo", "value": EndsTheReceiver("sys_exit")},
                                 {"kind": "echo", "value": 2}, {"kind": "echo", "value": 3}])
        elapsed = time.monotonic() - t0
        assert p.score(kind="echo", value=4) == RewardResult(4.0, "echo")
    assert results == [RewardResult(1.0, "echo"), RewardResult(-1.0, "worker_died", detail=(
        "pebble lost the task: the worker that took it ended before starting it")), RewardResult(2.0, "echo"),
        RewardResult(3.0, "echo")]
    assert elapsed < p.batch_deadline_s(4) / 2  # found by the order rule, not by the deadline (62 s)


def test_the_batch_deadline_bounds_a_lost_task_nothing_reveals():
    """A lost task with no later task to reveal it: the batch deadline ends the batch and says so."""
    with RewardPool(behave, workers=2, timeout_s=1.0, start_timeout_s=2.0, **FORK) as p:
        deadline_s = p.batch_deadline_s(2)
        assert deadline_s == 2.0 + 2 * 1.0 * 1  # start allowance + two limits per item, per worker
        t0 = time.monotonic()
        results = p.score_batch([{"kind": "echo", "value": 1}, {"kind": "echo", "value": EndsTheReceiver("sys_exit")}])
        elapsed = time.monotonic() - t0
        again = p.score_batch([{"kind": "echo", "value": v} for v in range(3)])
    assert results == [RewardResult(1.0, "echo"), RewardResult(-1.0, "timeout", detail=(
        f"no result by the batch deadline ({deadline_s:g} s): pebble lost the task or stalled"))]
    assert deadline_s <= elapsed < deadline_s + 10.0
    assert [r.score for r in again] == [0.0, 1.0, 2.0]


def test_the_batch_deadline_bounds_a_worker_that_died_holding_pebbles_lock():
    """A worker that ends while taking a task, holding pebble's channel lock: no other worker can take a task or
    send a result for 60 s (pebble's lock timeout). The batch deadline ends the batch, every item without a
    result is "timeout", and the next batch runs on a rebuilt pebble pool."""
    with RewardPool(behave, workers=2, timeout_s=1.0, start_timeout_s=2.0, **FORK) as p:
        deadline_s = p.batch_deadline_s(3)
        assert deadline_s == 2.0 + 2 * 1.0 * 2
        t0 = time.monotonic()
        results = p.score_batch([{"kind": "echo", "value": EndsTheReceiver("os_exit")},
                                 {"kind": "echo", "value": 1}, {"kind": "echo", "value": 2}])
        elapsed = time.monotonic() - t0
        t1 = time.monotonic()
        again = p.score_batch([{"kind": "echo", "value": v} for v in range(3)])
        again_s = time.monotonic() - t1
    timeout = RewardResult(-1.0, "timeout", detail=f"no result by the batch deadline ({deadline_s:g} s): pebble "
                                                   f"lost the task or stalled")
    assert results == [timeout] * 3
    assert deadline_s <= elapsed < deadline_s + 10.0  # not pebble's 60 s lock timeout, nor forever
    assert [r.score for r in again] == [0.0, 1.0, 2.0] and again_s < 30.0  # a new pool, not the wedged one


def test_an_idle_worker_killed_between_batches_does_not_break_the_pool():
    """pebble fails its pool for good ("All workers expired") when a worker dies while no task runs (the OOM
    killer taking an idle worker): the layer rebuilds it and grades the batch."""
    with RewardPool(behave, workers=1, timeout_s=POOL_TIMEOUT_S, **FORK) as p:
        (first,) = p.score_batch([{"kind": "pid"}])
        os.kill(int(first.detail), signal.SIGKILL)
        time.sleep(0.5)  # pebble's manager loop (every 0.1 s) sees the death and marks its pool broken
        assert not p._pool.active  # what pebble does with it: the pool refuses every task from now on
        results = p.score_batch([{"kind": "echo", "value": v} for v in range(3)] + [{"kind": "pid"}])
    assert [r.reason for r in results] == ["echo"] * 3 + ["pid"] and [r.score for r in results[:3]] == [0, 1, 2]
    assert results[3].detail != first.detail


def test_a_judge_stuck_in_c_is_killed_at_once():
    """pebble stops a worker with SIGTERM, whose Python handler cannot run inside a long C call; it would wait
    3 s before SIGKILL, holding the lock every worker needs. During a judgement SIGTERM has its default action."""
    with RewardPool(behave, workers=1, timeout_s=1.0, **FORK) as p:
        pid_result, disposition = p.score_batch([{"kind": "pid"}, {"kind": "sigterm"}])
        assert disposition.detail == "True"
        worker = _worker(int(pid_result.detail))
        (r,) = p.score_batch([{"kind": "busy_in_c"}])
        assert (r.score, r.reason) == (-1.0, "timeout") and r.detail.startswith("item 0 ran past its limit of 1 s")
        assert worker.exitcode == -signal.SIGTERM  # ended by SIGTERM itself, not by the SIGKILL 3 s later


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
    """memory_mb is address space on top of what the worker holds once started (RLIMIT_AS, set by the
    initializer pebble runs in each worker)."""
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


def test_an_item_that_does_not_pickle_is_an_error_of_that_item():
    """pebble cannot send it (a lock, here); in a group the layer finds which item, one per task."""
    import threading

    with RewardPool(behave, workers=1, timeout_s=POOL_TIMEOUT_S, group_key="gold", **FORK) as p:
        results = p.score_batch([{"kind": "echo", "value": 1, "gold": "a"}, {"kind": "echo", "value": threading.Lock(),
                                                                             "gold": "a"}])
    assert results[0] == RewardResult(1.0, "echo")
    assert (results[1].reason, results[1].score) == ("error", -1.0)
    assert results[1].detail.startswith("item or result could not be sent: TypeError") and "lock" in results[1].detail


def test_math_verify_timeouts_fire_inside_workers():
    """score_math's own CPU-time budget (SIGPROF) fires in the worker, while verifying, before the pool's limit.

    Under load the old version of this test saw the budget (1 s) spent while the worker was still parsing: its
    first math-verify call also pays math-verify's warm-up. Here the worker is warmed up first, and the budget
    (3 s) is about 200 times what parsing this answer costs (≈15 ms of CPU), the pool's limit 10 times the budget."""
    with RewardPool(score_math, workers=1, timeout_s=30.0) as p:
        assert p.score(response="<think>x</think> $\\boxed{9^{2}}$", gold="81").reason == "correct"  # warm-up
        slow, fast = p.score_batch([{"response": SLOW_ANSWER, "gold": "3", "timeout_s": 3.0},
                                    {"response": "<think>x</think> \\boxed{3}", "gold": "3"}])
    assert slow == RewardResult(-1.0, "timeout", detail="verifying the answer (more than 3 s of CPU time)")
    assert fast.reason == "correct"


def test_pool_timeout_backs_up_a_slow_judge():
    """A judge budget above the pool's limit: the pool kills the worker and says so."""
    with RewardPool(score_math, workers=1, timeout_s=1.5, **FORK) as p:
        t0 = time.monotonic()
        (r,) = p.score_batch([{"response": SLOW_ANSWER, "gold": "3", "timeout_s": 60.0}])
        assert (r.score, r.reason) == (-1.0, "timeout") and r.detail.startswith("item 0 ran past its limit of 1.5 s")
        assert time.monotonic() - t0 < 30.0  # not the judge's 60 s
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


TRACEBACK = "; the worker's error:\nTraceback (most recent call last):"


@pytest.mark.parametrize("failure, message, last_line", [
    ("import a_dependency_only_the_parent_has", TRACEBACK,
     "ModuleNotFoundError: No module named 'a_dependency_only_the_parent_has'"),
    ("sys.exit(0)", TRACEBACK, "SystemExit: 0"),  # a module that quits on import: pebble lost its tasks (440 s)
    ("os._exit(3)", ": the process ended (exit status 3) before it could load the judge", None),
])
def test_judge_that_cannot_start_in_a_worker_fails_the_pool_at_once(tmp_path, monkeypatch, failure, message,
                                                                    last_line):
    name = f"judge_{abs(hash(failure)) % 10**6}"
    _judge_module(tmp_path, name, failure)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers get this process's sys.path
    judge = __import__(name).judge
    before = {c.pid for c in multiprocessing.active_children()}
    t0 = time.monotonic()
    with pytest.raises(WorkerStartError) as e:
        RewardPool(judge, workers=2, timeout_s=5.0)
    assert time.monotonic() - t0 < 30.0
    text = str(e.value)
    assert text.startswith(f"score_fn {name}.judge could not start in a worker process (start_method 'spawn')")
    assert message in text
    if last_line:  # the worker's traceback, through the failing line of the module
        assert f"{name}.py" in text and text.rstrip().endswith(last_line)
    assert {c.pid for c in multiprocessing.active_children()} - before == set()  # no process left behind


def _failing_initializer():
    raise RuntimeError("warm-up failed")


def test_initializer_failure_and_unpicklable_judge_fail_at_construction():
    with pytest.raises(WorkerStartError, match="RuntimeError: warm-up failed"):
        RewardPool(behave, workers=1, initializer=_failing_initializer)
    with pytest.raises(TypeError, match="module-level function"):
        RewardPool(lambda **item: RewardResult(0.0, "x"), workers=1)


def test_group_key_grades_a_group_in_one_worker_with_a_limit_per_item():
    """Consecutive items with the same gold are one task: one worker grades the group (and parses its gold once).
    The limit is per item: five items of 0.3 s each (1.5 s) pass under timeout_s=1."""
    items = [{"kind": "pid", "gold": f"g{g}"} for g in range(6) for _ in range(8)]
    items += [{"kind": "pid", "gold": "long"}] * 5  # longer than max_group=4: split in 4 + 1
    slow = [{"kind": "sleep", "value": 0.3, "gold": "slow"}] * 4
    with RewardPool(behave, workers=2, timeout_s=1.0, group_key="gold", max_group=4, **FORK) as p:
        results = p.score_batch(items)
        slept = p.score_batch(slow)
    assert [r.reason for r in results] == ["pid"] * len(items)
    for start in range(0, 48, 4):
        assert len({r.detail for r in results[start:start + 4]}) == 1  # one task, one worker
    assert [r.reason for r in slept] == ["slept"] * 4 and len({r.detail for r in slept}) == 1


def test_a_hang_or_death_in_a_group_costs_only_its_own_item():
    """The limit is per item inside a group: the hung item is "timeout" after timeout_s, and the group's other
    items are graded again one per task; the batch takes one timeout, not the group's 16 x 1 s."""
    hangs = [{"kind": "echo", "value": 1}, {"kind": "sleep", "value": 60}] + [{"kind": "pid"}] * 14
    dies = [{"kind": "echo", "value": 3}, {"kind": "sigkill"}, {"kind": "raise", "value": 4},
            {"kind": "echo", "value": 5}]
    items = [dict(it, gold="a") for it in hangs] + [dict(it, gold="b") for it in dies]
    with RewardPool(behave, workers=2, timeout_s=1.0, group_key="gold", **FORK) as p:
        t0 = time.monotonic()
        results = p.score_batch(items)
        elapsed = time.monotonic() - t0
    assert [(r.score, r.reason) for r in results] == [(1.0, "echo"), (-1.0, "timeout")] + [(0.0, "pid")] * 14 + [
        (3.0, "echo"), (-1.0, "worker_died"), (-1.0, "error"), (5.0, "echo")]
    assert results[1].detail.startswith("item 1 ran past its limit of 1 s (wall time); its worker was killed; ended")
    assert results[17].detail == "the worker process ended while grading (killed by SIGKILL)"
    assert "ValueError: judge failed on 4" in results[18].detail
    assert elapsed < 8.0  # pebble's own limit for the group task alone would be 16 s


def test_without_a_progress_file_a_failed_group_is_graded_again_item_by_item(monkeypatch):
    """No space for the progress file: the workers write nowhere, a group's hang is found by pebble's limit on
    the whole task (3 items x 1 s), and the group is graded again one item per task: the hang still costs only
    its own item."""

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(pool_module.tempfile, "mkstemp", no_space)
    items = [dict(it, gold="a") for it in ({"kind": "echo", "value": 1}, {"kind": "sleep", "value": 60},
                                           {"kind": "echo", "value": 2})]
    with RewardPool(behave, workers=2, timeout_s=1.0, group_key="gold", **FORK) as p:
        t0 = time.monotonic()
        results = p.score_batch(items)
        elapsed = time.monotonic() - t0
    assert results == [RewardResult(1.0, "echo"), RewardResult(-1.0, "timeout", detail="item 1 ran past its limit "
                       "of 1 s (wall time); its worker was killed"), RewardResult(2.0, "echo")]  # no file: no start
    assert 3.0 + 1.0 <= elapsed < 30.0  # the group's limit, then the hung item's own


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
    """Ctrl-C during a batch: its tasks are cancelled (pebble kills their workers), so the next batch gets its
    own results."""
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


def test_worker_pids_are_the_live_workers_and_follow_a_replacement():
    with RewardPool(behave, workers=2, timeout_s=1.0, **FORK) as p:
        first = p.worker_pids()
        assert len(first) == 2 and first <= _children()
        graded = {int(r.detail) for r in p.score_batch([{"kind": "pid"}] * 4)}
        assert graded <= first  # the items ran in the workers named
        p.score_batch([{"kind": "sleep", "value": 60}])  # the worker that took it is killed at the 1 s limit
        deadline = time.monotonic() + 10.0  # pebble's manager thread starts the replacement on its next turn
        while len(second := p.worker_pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(second) == 2 and len(first & second) == 1 and second <= _children()
    assert p.worker_pids() == set()


def test_max_tasks_replaces_workers():
    with RewardPool(behave, workers=1, timeout_s=POOL_TIMEOUT_S, max_tasks=1, **FORK) as p:
        pids = [r.detail for r in p.score_batch([{"kind": "pid"}] * 3)]
    assert len(set(pids)) == 3
    with RewardPool(behave, workers=1, timeout_s=POOL_TIMEOUT_S, max_tasks=2, **FORK) as p:
        pids = [r.detail for r in p.score_batch([{"kind": "pid"}] * 4)]
    assert pids[0] == pids[1] != pids[2] == pids[3]  # a worker exiting after max_tasks is not a death


def test_pool_reasons_are_documented():
    assert set(POOL_REASONS) == {"timeout", "worker_died", "memory_exceeded", "invalid_score", "data_error", "error"}


def test_no_worker_nor_progress_file_left_after_with(monkeypatch):
    # other pools may be open (this module's fixtures; beside the unit tests, make test runs notebooks whose pools
    # make progress files of their own): look only at what this pool adds, its children and the files it made
    made = []
    real_init = pool_module._Progress.__init__

    def recording_init(self):
        real_init(self)
        made.append(self.path)

    monkeypatch.setattr(pool_module._Progress, "__init__", recording_init)
    before, mp_before = _children(), {c.pid for c in multiprocessing.active_children()}
    with RewardPool(behave, workers=2, timeout_s=1.0, **FORK) as p:
        p.score_batch([{"kind": "echo", "value": 1}, {"kind": "sigkill"}, {"kind": "sleep", "value": 30},
                       {"kind": "exit0"}])
        assert len(_children() - before) >= 1  # the workers are there while the pool is open
    assert {c.pid for c in multiprocessing.active_children()} - mp_before == set()
    assert _children() - before == set()
    assert made and [f for f in made if f != os.devnull and os.path.exists(f)] == []
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
    inner = _CountingPool()
    memo = MemoPool(inner)
    memo.score_batch([{"response": "tx"}])
    memo.score_batch([{"response": "tx"}])  # a timeout is judged again, never served from the memo
    assert len(inner.batches) == 2 and memo.judged == 2 and memo.hits == 0
    assert memo.score_batch([]) == [] and len(inner.batches) == 2  # nothing to judge: the pool is not called


def test_memo_keys_of_integers_past_the_decimal_conversion_limit():
    """json.dumps raises on an int of more than 4,300 digits: the memo's key must not, and must tell such
    integers apart."""
    big = 7 ** 6000  # 5,071 digits
    k1 = MemoPool.key({"tests": [{"expected": big}], "response": "x"})
    k2 = MemoPool.key({"tests": [{"expected": big + 1}], "response": "x"})
    assert k1 != k2 and MemoPool.key({"tests": [{"expected": 5}]}) == '{s"tests":[{s"expected":i5;}]}'


def _middle_differs() -> tuple[int, int]:
    """Two 4,500-digit integers that differ only in their 2,250th digit (the old key showed 12 + 6 digits)."""
    a = int("9" + "1234567890" * 449 + "123456789")
    b = a + 10 ** 2250
    assert len(str(a)) == len(str(b)) == 4500 and str(a)[:2000] == str(b)[:2000] and str(a)[-2000:] == str(b)[-2000:]
    return a, b


def test_memo_keys_hold_every_digit_and_every_type_and_never_raise():
    from klear_lib.rewards.code import parse_tests

    with _no_int_limit():
        a, b = _middle_differs()
        ta, tb = (parse_tests('[{"fn_name": "f", "args": [], "expected": %d}]' % n) for n in (a, b))
    assert type(ta[0]["expected"]).__name__ == "LongInt"  # as a record's ground truth arrives
    assert MemoPool.key({"tests": ta}) != MemoPool.key({"tests": tb})
    assert MemoPool.key({"v": a}) != MemoPool.key({"v": b})  # plain ints past the limit too
    # Types stay apart, and mixed dict keys neither raise nor merge.
    keys = [MemoPool.key({"v": v}) for v in (1, 1.0, True, "1", [1], (1,), None, {1: 2}, {"1": 2})]
    assert len(set(keys)) == len(keys) - 1 and keys[4] == keys[5]  # a tuple is the list it arrives as
    assert MemoPool.key({"args": {1: "x", "1": "y"}}) != MemoPool.key({"args": {1: "y", "1": "x"}})
    assert MemoPool.key({"a": 1, "b": 2}) == MemoPool.key({"b": 2, "a": 1})
    # A string cannot impersonate the punctuation of a structure.
    assert MemoPool.key({"v": ["a", "b"]}) != MemoPool.key({"v": ['a",s"b']})
    assert MemoPool.key({"v": object()}) is None  # no exact text: judged every time, never memoised


@contextlib.contextmanager
def _no_int_limit():
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(old)


class _InlineCodePool:
    """score_code in this process: MemoPool's pool for a test that needs no worker processes."""

    def __init__(self):
        self.judged = 0

    def score_batch(self, items):
        from klear_lib.rewards.code import score_code

        self.judged += len(items)
        return [score_code(**it) for it in items]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_two_huge_answers_that_differ_in_the_middle_are_judged_apart_through_the_units_wiring():
    """Before, both problems' tests had one memo key (a LongInt written as its first 12 and last 6 digits): the
    right answer to the first problem scored 1.0 on the second."""
    from klear_lib.rewards.code import parse_tests

    with _no_int_limit():
        a, b = _middle_differs()
        tests = {n: parse_tests('[{"fn_name": "f", "args": [], "expected": %d}]' % n) for n in (a, b)}
        response = f"<think>x</think>```python\ndef f():\n    return int('{a}')\n```"
    inner = _InlineCodePool()
    reward = make_trl_reward_func(MemoPool(inner), {"tests": "tests"}, "code_soft", score_kwargs={"mode": "soft"})
    assert reward([response, response], tests=[tests[a], tests[b]]) == [1.0, 0.0]
    assert inner.judged == 2 and reward([response], tests=[tests[b]]) == [0.0]  # the memo keeps each apart


def test_a_task_acknowledged_after_a_later_one_is_not_taken_for_lost():
    """Two workers take tasks k and k+1 and acknowledge them in either order; on a loaded machine the second
    acknowledgement can come seconds later. A task not yet running while a later one runs is lost only after
    the grace period (the layer's watch, driven with fake futures and a fake clock)."""
    from klear_lib.rewards import pool as pool_mod

    class Future:
        def __init__(self, running):
            self._running, self.cancelled = running, False

        def done(self):
            return False

        def running(self):
            return self._running

        def cancel(self):
            self.cancelled = not self._running
            return self.cancelled

    batch = pool_mod._Batch.__new__(pool_mod._Batch)
    batch.owner = types.SimpleNamespace(failure_score=-1.0, timeout_s=30.0)
    batch.results, batch.last_started = [None, None], -1
    batch.current = lambda task: None  # nothing in the progress file yet
    slow, later = pool_mod._Task([0], 0, Future(False)), pool_mod._Task([1], 1, Future(True))
    batch.tasks = {0: slow, 1: later}
    batch.watch([], now=100.0)
    batch.watch([], now=100.0 + pool_mod._LOST_GRACE_S / 2)
    assert batch.results == [None, None] and not slow.future.cancelled  # late, not lost
    batch.watch([], now=100.0 + pool_mod._LOST_GRACE_S + 0.1)
    assert slow.future.cancelled and batch.results[0].reason == "worker_died" and batch.results[1] is None


def test_a_code_problem_with_malformed_tests_is_a_data_error_through_the_pool_and_the_trl_adapter():
    """score_code refuses a problem whose tests are malformed (rewards.result.DataError); the pool gives that item
    reason 'data_error' (not 'error', which is the judge's own failure), and the TRL adapter keeps it in
    ``last_results``, where KlearGRPOTrainer refuses the batch (tests/test_rl_trainer.py). A well-formed problem
    beside it is judged as usual."""
    from klear_lib.rewards.code import score_code
    from klear_lib.rewards.pool_wrappers import make_trl_reward_func
    from klear_lib.rewards.result import DATA_ERROR

    good = [{"input": "1 2\n", "output": "3\n"}]
    bad = [{"input": "1 2\n"}]  # no expected output
    program = "<think>add</think>```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    with RewardPool(score_code, workers=1, timeout_s=POOL_TIMEOUT_S, **FORK) as pool:
        results = pool.score_batch([{"response": program, "tests": good}, {"response": program, "tests": bad}])
        assert results[0].score == 1.0 and results[0].reason == "all_passed"
        assert results[1].reason == DATA_ERROR and "unknown test format" in results[1].detail
        reward = make_trl_reward_func(pool, {"tests": "tests"}, name="code")
        assert reward([program, program], tests=[good, bad]) == [1.0, pool.failure_score]
        assert [r.reason for r in reward.last_results] == ["all_passed", DATA_ERROR]
