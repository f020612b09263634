"""How long RewardPool takes to turn each kind of judge failure into a score (or into an error, at start).

Scenarios (all with 2 workers):

* ``start``: a judge whose module fails to import in a worker process (ModuleNotFoundError; and one that calls
  ``sys.exit(0)`` on import), 5 items, ``timeout_s=5``: seconds until the pool says so.
* ``died``: one item whose judge calls ``os._exit(0)`` (and one that segfaults), ``timeout_s=3``: seconds until its
  result comes back, and the reason.
* ``hangs``: 100 items, 10 gold answers x 10 items, item 5 of each group sleeps 60 s, ``timeout_s=1``: seconds
  for the batch, grouped (``group_key="gold"``) and one item per task, and the reasons.
* ``memory``: one item that allocates 1 GiB in a worker capped at ``memory_mb=256``: seconds and reason.

Run: ``.venv/bin/python benchmarks/bench_pool_faults.py [--only start,died,hangs,memory]``.
"""

from __future__ import annotations

import argparse
import collections
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


def start(folder: Path) -> None:
    import importlib
    sys.path.insert(0, str(folder))
    for name, failure in (("bench_missing_dep", "import a_dependency_that_is_not_installed"),
                          ("bench_quits", "sys.exit(0)")):
        judge = importlib.import_module(_broken_module(folder, name, failure)).judge

        def run(judge=judge):
            with RewardPool(judge, workers=2, timeout_s=5.0) as pool:
                return pool.score_batch([{"x": i} for i in range(5)])
        dt, out = timed(run)
        print(f"start [{failure}]: {dt:.1f} s -> {reasons(out)}")


def died() -> None:
    with RewardPool(fault_judge, workers=2, timeout_s=3.0) as pool:
        for kind in ("exit0", "segfault"):
            dt, out = timed(lambda kind=kind: pool.score_batch([{"kind": kind}]))
            print(f"died [{kind}]: {dt:.2f} s -> {out[0].reason} ({out[0].detail})")


def hangs() -> None:
    items = [{"kind": "hang" if k == 5 else "ok", "gold": f"g{g}"} for g in range(10) for k in range(10)]
    for key in ("gold", None):
        with RewardPool(fault_judge, workers=2, timeout_s=1.0, group_key=key) as pool:
            dt, out = timed(lambda: pool.score_batch(items))
        print(f"hangs [group_key={key!r}]: {dt:.1f} s for 100 items, 10 hanging -> {reasons(out)}")


def memory() -> None:
    try:
        pool = RewardPool(fault_judge, workers=1, timeout_s=10.0, memory_mb=256)
    except TypeError as e:
        print(f"memory: no memory_mb option ({e})")
        return
    with pool:
        dt, out = timed(lambda: pool.score_batch([{"kind": "allocate"}, {"kind": "ok"}]))
    print(f"memory [1 GiB under memory_mb=256]: {dt:.2f} s -> {[(r.reason, r.detail[:60]) for r in out]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="start,died,hangs,memory")
    only = ap.parse_args().only.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("start", lambda: start(Path(tmp))), ("died", died), ("hangs", hangs), ("memory", memory)):
            if name in only:
                fn()


if __name__ == "__main__":
    main()
