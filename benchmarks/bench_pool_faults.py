"""How long RewardPool takes to turn each kind of judge failure into a score (or into an error, at start).

Scenarios (all with 2 workers):

* ``start``: a judge whose module fails to import in a worker process (ModuleNotFoundError; and one that calls
  ``sys.exit(0)`` on import), 5 items, ``timeout_s=5``: seconds until the pool says so.
* ``died``: one item whose judge calls ``os._exit(0)`` (and one that segfaults), ``timeout_s=3``: seconds until its
  result comes back, and the reason.
* ``hangs``: 100 items, 10 gold answers x 10 items, item 5 of each group sleeps 60 s, ``timeout_s=1``: seconds
  for the batch, grouped (``group_key="gold"``) and one item per task, and the reasons.
* ``memory``: one item that allocates 1 GiB in a worker capped at ``memory_mb=256``: seconds and reason.

Headline figures, one ``RATIO <name> <value> TARGET <op> <number>`` line each: the seconds a failure took as a
fraction of the limit that would decide it otherwise (``start_*``, ``died_*``, ``memory``: of ``timeout_s``,
target <= 0.5: the pool says so well before the item's limit), and a batch with hangs against its ideal,
``hangs x timeout_s / workers`` (target <= 1.6: 1.06 with the pool's own worker processes, 5.3 s for 5.0 s; the
target is 1.5 times that). A scenario whose outcome is wrong (another reason, no error) prints ``inf``.
``--quick``: the hangs batch shrinks to 4 groups of 5 items (2 s ideal); the rest is the same (seconds in all).

Run: ``.venv/bin/python benchmarks/bench_pool_faults.py [--only start,died,hangs,memory] [--quick]``.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from klear_lib.rewards.pool import RewardPool
from klear_lib.rewards.result import RewardResult


def fault_judge(kind: str, gold: str = "", **_) -> RewardResult:
    """A judge that fails on request; module-level so that spawned workers can import it."""
    if kind == "hang":
        time.sleep(60)
    elif kind == "exit0":
        os._exit(0)
    elif kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "allocate":
        return RewardResult(float(len(bytearray(1 << 30))), "allocated")
    return RewardResult(1.0, "ok")


def _broken_module(folder: Path, name: str, failure: str) -> str:
    """A judge module that imports in this process and fails in any other (a worker)."""
    (folder / f"{name}.py").write_text(textwrap.dedent(f"""
        import os, sys
        if os.environ.setdefault("BENCH_PARENT_PID", str(os.getpid())) != str(os.getpid()):
            {failure}
        from klear_lib.rewards.result import RewardResult
        def judge(**item):
            return RewardResult(1.0, "ok")
    """))
    return name


def timed(fn):
    t0 = time.monotonic()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - what the pool raised is the measurement
        out = f"raised {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    return time.monotonic() - t0, out


def reasons(results) -> dict:
    return dict(collections.Counter(r.reason for r in results)) if isinstance(results, list) else results


def ratio(name: str, value: float, op: str, target: float) -> None:
    print(f"RATIO {name} {value:.3f} TARGET {op} {target:g}")


def start(folder: Path, quick: bool) -> None:
    import importlib
    sys.path.insert(0, str(folder))
    for name, failure in (("bench_missing_dep", "import a_dependency_that_is_not_installed"),
                          ("bench_quits", "sys.exit(0)")):
        judge = importlib.import_module(_broken_module(folder, name, failure)).judge

        def run(judge=judge):
            with RewardPool(judge, workers=2, timeout_s=5.0) as pool:
                return pool.score_batch([{"x": i} for i in range(5)])
        dt, out = timed(run)
        print(f"start [{failure}]: {dt:.2f} s -> {reasons(out)}")
        right = isinstance(out, str) and out.startswith("raised WorkerStartError")
        ratio(f"{name.removeprefix('bench_')}_start_vs_timeout", dt / 5.0 if right else math.inf, "<=", 0.5)


def died(quick: bool) -> None:
    with RewardPool(fault_judge, workers=2, timeout_s=3.0) as pool:
        pool.score_batch([{"kind": "ok"}] * 4)  # the workers are up: what is timed is the death, not a start
        for kind in ("exit0", "segfault"):
            dt, out = timed(lambda kind=kind: pool.score_batch([{"kind": kind}]))
            print(f"died [{kind}]: {dt:.2f} s -> {out[0].reason} ({out[0].detail})")
            ratio(f"died_{kind}_vs_timeout", dt / 3.0 if out[0].reason == "worker_died" else math.inf, "<=", 0.5)


def hangs(quick: bool) -> None:
    groups, size = (4, 5) if quick else (10, 10)
    items = [{"kind": "hang" if k == size // 2 else "ok", "gold": f"g{g}"} for g in range(groups) for k in range(size)]
    ideal = groups * 1.0 / 2  # one hang per group, timeout_s=1, 2 workers
    for key in ("gold", None):
        with RewardPool(fault_judge, workers=2, timeout_s=1.0, group_key=key) as pool:
            pool.score_batch([{"kind": "ok"}] * 4)  # the workers are up
            dt, out = timed(lambda: pool.score_batch(items))
        print(f"hangs [group_key={key!r}]: {dt:.1f} s for {len(items)} items, {groups} hanging -> {reasons(out)}")
        right = reasons(out) == {"ok": len(items) - groups, "timeout": groups} and all(
            (r.reason == "timeout") == (it["kind"] == "hang") for r, it in zip(out, items))
        ratio(f"hangs_{'grouped' if key else 'per_item'}_vs_ideal", dt / ideal if right else math.inf, "<=", 1.6)


def memory(quick: bool) -> None:
    try:
        pool = RewardPool(fault_judge, workers=1, timeout_s=10.0, memory_mb=256)
    except TypeError as e:
        print(f"memory: no memory_mb option ({e})")
        return
    with pool:
        pool.score_batch([{"kind": "ok"}])  # the worker is up
        dt, out = timed(lambda: pool.score_batch([{"kind": "allocate"}, {"kind": "ok"}]))
    print(f"memory [1 GiB under memory_mb=256]: {dt:.2f} s -> {[(r.reason, r.detail[:60]) for r in out]}")
    right = [r.reason for r in out] == ["memory_exceeded", "ok"]
    ratio("memory_exceeded_vs_timeout", dt / 10.0 if right else math.inf, "<=", 0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="start,died,hangs,memory")
    ap.add_argument("--quick", action="store_true", help="a smaller hangs batch: a check that the script runs")
    args = ap.parse_args()
    only = args.only.split(",")
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("start", lambda quick: start(Path(tmp), quick)), ("died", died), ("hangs", hangs),
                         ("memory", memory)):
            if name in only:
                fn(args.quick)
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
