"""Math grading throughput: ``RewardPool(score_math, workers=2)`` against ``score_math`` called in a loop.

Same items, same machine, same run. The items stand in for a GRPO rollout batch: groups of 8 responses share a
gold answer; responses are unique (a short thinking part, then an answer in one of several forms), about 45%
correct, 35% wrong, 10% in another notation of the right answer, 10% format failures (cheap: no math-verify).
Each side is warmed up on a different item set first (imports, math-verify's first parse, spawned workers), so
that no measured pass sees its items in a cache. math-verify's caches are per process; with ``--repeats`` every
side scores the measured items again with warm caches and medians are reported.

Two pools are measured: ``group_key="gold"`` (one task per group of items sharing a gold answer: the way to
grade math, and the one the target applies to) and ``group_key=None`` (one task per item: every item pays a
round trip, and each worker parses every gold again).

The project's machines are shared: how much of a second core a run gets varies from minute to minute. Each
repeat therefore also measures the ceiling, the speed-up of a pure-Python loop in ``workers`` processes over one
(no IPC, no imports), printed next to the ratios.

Target (reference §5 runs grading in a process pool; the project's machines have 2 cores): ratio >= 1.7, printed
as ``RATIO math_pool_grouped_vs_sequential <ratio> TARGET >= 1.7`` (the per-item pool and the machine's ceiling
are printed for context, not targets). ``--quick``: 200 items, one repeat, same code path (seconds; the ratio is
noisier at that size).
Run: ``.venv/bin/python benchmarks/bench_math_pool.py [--items 2000] [--workers 2] [--repeats 3] [--quick]``.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import random
import statistics
import time
from fractions import Fraction

from klear_lib.rewards.math import score_math
from klear_lib.rewards.pool import RewardPool


def _gold(rng: random.Random) -> tuple[str, str, str]:
    """(gold as a dataset gives it, the same value in another notation, a wrong value)."""
    kind = rng.choice(["int", "int", "frac", "neg", "sqrt", "interval", "percent"])
    a, b = rng.randint(2, 999), rng.randint(2, 97)
    if kind == "int":
        return str(a), f"{a}.0", str(a + rng.choice([-1, 1, 10]))
    if kind == "frac":
        f = Fraction(a, b)
        return f"\\frac{{{f.numerator}}}{{{f.denominator}}}", f"{f.numerator}/{f.denominator}", f"\\frac{{{b}}}{{{a}}}"
    if kind == "neg":
        return f"-{a}", f"-({a})", str(a)
    if kind == "sqrt":
        return f"{b}\\sqrt{{2}}", f"\\sqrt{{{2 * b * b}}}", f"{b}\\sqrt{{3}}"
    if kind == "interval":
        return f"[{b}, {a + b})", f"[{b},{a + b})", f"({b}, {a + b})"
    return f"{b}\\%", f"{b / 100:g}", f"{b + 1}\\%"


def make_items(n: int, seed: int, group: int = 8) -> list[dict]:
    rng = random.Random(seed)
    items = []
    while len(items) < n:
        gold, other, wrong = _gold(rng)
        for _ in range(group):
            n_steps = rng.randint(3, 12)
            steps = " ".join(f"step {k}: {rng.randint(1, 99)} + {rng.randint(1, 99)}" for k in range(n_steps))
            roll = rng.random()
            if roll < 0.10:  # cut off while thinking
                response = f"<think>{steps} ..."
            else:
                answer = gold if roll < 0.55 else other if roll < 0.65 else wrong
                final = rng.choice([f"The answer is $\\boxed{{{answer}}}$.", f"So the answer is ${answer}$.",
                                    f"**Final answer:** \\boxed{{{answer}}}"])
                response = f"<think>{steps}</think>\n{rng.choice(['Summing up.', 'Therefore:', ''])} {final}"
            items.append({"response": response, "gold": gold})
    return items[:n]


def _spin(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


def parallel_ceiling(workers: int, n: int = 6_000_000) -> float:
    """Speed-up of `workers` processes over one on the same pure-Python work: what the machine gives right now."""
    t0 = time.perf_counter()
    for _ in range(workers):
        _spin(n)
    t_seq = time.perf_counter() - t0
    ctx = multiprocessing.get_context("fork")  # a bare loop: nothing to import, nothing to pickle
    procs = [ctx.Process(target=_spin, args=(n,)) for _ in range(workers)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return t_seq / (time.perf_counter() - t0)


def run_sequential(items):
    t0 = time.perf_counter()
    results = [score_math(**it) for it in items]
    return results, time.perf_counter() - t0


def run_pool(pool, items):
    t0 = time.perf_counter()
    results = pool.score_batch(items)
    return results, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="200 items, 1 repeat: a check that the script runs")
    args = ap.parse_args()
    if args.quick:
        args.items, args.repeats = min(args.items, 200), 1
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())

    items = make_items(args.items, seed=0)
    warm = make_items(200, seed=1)
    n = len(items)
    grouped = RewardPool(score_math, workers=args.workers, timeout_s=10.0, group_key="gold")
    per_item = RewardPool(score_math, workers=args.workers, timeout_s=10.0)
    with grouped, per_item:
        run_sequential(warm)
        run_pool(grouped, warm)
        run_pool(per_item, warm)
        ratios, ratios_per_item, ceilings = [], [], []
        for rep in range(args.repeats):
            seq, t_seq = run_sequential(items)
            par, t_par = run_pool(grouped, items)
            par1, t_par1 = run_pool(per_item, items)
            ceilings.append(parallel_ceiling(args.workers, n=600_000 if args.quick else 6_000_000))
            assert [r.reason for r in par] == [r.reason for r in seq] == [r.reason for r in par1], "disagree"
            ratios.append(t_seq / t_par)
            ratios_per_item.append(t_seq / t_par1)
            print(f"[{rep}] sequential {n / t_seq:6.1f} items/s | pool({args.workers}) grouped {n / t_par:6.1f} "
                  f"items/s, ratio {ratios[-1]:.2f}x | per item {n / t_par1:6.1f} items/s, ratio "
                  f"{ratios_per_item[-1]:.2f}x | machine ceiling {ceilings[-1]:.2f}x")
    print("reasons:", dict(collections.Counter(r.reason for r in seq)))
    ratio = statistics.median(ratios)
    print(f"median ratio, grouped pool / sequential: {ratio:.2f}x (target >= 1.7x) -> "
          f"{'PASS' if ratio >= 1.7 else 'FAIL'}; per-item pool {statistics.median(ratios_per_item):.2f}x; "
          f"machine ceiling {statistics.median(ceilings):.2f}x")
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())
    print(f"RATIO math_pool_grouped_vs_sequential {ratio:.3f} TARGET >= 1.7")


if __name__ == "__main__":
    main()
