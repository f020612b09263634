"""Sandbox cost against bare subprocesses running the same program: per call, and per 16-test sample.

The program reads numbers from stdin and prints their sum: a typical test's size, so that what is timed is the
sandbox's own cost (namespaces, mounts, seccomp, the warm interpreter, the fork per test), not the program.
Same interpreter and flags (`-I -S`), same run, interleaved, medians.

Per call: one `run_python` (a sandbox for one test) against one bare subprocess; a third column,
`run_python(unsafe_no_sandbox=True)` (the same warm interpreter and limits, no bwrap), splits the overhead into
bwrap's part and the rest. Per sample: one `run_python_tests` with 16 tests (one sandbox, a fork per test)
against 16 bare subprocesses, one per test, as a code reward without the per-sample sandbox would run them.

The sandbox's per-sample work is all in the measured call: its cgroup (where the machine allows one: created,
capped, removed), the CPU-time metering of each test and the reset between tests, with the per-test isolation
of issue 37 (the forker's two forks per test, the tmpfs counters moved on, the socket counts, each test reading
its own section of the job; `KLEAR_SANDBOX_CGROUP=off` measures the fallback instead). To compare two versions
in one run, run this script in turns under each version's PYTHONPATH (docs/design.md has the figures).

Targets: per-sample ratio (sandbox / bare, wall time) <= 0.5; the CPU time beside it is less disturbed by other
load on the machine. Both end the output as `RATIO <name> <value> TARGET <= 0.5` lines. Run:
`.venv/bin/python benchmarks/bench_sandbox.py [--repeats 50] [--sample-repeats 20]`, or `--quick` (a few
rounds, a few seconds, the same code path).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

from klear_lib.rewards.sandbox import UnsafeSandboxWarning, run_python, run_python_tests

PROGRAM = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n"
TESTS = [" ".join(map(str, range(k, k + 1000))) + "\n" for k in range(16)]
EXPECTED = [f"{sum(range(k, k + 1000))}\n" for k in range(16)]


def interleaved(cases: dict, repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and CPU milliseconds per case, the cases taking turns so that machine noise hits each alike.
    CPU: user + system time of this process and of every process it waited for (the sandbox's included), which
    other load on the machine disturbs less than wall time."""
    for fn in cases.values():  # warm-up: page cache, bwrap version check, the interpreter's files
        fn()
    wall = {name: [] for name in cases}
    cpu = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            c0, t0 = _cpu_s(), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(_cpu_s() - c0)
    return _median_ms(wall), _median_ms(cpu)


def _median_ms(times: dict) -> dict:
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def _cpu_s() -> float:
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50, help="per-call rounds")
    ap.add_argument("--sample-repeats", type=int, default=20, help="per-sample rounds")
    ap.add_argument("--quick", action="store_true", help="3 rounds of each (a smoke run of the same code path)")
    args = ap.parse_args()
    if args.quick:
        args.repeats = args.sample_repeats = 3

    python = os.path.realpath(sys.executable)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "main.py")
        with open(path, "w") as f:
            f.write(PROGRAM)

        def bare(k=0):
            r = subprocess.run([python, "-I", "-S", path], input=TESTS[k], capture_output=True, text=True, timeout=10)
            assert r.stdout == EXPECTED[k]

        def sandboxed():
            assert run_python(PROGRAM, stdin=TESTS[0], timeout_s=10).stdout == EXPECTED[0]

        def unsafe():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UnsafeSandboxWarning)
                assert run_python(PROGRAM, stdin=TESTS[0], timeout_s=10, unsafe_no_sandbox=True).stdout == EXPECTED[0]

        def bare_sample():
            for k in range(len(TESTS)):
                bare(k)

        def sandboxed_sample():
            assert [r.stdout for r in run_python_tests(PROGRAM, TESTS, timeout_s=10)] == EXPECTED

        per_call, call_cpu = interleaved({"bare subprocess": bare, "bwrap sandbox": sandboxed,
                                          "limits, no bwrap": unsafe}, args.repeats)
        per_sample, sample_cpu = interleaved({"16 bare subprocesses": bare_sample,
                                              "one sandbox, 16 tests": sandboxed_sample}, args.sample_repeats)

    for name, ms in per_call.items():
        print(f"{name:>22}: {ms:7.2f} ms per call, {call_cpu[name]:6.2f} ms CPU (median of {args.repeats})")
    ratio = per_call["bwrap sandbox"] / per_call["bare subprocess"]
    print(f"{'per-call ratio':>22}: {ratio:7.2f}x  (bwrap sandbox / bare subprocess, one test)")
    for name, ms in per_sample.items():
        print(f"{name:>22}: {ms:7.2f} ms per sample, {sample_cpu[name]:6.2f} ms CPU (median of {args.sample_repeats})")
    cpu_ratio = sample_cpu["one sandbox, 16 tests"] / sample_cpu["16 bare subprocesses"]
    print(f"{'per-sample CPU ratio':>22}: {cpu_ratio:7.2f}x")
    sample_ratio = per_sample["one sandbox, 16 tests"] / per_sample["16 bare subprocesses"]
    print(f"RATIO sandbox_per_sample_cpu {cpu_ratio:.3f} TARGET <= 0.5")
    print(f"RATIO sandbox_per_sample {sample_ratio:.3f} TARGET <= 0.5")


if __name__ == "__main__":
    main()
