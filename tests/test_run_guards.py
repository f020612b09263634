"""What `klear run` refuses before any work, each as one line naming the key or the path: a parameter given twice,
a value that is not finite or out of range, a run directory another process is running, a run directory that
cannot be written. The fixture notebooks are tests/fixtures/nb (99_dummy writes a run directory from its
parameters); the range checks run against the real notebooks' config cells (klear_lib.presets.dry_run_config)."""

import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from klear_lib import cli, presets, runner, runs

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
DIRS = ["--notebooks-dir", str(FIXTURES / "nb"), "--params-dir", str(FIXTURES / "params")]


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("klear: error: "), err  # one line, no traceback
    return err.strip()


def test_a_parameter_given_twice_is_an_error(capsys):
    with pytest.raises(presets.KlearError, match=r"-p seed is given twice \('seed=1', then 'seed=3'\)"):
        presets.parse_overrides(["seed=1", "lr=0.1", "seed=3"])
    assert cli.main(["run", "99_dummy", "-p", "x=1", "-p", "x=2", *DIRS]) == 2
    assert "-p x is given twice" in error_line(capsys)


@pytest.mark.parametrize("text", ["1e400", "-1e400", ".nan", ".inf"])
def test_a_float_that_is_not_finite_is_refused(text):
    declared = {"lr": {"default": "0.001"}}
    value = presets.parse_value(text)
    with pytest.raises(presets.KlearError, match=r"lr = .* \(from -p\): expected a finite number"):
        presets.check_types({"lr": value}, declared, sources={"lr": "-p"})
    assert presets.check_types({"lr": 1e300}, declared) == {"lr": 1e300}  # large and finite is the range checks' job


def test_a_config_refuses_what_is_not_finite_even_outside_klear_run():
    """A notebook run by Run All never passes through klear run's checks: the config itself refuses inf."""
    from klear_lib.config import RLExperimentConfig

    with pytest.raises(ValueError, match=r"RLExperimentConfig.rl_lr must be a finite number, got inf"):
        RLExperimentConfig.from_params({"rl_lr": float("inf")})


@pytest.mark.parametrize("override, expected", [
    ("rl_lr=1e400", r"rl_lr = inf \(from -p\): expected a finite number"),
    ("seeds=-1", r"seeds = '-1': every item must be >= 0"),
    ("seeds=0,-2", r"seeds = '0,-2': every item must be >= 0"),
    ("rollouts=1000000000", r"rollouts = 1000000000: at most 10000 a run \(at the tiny preset's ~5 CPU-s a rollout, "
                            r"~1,388,889 h a unit\)"),
])
def test_out_of_range_values_are_refused_before_a_kernel_starts(tmp_path, capsys, override, expected):
    """The real notebook 03, its smoke preset: each bad value is one line, and no run directory is made."""
    assert cli.main(["run", "03", "--preset", "smoke", "-p", override, "--output-root", str(tmp_path)]) == 2
    assert re.search(expected, error_line(capsys))
    assert not list(tmp_path.rglob("params.json"))


def a_recorded_run(tmp_path: pathlib.Path) -> pathlib.Path:
    """A finished 99_dummy run, made by klear run itself."""
    assert cli.main(["run", "99_dummy", "--preset", "smoke", *DIRS, "--output-root", str(tmp_path / "out")]) == 0
    return next((tmp_path / "out" / "99_dummy").iterdir())


def test_a_run_directory_another_process_runs_is_refused_untouched(tmp_path, capsys):
    """Two resumes of one folder at once left a finished run marked failed: the second now stops before it reads
    or writes anything there, naming the owner's pid; once the owner is gone the folder resumes."""
    run_dir = a_recorded_run(tmp_path)
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != runner.LOCK_FILE}
    with runner.own_run_dir(run_dir):  # another holder of the lock (flock: per open file, so this process counts)
        assert cli.main(["run", "--resume", str(run_dir), *DIRS]) == 2
        line = error_line(capsys)
        assert f"{run_dir} is being run by another process (pid " in line and "--resume" in line
        after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != runner.LOCK_FILE}
        assert after == before and not (run_dir / runs.STATUS_FILE).exists()
    assert cli.main(["run", "--resume", str(run_dir), *DIRS]) == 0  # the lock ends with its holder
    assert json.loads((run_dir / runs.PARAMS_FILE).read_text())["resumed"]


def test_the_lock_is_freed_when_its_holder_is_killed(tmp_path):
    """flock belongs to the open file: a holder killed by SIGKILL leaves nothing that blocks a resume."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code = (f"import pathlib, sys, time; from klear_lib import runner\n"
            f"with runner.own_run_dir(pathlib.Path({str(run_dir)!r})):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(presets.KlearError, match=rf"pid {holder.pid}\)"):
            with runner.own_run_dir(run_dir):
                pass
    finally:
        holder.kill()
        holder.wait()
    with runner.own_run_dir(run_dir):
        assert (run_dir / runner.LOCK_FILE).read_text().strip() == str(__import__("os").getpid())


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0,
                    reason="needs unshare (util-linux) and user namespaces, for a read-only bind mount")
def test_a_read_only_run_directory_is_one_line(tmp_path):
    """The resume runs in a mount namespace where the run directory is bind-mounted read-only (as root, a chmod
    would not stop the writes)."""
    run_dir = a_recorded_run(tmp_path)
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && '
              'exec "$2" -m klear_lib.cli run --resume "$1" ' + " ".join(f"'{a}'" for a in DIRS))
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(run_dir), sys.executable],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"klear: error: cannot write in {run_dir}: Read-only file system\n"
