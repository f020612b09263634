"""No orphans: SIGKILL of `klear run` while its units of work run (at a fixed point: the first unit's first record)
leaves no process behind (the kernel, the unit workers, their children, multiprocessing's resource tracker), no
unit is marked done after the kill, and `klear run --resume` then finishes the run with every record once."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import pytest

from klear_lib import experiment, runs

TESTS = pathlib.Path(__file__).parent
FIXTURES = TESTS / "fixtures"
UNITS = FIXTURES / "units"  # 95_units: a notebook with units of work (kept apart: test_cli lists the others)
UNIT_DIRS = ["--notebooks-dir", str(UNITS / "nb"), "--params-dir", str(UNITS / "params")]
MARK = "KLEAR_TEST_ORPHAN_MARK"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts processes through /proc")


def marked(mark: str) -> list[tuple[int, str]]:
    """Live processes whose environment holds ``MARK=mark`` (every process the test's `klear run` started
    inherits it), as (pid, command line); zombies (dead, not yet reaped) are not counted."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != "Z":
            found.append((int(entry.name), cmd))
    return found


def test_sigkill_of_klear_run_mid_unit_leaves_no_process_and_no_late_done_mark(tmp_path):
    mark = uuid.uuid4().hex
    out = tmp_path / "out"
    # 2 units of 8 records 1 s apart, each with two child processes: a unit would finish ~8 s after the kill
    cmd = [sys.executable, "-m", "klear_lib.cli", "run", "95_units", *UNIT_DIRS, "--output-root", str(out),
           "-p", f"tests_dir={TESTS}", "-p", "steps=8", "-p", "step_s=1.0", "-p", "children=true"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, MARK: mark})
    deadline = time.monotonic() + 240
    first = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(out.glob("95_units/*/units/u_0.jsonl"))
        if found and found[0].stat().st_size > 0:  # the fixed point: the first unit's first record
            first = found[0]
            break
        time.sleep(0.05)
    assert first is not None, f"the first unit never wrote a record: {proc.poll()}, {proc.stderr.read()[-2000:]}"
    before = marked(mark)
    proc.kill()
    killed_at = time.monotonic()
    proc.wait(timeout=30)
    proc.stderr.close()
    # the kernel, 2 workers, the resource tracker and 2 x 2 children were running
    assert len(before) >= 7, before
    run_dir = first.parent.parent
    # Every process the run started carries the mark: once none is left, nothing can write a done mark later, so
    # the wait ends there (0.3 s here) instead of at the 10 s bound
    left = marked(mark)
    while left and time.monotonic() < killed_at + 10:
        time.sleep(0.1)
        left = marked(mark)
    for pid, _ in left:  # do not leave them to the next test, whatever the verdict
        os.kill(pid, signal.SIGKILL)
    late = sorted(p.name for p in (run_dir / "units").glob("*.json"))
    assert (left, late) == ([], []), f"{len(left)} processes left 10 s after the kill: {left}; done after it: {late}"

    # resume: the killed attempt's workers are gone, so it runs; every unit once, every record once
    assert subprocess.run([sys.executable, "-m", "klear_lib.cli", "run", "--resume", str(run_dir), *UNIT_DIRS],
                          capture_output=True, text=True, timeout=300, env={**os.environ, MARK: mark}).returncode == 0
    records = runs.read_metrics(run_dir / "metrics.jsonl")
    assert sorted((r["n"], r["i"]) for r in records) == [(n, i) for n in range(2) for i in range(8)]
    assert marked(mark) == []  # and a run that ends normally leaves nothing either


SCRIPT = """
import sys
sys.path.insert(0, sys.argv[2])
from klear_lib import experiment
jobs = [experiment.Job(f"u/{n}", "jobfns:slow_unit", {"n": n, "steps": 30, "step_s": 1.0, "pad": 0, "children": True})
        for n in range(2)]
if __name__ == "__main__":
    experiment.run_jobs(jobs, sys.argv[1], workers=2, progress=lambda *_: None)
"""


def test_sigkill_of_the_process_running_the_units_outside_klear_run_leaves_no_process(tmp_path, monkeypatch):
    """Without ``klear run`` (a notebook in Jupyter: no KLEAR_RUN_OWNER), the parent's death alone ends the workers
    and what they started (the parent-death signal and the watchdog on the parent)."""
    monkeypatch.delenv(experiment.OWNER_ENV, raising=False)
    mark = uuid.uuid4().hex
    script = tmp_path / "units.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "run"), str(TESTS)],
                            env={**os.environ, MARK: mark})
    first = tmp_path / "run" / "units" / "u_0.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (first.exists() and first.stat().st_size > 0):
        time.sleep(0.05)
    assert first.exists(), "the first unit never wrote a record"
    before = marked(mark)
    proc.kill()
    proc.wait(timeout=30)
    killed_at = time.monotonic()
    assert len(before) >= 5, before  # the parent, the tracker, 2 workers, the first unit's 2 children at least
    while marked(mark) and time.monotonic() < killed_at + 10:
        time.sleep(0.1)
    left = marked(mark)
    for pid, _ in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"{len(left)} processes left 10 s after the kill: {left}"
    assert not list((tmp_path / "run" / "units").glob("*.json"))


def test_a_resume_waits_for_the_workers_of_an_earlier_attempt(tmp_path):
    """A worker of an earlier attempt still alive (it holds units/.workers.lock) stops a resume with a clear
    error instead of running the same unit twice at once."""
    import fcntl

    units = tmp_path / "run" / experiment.UNITS_DIR
    units.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               f"f = open({str(units / experiment.WORKERS_LOCK)!r}, 'a')\n"
                               "fcntl.flock(f, fcntl.LOCK_SH)\nprint('held', flush=True)\ntime.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        jobs = [experiment.Job("job/n=1", "jobfns:count_and_write", {"n": 1, "log": str(tmp_path / "log")})]
        with pytest.raises(experiment.RunBusy, match="still running"):
            experiment.run_jobs(jobs, tmp_path / "run", workers=1, progress=lambda *_: None, busy_wait_s=1.0)
        assert not (tmp_path / "log").exists()  # nothing ran
    finally:
        holder.kill()
        holder.wait()
    results = experiment.run_jobs(jobs, tmp_path / "run", workers=1, progress=lambda *_: None)
    assert results["job/n=1"]["n"] == 1
    assert fcntl is not None


def test_a_unit_is_marked_done_only_while_the_run_owner_lives(tmp_path, monkeypatch):
    """The done mark is written by the parent, and only while the process that owns the run (``klear run``,
    named in KLEAR_RUN_OWNER) lives: with a dead owner nothing is recorded and the run stops."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    monkeypatch.setenv(experiment.OWNER_ENV, f"{dead.pid}:0")
    jobs = [experiment.Job("job/n=2", "jobfns:count_and_write", {"n": 2, "log": str(tmp_path / "log")})]
    with pytest.raises(experiment.OwnerGone, match=str(dead.pid)):
        experiment.run_jobs(jobs, tmp_path / "run", workers=1, progress=lambda *_: None)
    assert not list((tmp_path / "run" / "units").glob("*.json"))
    monkeypatch.setenv(experiment.OWNER_ENV, experiment.process_identity())
    assert json.loads(json.dumps(experiment.run_jobs(jobs, tmp_path / "run", workers=1,
                                                     progress=lambda *_: None)))["job/n=2"]["n"] == 2
