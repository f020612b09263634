"""Sandbox overhead per test: `run_python` under bubblewrap against a bare subprocess running the same program.

The program reads numbers from stdin and prints their sum: a typical test's size, so that what is timed is the
per-test cost of the sandbox (namespaces, mounts, the limit-setting wrapper), not the program. Same interpreter
(`-I -S`), same run, interleaved, medians. A third column, `run_python(unsafe_no_sandbox=True)` (limits and
output capture but no bwrap), splits the overhead into bwrap's part and the rest.

Target: ratio (bwrap / bare) <= 1.3. Run: `.venv/bin/python benchmarks/bench_sandbox.py [--repeats 50]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

from klear_lib.rewards.sandbox import UnsafeSandboxWarning, run_python

PROGRAM = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n"
STDIN = " ".join(map(str, range(1000))) + "\n"
EXPECTED = f"{sum(range(1000))}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()

    python = os.path.realpath(sys.executable)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "main.py")
        with open(path, "w") as f:
            f.write(PROGRAM)

        def bare():
            r = subprocess.run([python, "-I", "-S", path], input=STDIN, capture_output=True, text=True, timeout=10)
            assert r.stdout == EXPECTED

        def sandboxed():
            assert run_python(PROGRAM, stdin=STDIN, timeout_s=10).stdout == EXPECTED

        def unsafe():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UnsafeSandboxWarning)
                assert run_python(PROGRAM, stdin=STDIN, timeout_s=10, unsafe_no_sandbox=True).stdout == EXPECTED

        cases = {"bare subprocess": bare, "bwrap sandbox": sandboxed, "limits, no bwrap": unsafe}
        times = {name: [] for name in cases}
        for fn in cases.values():  # warm-up: page cache, bwrap version check, interpreter roots
            fn()
        for _ in range(args.repeats):
            for name, fn in cases.items():  # interleaved: machine noise hits every case alike
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)

    med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    for name, ms in med.items():
        print(f"{name:>18}: {ms:7.2f} ms per call (median of {args.repeats})")
    ratio = med["bwrap sandbox"] / med["bare subprocess"]
    print(f"{'ratio':>18}: {ratio:7.2f}x  (bwrap sandbox / bare subprocess; target <= 1.3)")


if __name__ == "__main__":
    main()
