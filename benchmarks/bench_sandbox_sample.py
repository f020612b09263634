"""One code-reward sample in the sandbox against one plain fork+exec of the same interpreter on the same program.

The sandbox's price per sample, as a multiple of the least it could cost to run the program at all: issue 45's
goal is at most 10x. Two samples of the size notebook 05 scores (a few tests, each a small program):

    05 (function calls)   the branch-code task's teacher program (`tasks.branch_code_solution`), its 4 hidden
                          function-call tests (`BranchCodeProblem.tests`), scored by `score_code` in soft mode with
                          its default options, as the 05 units score it (extraction, the sandbox, the judging)
    stdin/stdout          a 4-test a + b program, the other form a code test takes, scored the same way

Sandbox: one `score_code` call, i.e. one bwrap sandbox (its cgroup where the machine gives one, the warm
interpreter, one fresh process per test, the reset between tests). Baseline: ONE `subprocess.run` of the same
interpreter with the same flags (`-I -S`) that runs the same program on every test of the sample in that one
process (a function call's value printed with repr, a stdin test through `sys.stdin` replaced), no isolation of
any kind: a floor, not what an unsandboxed reward would do (that would start a process per test). Interleaved,
same process, medians; the page-cache warm-up and the cgroup probe happen in the warm-up round, once per process
as in a pool worker.

Output: absolute milliseconds for context, then `RATIO sandbox_sample_05_over_fork_exec <v> TARGET <= 10` and
`RATIO sandbox_sample_stdio_over_fork_exec <v> TARGET <= 10`. Run:
`.venv/bin/python benchmarks/bench_sandbox_sample.py [--repeats 30]`, or `--quick` (3 rounds, a few seconds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from klear_lib.data import tasks
from klear_lib.rewards.code import extract_code, score_code

STDIO_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"
STDIO_TESTS = [{"input": f"{a} {b}\n", "output": f"{a + b}\n"} for a, b in ((1, 2), (30, 12), (-5, 5), (7, 8))]

# The baseline's whole harness: run the program once per test in this one process, as the sandbox would judge it.
HARNESS = r"""
import sys, io
path, kind, tests = sys.argv[1], sys.argv[2], eval(sys.argv[3])
source = open(path).read()
code = compile(source, path, "exec")
out = sys.stdout
for test in tests:
    if kind == "call":
        g = {"__name__": "solution"}
        exec(code, g)
        out.write(repr(g[test[0]](*test[1])) + "\n")
    else:
        sys.stdin, sys.stdout = io.StringIO(test), io.StringIO()
        exec(code, {"__name__": "__main__"})
        out.write(sys.stdout.getvalue())
        sys.stdout = out
"""


def samples() -> dict:
    """name -> (response, tests, baseline kind, baseline tests, expected baseline stdout)."""
    problem = tasks.branch_code_problem((3, 5, 7, 1))
    response = tasks.branch_code_solution(problem)
    calls = [(t["fn_name"], t["args"]) for t in problem.tests]
    want = "".join(f"{t['expected']!r}\n" for t in problem.tests)
    stdio = f"<think>add</think>\n```python\n{STDIO_PROGRAM}```\n"
    return {"05": (response, problem.tests, "call", calls, want),
            "stdio": (stdio, STDIO_TESTS, "stdin", [t["input"] for t in STDIO_TESTS],
                      "".join(t["output"] for t in STDIO_TESTS))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30, help="rounds (each times every case once)")
    ap.add_argument("--quick", action="store_true", help="3 rounds (a smoke run of the same code path)")
    args = ap.parse_args()
    repeats = 3 if args.quick else args.repeats
    python = os.path.realpath(sys.executable)
    cases = {}
    with tempfile.TemporaryDirectory() as d:
        for name, (response, tests, kind, plain_tests, want) in samples().items():
            path = os.path.join(d, f"{name}.py")
            with open(path, "w") as f:
                f.write(extract_code(response))

            def sandboxed(response=response, tests=tests):
                r = score_code(response, tests, mode="soft")
                assert r.score == 1.0, r

            def fork_exec(path=path, kind=kind, plain_tests=plain_tests, want=want):
                r = subprocess.run([python, "-I", "-S", "-c", HARNESS, path, kind, repr(plain_tests)],
                                   capture_output=True, text=True, timeout=30)
                assert r.stdout == want, (r.stdout, r.stderr)

            cases[name] = {"sandbox": sandboxed, "fork+exec": fork_exec}
        for pair in cases.values():  # warm-up: page cache, bwrap's version, the root, the cgroup probe
            for fn in pair.values():
                fn()
        wall = {(name, kind): [] for name, pair in cases.items() for kind in pair}
        for _ in range(repeats):
            for name, pair in cases.items():
                for kind, fn in pair.items():
                    t0 = time.perf_counter()
                    fn()
                    wall[name, kind].append(time.perf_counter() - t0)
    ms = {key: statistics.median(ts) * 1e3 for key, ts in wall.items()}
    for name in cases:
        print(f"{name:>6}: sandbox {ms[name, 'sandbox']:7.2f} ms, one fork+exec {ms[name, 'fork+exec']:6.2f} ms per "
              f"sample (median of {repeats})")
    for name in cases:
        print(f"RATIO sandbox_sample_{name}_over_fork_exec {ms[name, 'sandbox'] / ms[name, 'fork+exec']:.3f} "
              f"TARGET <= 10")


if __name__ == "__main__":
    main()
