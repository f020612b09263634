"""Every benchmark script runs in the suite at a tiny size, so a change that breaks one fails here, not on the day
someone runs `make bench`. The convention (benchmarks/README.md): each script takes `--quick` (tiny sizes, the same
code path, seconds) and prints one line per headline figure, `RATIO <name> <value> TARGET <op> <number>`, which
`make bench` collects. At `--quick` sizes the ratios mean nothing: only that they are computed is checked."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
RATIO = re.compile(r"^RATIO (\S+) (-?\d+\.\d{3}) TARGET (>=|<=) (\d+(?:\.\d+)?)$")


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_benchmark_runs_quick_and_prints_its_ratios(script: pathlib.Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # Wide limit: seconds on a quiet machine, several times that on a shared one (the suite's rule).
    proc = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env=env)
    assert proc.returncode == 0, f"{script.name} --quick exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RATIO")]
    assert lines, f"{script.name} --quick printed no RATIO line:\n{proc.stdout[-2000:]}"
    bad = [line for line in lines if not RATIO.match(line)]
    assert not bad, f"{script.name}: RATIO lines must read 'RATIO <name> <value:.3f> TARGET <op> <number>': {bad}"
    names = [RATIO.match(line)[1] for line in lines]
    assert len(set(names)) == len(names), f"{script.name}: a RATIO name is repeated: {names}"


def test_the_readme_lists_every_benchmark():
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert [s.name for s in SCRIPTS if f"`{s.name}`" not in text] == []


def test_make_bench_runs_every_script_and_checks_each_ratio_against_its_target(tmp_path):
    """`make bench`'s summary: one line per RATIO with its target and whether it was met; a script that fails is
    named and makes the target fail. Run on stand-in scripts (the real ones are too slow at full size)."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "bench_a.py").write_text("print('noise')\nprint('RATIO a_speed 1.800 TARGET >= 1.7')\n"
                                      "print('RATIO a_memory 0.300 TARGET <= 0.25')\n")
    (bench / "bench_b.py").write_text("raise SystemExit(3)\n")
    proc = subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), "bench", f"PY={sys.executable}",
                           "STAMP=", f"BENCH_DIR={bench}"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    out = proc.stdout
    assert proc.returncode != 0, out
    assert re.search(r"a_speed\s+1\.800\s+>= 1\.7\s+met", out), out
    assert re.search(r"a_memory\s+0\.300\s+<= 0\.25\s+NOT met", out), out
    assert "bench_b.py FAILED (exit 3)" in out, out
