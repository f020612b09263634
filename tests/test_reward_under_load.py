"""The math judge on a loaded machine (klear_lib/rewards/math.py, pool.py): its budget is CPU time, so a correct
answer never fails because the machine is busy, and the pool's wall-clock limit still ends an item that overruns.

The load: more busy processes than cores (`BUSY`), each bounded in time and killed when the test ends. The
pools are the trainer's (`klear_lib.train.launch`: score_math, spawned workers, grouped by gold)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

from klear_lib.rewards.math import score_math
from klear_lib.rewards.pool import RewardPool

BUSY = 2 * (os.cpu_count() or 1)  # busy processes: each core shared by at least three runnable ones
BUSY_MAX_S = 90.0  # each busy loop ends by itself after this, should the test be killed before its `finally`
SLOW_ANSWER = "<think>x</think> $\\boxed{9^{9^{9^{9}}}}$"  # math-verify's comparison of it never finishes (in C)


@contextlib.contextmanager
def busy_machine(n: int = BUSY):
    """`n` processes spinning on the CPU for the duration of the block (and never more than `BUSY_MAX_S`)."""
    spin = f"import time\nend = time.monotonic() + {BUSY_MAX_S}\nwhile time.monotonic() < end:\n    pass\n"
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", spin]))
        time.sleep(0.2)  # all of them running
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


# (answer after </think>, gold, reason): simple golds, each way round, and wrong answers
SIMPLE = [("\\boxed{7}", "7", "correct"), ("7", "7", "correct"), ("$0.5$", "\\frac{1}{2}", "correct"),
          ("$\\frac{1}{2}$", "0.5", "correct"), ("\\boxed{0.75}", "3/4", "correct"),
          ("$2\\sqrt{2}$", "\\sqrt{8}", "correct"), ("$1 + x$", "x+1", "correct"), ("\\boxed{8}", "7", "wrong"),
          ("$\\frac{1}{3}$", "0.5", "wrong")]


def test_simple_golds_score_right_on_a_loaded_machine():
    """Both cores loaded from before the pool starts (its workers' imports and first judgements included):
    every simple gold gives its verdict, none times out or fails the gold. The judge's budget here is 1 s of CPU,
    a fifth of the default, far above what these cost (tens of ms) but below their wall time under this load."""
    items = [{"response": f"<think>x</think> {answer}", "gold": gold, "timeout_s": 1.0}
             for answer, gold, _ in SIMPLE for _ in range(3)]
    want = [(reason, 1.0 if reason == "correct" else -1.0) for _, _, reason in SIMPLE for _ in range(3)]
    with busy_machine():
        with RewardPool(score_math, workers=2, timeout_s=10.0, group_key="gold") as pool:
            results = pool.score_batch(items)
    got = [(r.reason, r.score) for r in results]
    print(f"loaded ({BUSY} busy processes): {sum(r == w for r, w in zip(got, want))} of {len(got)} right")
    assert got == want, [(it["gold"], r) for it, r in zip(items, results) if (r.reason, r.score) not in want]


@pytest.mark.parametrize("grouped", [False, True], ids=["alone", "in_a_group"])
def test_an_item_that_overruns_is_ended_within_twice_its_limit_on_a_loaded_machine(grouped):
    """A judgement stuck in C (no signal reaches Python) with a judge budget above the pool's limit: only the
    pool's per-item limit ends it, within twice the limit on a loaded machine, and its reason names the item and
    the limit. Alone, pebble's limit acts; in a group, the layer's per-item limit."""
    limit = 3.0
    slow = {"response": SLOW_ANSWER, "gold": "3", "timeout_s": 600.0}
    fast = {"response": "<think>x</think> \\boxed{3}", "gold": "3"}
    items = [fast, slow, fast] if grouped else [slow]
    with RewardPool(score_math, workers=1, timeout_s=limit, group_key="gold" if grouped else None) as pool:
        assert pool.score(**fast).reason == "correct"  # warm: the timing below is the item's, not a start
        with busy_machine():
            t0 = time.monotonic()
            results = pool.score_batch(items)
            elapsed = time.monotonic() - t0
        k = items.index(slow)
        assert (results[k].score, results[k].reason) == (-1.0, "timeout")
        assert f"item {k} " in results[k].detail and f"past its limit of {limit:g} s" in results[k].detail
        assert [r.reason for i, r in enumerate(results) if i != k] == ["correct"] * (len(items) - 1)
        # the item's end: at most twice the limit after it started; the batch adds the other items, graded again
        # after it on a fresh worker (spawned: a second or two under this load), at most another limit
        ended = float(results[k].detail.rpartition("ended after ")[2].split(" s")[0])
        print(f"overrun {'in a group' if grouped else 'alone'}: {results[k].detail}; batch {elapsed:.1f} s")
        assert limit <= ended <= 2 * limit, results[k].detail
        assert elapsed <= (2 if not grouped else 4) * limit + 1.0, elapsed
