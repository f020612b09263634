"""A full disk during `klear run` is one line (what failed, the free space, the resume command), every run-level file
stays whole, and the run resumes once there is space: on a real 3.5 MB tmpfs as the output root (mounted in a
private mount namespace through `unshare`, so nothing is left mounted), and at the write layer (ENOSPC injected)
for the pieces: atomic files, whole metric lines, the start's free-space check."""

import errno
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from klear_lib import cli, runs

TESTS = pathlib.Path(__file__).parent
FIXTURES = TESTS / "fixtures"
DIRS = ["--notebooks-dir", str(FIXTURES / "nb"), "--params-dir", str(FIXTURES / "params")]
UNITS = FIXTURES / "units"  # 95_units: a notebook with units of work (kept apart: test_cli lists the others)
UNIT_DIRS = ["--notebooks-dir", str(UNITS / "nb"), "--params-dir", str(UNITS / "params")]


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_an_atomic_write_that_hits_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "status.json"
    runs.write_atomic(path, '{"status": "old"}\n')
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(OSError) as err:
        runs.write_atomic(path, '{"status": "new"}\n')
    assert runs.is_disk_full(err.value)
    assert json.loads(path.read_text()) == {"status": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_a_metrics_write_that_hits_a_full_disk_leaves_whole_lines_only(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    writer = runs.MetricsWriter(path)
    writer.write({"step": 0})
    real_write = os.write

    def half_then_full(fd, data):  # what a filling disk does: part of the line, then ENOSPC
        if fd == writer._f.fileno():
            monkeypatch.setattr(os, "write", lambda *a: _enospc())
            return real_write(fd, bytes(data[: len(data) // 2]))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        writer.write({"step": 1, "pad": "x" * 100})
    monkeypatch.setattr(os, "write", real_write)
    writer.write({"step": 2})
    writer.close()
    assert path.read_text() == '{"step":0}\n{"step":2}\n'


def test_disk_full_is_recognised_in_errors_chains_and_tracebacks():
    assert runs.is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert runs.is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    wrapped = RuntimeError("unit failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "x")
    assert runs.is_disk_full(wrapped)
    assert runs.is_disk_full('SafetensorError: IoError(Os { code: 28, kind: StorageFull, message: "..." })')
    assert not runs.is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not runs.is_disk_full(ValueError("no space here"))


def test_too_little_free_space_is_refused_at_the_start_in_one_line(tmp_path, capsys, monkeypatch):
    free_mb = runs.free_bytes(tmp_path) / 1e6
    monkeypatch.setenv(runs.MIN_FREE_ENV, str(free_mb * 1000 + 1))
    assert cli.main(["run", "99_dummy", *DIRS, "--output-root", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("klear: error: only ") and "MB free on" in err and runs.MIN_FREE_ENV in err, err
    assert err.count("\n") == 1
    assert not (tmp_path / "out" / "99_dummy").exists() or not any((tmp_path / "out" / "99_dummy").iterdir())
    monkeypatch.setenv(runs.MIN_FREE_ENV, "lots")
    assert cli.main(["run", "99_dummy", *DIRS, "--output-root", str(tmp_path / "out")]) == 2
    assert "KLEAR_MIN_FREE_MB='lots': expected a number" in capsys.readouterr().err


DRIVER = textwrap.dedent("""
    import json, os, subprocess, sys
    root, tests, size = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(root, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", root], check=True)
    env = {**os.environ, "KLEAR_MIN_FREE_MB": "1"}  # let it start: the point is the disk filling up mid-run
    dirs = ["--notebooks-dir", f"{tests}/fixtures/units/nb", "--params-dir", f"{tests}/fixtures/units/params"]
    # 2 units of 60 records of 20 kB: 2.4 MB of unit records, then metrics.jsonl merged from them: over 3.5 MB
    first = subprocess.run([sys.executable, "-m", "klear_lib.cli", "run", "95_units", *dirs, "--output-root", root,
                            "-p", f"tests_dir={tests}", "-p", "steps=60", "-p", "pad=20000"],
                           capture_output=True, text=True, env=env, timeout=600)
    run_dir = next(os.scandir(f"{root}/95_units")).path
    files = {}
    for name in sorted(os.listdir(run_dir)):
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            text = open(path, encoding="utf-8", errors="replace").read()
            try:
                if name.endswith(".jsonl"):
                    [json.loads(line) for line in text.splitlines()]
                else:
                    json.loads(text)
                files[name] = "whole"
            except ValueError as err:
                files[name] = f"damaged: {err}"
    units = sorted(os.listdir(f"{run_dir}/units"))
    subprocess.run(["mount", "-o", "remount,size=64m", root], check=True)
    second = subprocess.run([sys.executable, "-m", "klear_lib.cli", "run", "--resume", run_dir, *dirs],
                            capture_output=True, text=True, env=env, timeout=600)
    records = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    print(json.dumps({"rc": first.returncode, "stderr": first.stderr, "run_dir": run_dir, "files": files,
                      "units": units, "rc2": second.returncode, "stderr2": second.stderr[-3000:],
                      "records": sorted([r["n"], r["i"]] for r in records)}))
""")


def _namespace_prefix() -> list[str] | None:
    """`unshare` into a private mount namespace (a user namespace too when not root), or None if it cannot."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return None
    prefix = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    probe = subprocess.run([*prefix, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/mnt"],
                           capture_output=True, text=True)
    return prefix if probe.returncode == 0 else None


def test_a_run_on_a_35_mb_output_root_fails_in_one_line_and_resumes(tmp_path):
    prefix = _namespace_prefix()
    if prefix is None:
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (unshare); the write-layer tests "
                    "above simulate ENOSPC instead")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = subprocess.run([*prefix, sys.executable, str(driver), str(tmp_path / "root"), str(TESTS), "3584k"],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    lines = [line for line in got["stderr"].splitlines() if line.startswith("klear:")]
    assert got["rc"] == 1, got["stderr"][-3000:]
    assert len(lines) == 1 and "Traceback" not in got["stderr"], got["stderr"][-3000:]
    line = lines[0]
    assert "the disk is full" in line and "MB free on" in line, line
    assert line.endswith(f"klear run --resume {got['run_dir']}"), line
    # every run-level file is whole (status.json included, saying why); the units' files too
    assert got["files"], got
    assert all(v == "whole" for v in got["files"].values()), got["files"]
    assert "notebook.ipynb" in got["files"] and "params.json" in got["files"]
    assert got["rc2"] == 0, got["stderr2"]
    assert got["records"] == [[n, i] for n in range(2) for i in range(60)]  # every record once
