"""The `klear` CLI: presets, typed overrides, validation against the notebook, and real papermill runs.

The fixture notebooks in tests/fixtures/nb: 99_dummy writes a full run directory from its parameters,
98_fails raises in its second cell, 97_no_run_dir lacks the `run_dir` parameter.
"""

import json
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import nbformat
import pytest

from klear_lib import cli, presets, runs

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
NB_DIR = FIXTURES / "nb"
PARAMS_DIR = FIXTURES / "params"
DIRS = ["--notebooks-dir", str(NB_DIR), "--params-dir", str(PARAMS_DIR)]


def run_dirs(root: pathlib.Path, name: str) -> list[pathlib.Path]:
    return sorted((root / name).iterdir())


# -------------------------------------------------------------------------------------------- parameters


def test_overrides_are_typed_as_yaml():
    assert presets.parse_overrides(["seed=2", "lr=1e-4", "name=abc", "beta=0.28", "flag=true", "empty=", "s='2'"]) == {
        "seed": 2,
        "lr": 1e-4,
        "name": "abc",
        "beta": 0.28,
        "flag": True,
        "empty": None,
        "s": "2",
    }
    assert type(presets.parse_value("1e-4")) is float and presets.parse_value("-3E2") == -300.0
    assert presets.parse_value("1_000") == 1000 and presets.parse_value("v1e3") == "v1e3"
    with pytest.raises(presets.KlearError, match="given twice"):  # which one was meant cannot be known
        presets.parse_overrides(["seed=1", "seed=3"])
    for bad in ["noequals", "=3", "not-an-id=1"]:
        with pytest.raises(presets.KlearError, match="key=value"):
            presets.parse_overrides([bad])


def test_load_params_merges_preset_and_overrides():
    assert presets.load_params("99_dummy", "tiny", params_dir=PARAMS_DIR) == {"x": 5, "lr": 1e-3, "name": "tiny run"}
    merged = presets.load_params("99_dummy", "tiny", ["x=7", "seed=2"], params_dir=PARAMS_DIR)
    assert merged == {"x": 7, "lr": 1e-3, "name": "tiny run", "seed": 2}
    smoke = presets.load_params("99_dummy", "smoke", {"lr": 0.5}, params_dir=PARAMS_DIR)
    assert smoke == {"x": 3, "seed": 0, "lr": 0.5}
    with pytest.raises(presets.KlearError, match="flat scalars"):
        presets.load_params("99_dummy", "smoke", ["x=[1, 2]"], params_dir=PARAMS_DIR)


def test_unknown_preset_lists_the_presets(capsys):
    with pytest.raises(presets.KlearError, match=r"no preset 'huge' for 99_dummy; its presets: smoke, tiny"):
        presets.load_params("99_dummy", "huge", params_dir=PARAMS_DIR)
    assert cli.main(["run", "99_dummy", "--preset", "huge", *DIRS]) == 2
    assert "its presets: smoke, tiny" in capsys.readouterr().err


def test_validate_params_names_key_source_and_valid_keys():
    valid = ["run_dir", "x", "seed"]
    presets.validate_params({"x": 1, "seed": 2}, valid)
    with pytest.raises(presets.KlearError) as err:
        presets.validate_params({"x": 1, "sed": 2}, valid, notebook="nb", sources={"sed": "-p"})
    msg = str(err.value)
    assert "'sed' (from -p)" in msg and "did you mean 'seed'" in msg and "x, seed" in msg
    with pytest.raises(presets.KlearError, match="set by klear"):
        presets.validate_params({"run_dir": "/x"}, valid)
    with pytest.raises(presets.KlearError, match="declares no 'run_dir'"):
        presets.validate_params({}, ["x"])


def test_unknown_key_from_yaml_or_p_is_reported_with_its_source(tmp_path, capsys):
    params = tmp_path / "params"
    shutil.copytree(PARAMS_DIR, params)
    (params / "99_dummy" / "bad.yaml").write_text("x: 1\nlearning_rate: 0.1\n")
    dirs = ["--notebooks-dir", str(NB_DIR), "--params-dir", str(params), "--output-root", str(tmp_path / "out")]

    assert cli.main(["run", "99_dummy", "--preset", "bad", *dirs]) == 2
    err = capsys.readouterr().err
    assert "'learning_rate'" in err and str(params / "99_dummy" / "bad.yaml") in err
    assert "x, seed, lr, name" in err

    assert cli.main(["run", "99", "--preset", "smoke", "-p", "sede=3", *dirs]) == 2
    err = capsys.readouterr().err
    assert "'sede' (from -p)" in err and "x, seed, lr, name" in err
    assert not (tmp_path / "out").exists()  # nothing runs, no run directory is made


def test_resolve_notebook_by_name_suffix_prefix_and_path():
    expected = (NB_DIR / "99_dummy.ipynb").resolve()
    for spec in ["99_dummy", "99_dummy.ipynb", "99", str(NB_DIR / "99_dummy.ipynb")]:
        assert presets.resolve_notebook(spec, NB_DIR) == expected
    with pytest.raises(presets.KlearError, match="several notebooks: 96_checked, 97_no_run_dir, 98_fails, 99_dummy"):
        presets.resolve_notebook("9", NB_DIR)
    with pytest.raises(presets.KlearError, match="notebooks: 96_checked, 97_no_run_dir, 98_fails, 99_dummy"):
        presets.resolve_notebook("42_nope", NB_DIR)


def test_list_shows_notebooks_and_presets(capsys):
    assert cli.main(["list", *DIRS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["96_checked", "97_no_run_dir", "98_fails", "99_dummy"]
    assert lines[3].split(None, 1)[1] == "smoke, tiny"


# -------------------------------------------------------------------------------------------- papermill


def test_prepare_injects_parameters_without_executing(tmp_path, capsys):
    out = tmp_path / "build" / "99.ipynb"
    assert cli.main(["prepare", "99", "--preset", "smoke", "-p", "lr=2e-5", "--out", str(out), *DIRS]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    nb = nbformat.read(out, as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1
    namespace = {}
    exec(injected[0].source, namespace)  # the injected cell is plain assignments
    assert {k: namespace[k] for k in ("x", "seed", "lr", "run_dir")} == {
        "x": 3,
        "seed": 0,
        "lr": 2e-5,
        "run_dir": str(tmp_path / "build" / "99_dummy"),  # default: beside --out, named after the notebook
    }
    assert (tmp_path / "build" / "99_dummy").is_dir()
    assert all(c.get("outputs", []) == [] for c in nb.cells if c.cell_type == "code")  # not executed

    custom = tmp_path / "elsewhere"
    cli.main(["prepare", "99_dummy", "--preset", "tiny", "--out", str(out), "--run-dir", str(custom), *DIRS])
    assert f'run_dir = "{custom}"' in nbformat.read(out, as_version=4).cells[2].source


def test_prepare_all_writes_every_notebook_with_the_preset_and_one_stamp_of_run_folders(tmp_path, capsys):
    out = tmp_path / "nbval"
    assert cli.main(["prepare", "--all", "--preset", "tiny", "--out", str(out), *DIRS]) == 0
    assert capsys.readouterr().out.split() == [str(out / "96_checked.ipynb"), str(out / "99_dummy.ipynb")]
    [stamp] = {p.name for p in (out / "runs").glob("*/*")}
    assert re.fullmatch(r"\d{8}-\d{6}", stamp)
    for name in ("96_checked", "99_dummy"):  # the tiny preset's values, each in its own run folder
        nb = nbformat.read(out / f"{name}.ipynb", as_version=4)
        [injected] = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        namespace = {}
        exec(injected.source, namespace)
        assert namespace["run_dir"] == str(out / "runs" / name / stamp)
        assert (out / "runs" / name / stamp).is_dir()
    assert cli.main(["prepare", "99", "--all", "--preset", "tiny", "--out", str(out), *DIRS]) == 2
    assert "takes no notebook, -p or --run-dir" in capsys.readouterr().err
    assert cli.main(["prepare", "--all", "--preset", "nope", "--out", str(out), *DIRS]) == 2
    assert "has a 'nope' preset" in capsys.readouterr().err


def test_run_executes_the_notebook_into_a_run_dir(tmp_path, capsys):
    out_root = tmp_path / "outputs"
    argv = ["run", "99_dummy", "--preset", "tiny", "-p", "x=21", "--output-root", str(out_root), *DIRS]
    assert cli.main(argv) == 0
    [run_dir] = run_dirs(out_root, "99_dummy")
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(run_dir)

    assert runs.check_run_dir(run_dir, runs.RUN_CONTRACT + (runs.NOTEBOOK_FILE, runs.PARAMS_FILE)) == []
    # the notebook computed from the merged parameters
    assert runs.read_summary(run_dir) == {"x_times_2": 42, "lr": 1e-3, "name": "tiny run", "seed": 0}
    assert json.loads((run_dir / "config.json").read_text()) == {"x": 21, "seed": 0, "lr": 1e-3, "name": "tiny run"}
    assert runs.read_metrics(run_dir / "metrics.jsonl") == [{"step": 1, "x": 21}]
    record = json.loads((run_dir / "params.json").read_text())
    assert record["preset"] == "tiny" and record["params"] == {"x": 21, "lr": 1e-3, "name": "tiny run"}
    assert record["run_dir"] == str(run_dir)
    executed = nbformat.read(run_dir / "notebook.ipynb", as_version=4)
    stdout = [o["text"] for o in executed.cells[-1].outputs if o.get("name") == "stdout"]
    assert "".join(stdout).strip() == "42"


def test_failing_notebook_exits_nonzero_and_points_at_the_partial_notebook(tmp_path, capsys):
    out_root = tmp_path / "outputs"
    assert cli.main(["run", "98", "--preset", "smoke", "--output-root", str(out_root), *DIRS]) == 1
    err = capsys.readouterr().err
    [run_dir] = run_dirs(out_root, "98_fails")
    assert "98_fails failed" in err and "RuntimeError: fixture failure, x=1" in err
    assert f"partially executed notebook: {run_dir / 'notebook.ipynb'}" in err
    assert (run_dir / "notebook.ipynb").is_file() and (run_dir / "params.json").is_file()
    # One cell numbering: Jupyter's In [N] (parameters 1, papermill's injected parameters 2, the raising cell 3) in
    # the CLI's message, status.json and the report alike.
    from klear_lib import report

    assert "98_fails failed in cell [3]: RuntimeError" in err
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["cell"], status["cell_source"]) == (3, 'raise RuntimeError(f"fixture failure, x={x}")')
    executed = nbformat.read(run_dir / "notebook.ipynb", as_version=4)
    assert [c.execution_count for c in executed.cells if c.cell_type == "code"] == [1, 2, 3]
    run = report.read_run(run_dir)
    assert run.error.endswith("last cell [3]: raise RuntimeError(f\"fixture failure, x={x}\")"), run.error
    assert report._notebook_error(executed).endswith("(cell [3])")


def test_reproduce_runs_every_notebook_with_the_preset_and_continues_past_failures(tmp_path, capsys):
    params = tmp_path / "params"
    shutil.copytree(PARAMS_DIR, params)
    (params / "97_no_run_dir" / "smoke.yaml").unlink()  # no smoke preset: not run at all
    shutil.rmtree(params / "96_checked")
    out_root = tmp_path / "outputs"
    dirs = ["--notebooks-dir", str(NB_DIR), "--params-dir", str(params), "--output-root", str(out_root)]
    assert cli.main(["reproduce", "--preset", "smoke", *dirs]) == 1
    captured = capsys.readouterr()
    table = captured.out.splitlines()
    assert table[0].split()[:2] == ["notebook", "status"]
    assert [row.split()[:2] for row in table[1:4]] == [["98_fails", "FAILED"], ["99_dummy", "ran"], ["report", "ran"]]
    assert str(run_dirs(out_root, "99_dummy")[0]) in table[2]  # the 99 ran though 98 failed (beside it)
    assert table[4].startswith("total: ") and table[4].endswith(str(out_root / "report.html"))
    assert "1 of 2 notebooks failed: 98_fails" in captured.err

    # The log the report reads, and the report: the failure with its cause, the other notebook ok.
    log = json.loads((out_root / "reproduce.json").read_text())
    assert [(r["notebook"], r["status"]) for r in log["rows"]] == [("98_fails", "FAILED"), ("99_dummy", "ran")]
    assert "RuntimeError: fixture failure, x=1" in log["rows"][0]["message"]
    html = (out_root / "report.html").read_text()
    assert '<section id="98_fails">' in html and '<section id="99_dummy">' in html
    assert "RuntimeError: fixture failure, x=1" in html

    (params / "98_fails" / "smoke.yaml").unlink()
    assert cli.main(["reproduce", "--preset", "smoke", *dirs]) == 0


def test_report_command_writes_the_report_without_a_report_notebook(tmp_path, capsys):
    out_root = tmp_path / "outputs"
    assert cli.main(["run", "99", "--preset", "smoke", "--output-root", str(out_root), *DIRS]) == 0
    capsys.readouterr()
    assert cli.main(["report", "--output-root", str(out_root), *DIRS]) == 0
    path = pathlib.Path(capsys.readouterr().out.strip())
    assert path == out_root / "report.html" and '<section id="99_dummy">' in path.read_text()


def test_console_entry_point_runs_as_a_module(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "klear_lib.cli", "list", *DIRS], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "99_dummy" in proc.stdout


# ------------------------------------------------------------------------------ checks before a kernel starts


def klear(tmp_path, *args):
    return cli.main([*args, *DIRS, "--output-root", str(tmp_path / "out")])


@pytest.mark.parametrize("override, message", [
    ("seeds=abc", "seeds = 'abc': 'abc' is not a valid int"),
    ("seeds=", "seeds (from -p) is empty; expected a str like '0,1'"),
    ("lr=-1e-3", "lr must be > 0, got -0.001"),
    ("lr=abc", "lr = 'abc' (from -p): expected a number like 0.1"),
    ("steps=1.5", "steps = 1.5 (from -p): expected an integer like 2"),
    ("slow=1", "slow = 1 (from -p): expected true or false"),
])
def test_bad_values_fail_before_a_kernel_starts_naming_key_and_value(tmp_path, capsys, override, message):
    import time

    clock = time.monotonic()
    assert klear(tmp_path, "run", "96_checked", "-p", override) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err  # one line
    assert time.monotonic() - clock < 15
    assert not (tmp_path / "out").exists()  # no run directory was made


def test_a_number_for_a_list_parameter_is_its_text(tmp_path, capsys):
    assert klear(tmp_path, "run", "96_checked", "-p", "seeds=1") == 0
    run_dir = pathlib.Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads((run_dir / "config.json").read_text())["seeds"] == [1]
    assert json.loads((run_dir / "params.json").read_text())["seconds"] > 0  # the report shows every run's time


def test_preset_defaults_to_tiny_and_params_lists_every_preset(tmp_path, capsys):
    assert klear(tmp_path, "run", "96_checked") == 0
    run_dir = pathlib.Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads((run_dir / "params.json").read_text())["preset"] == "tiny"
    assert cli.main(["params", "96_checked", *DIRS]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["parameter", "default", "smoke", "tiny"]
    assert out[1].split() == ["seeds", '"0,1"', "·", "'0,1,2'"] and out[3].split() == ["steps", "2", "1", "·"]


def test_version_and_errors_outside_a_checkout(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"klear {cli.__version__}"
    assert cli.main(["list", "--repo-root", str(tmp_path)]) == 2
    assert "no notebooks folder" in capsys.readouterr().err
    assert cli.main(["report", "--output-root", str(tmp_path / "nothing"), *DIRS]) == 2
    assert "no run directories under" in capsys.readouterr().err


def test_an_unwritable_output_root_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert cli.main(["run", "96_checked", *DIRS, "--output-root", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("klear: error: cannot create a run directory under") and err.count("\n") == 1


def as_from_a_terminal() -> None:
    """``preexec_fn`` for a child a test sends Ctrl-C (SIGINT) to: the disposition a terminal's foreground job
    starts with. A test run started in the background by a non-interactive shell (``make test &``) ignores SIGINT,
    and every child would inherit that and run to its end through the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_marks_the_run_interrupted_and_resume_finishes_it(tmp_path):
    """A real `klear run` in a subprocess, SIGINT while its notebook sleeps: one line, status.json says
    interrupted; `klear run --resume` runs it again into the same directory and it completes."""
    import time

    env = {**__import__("os").environ}
    cmd = [sys.executable, "-m", "klear_lib.cli", "run", "96_checked", "-p", "slow=true", "-p", "steps=3", *DIRS,
           "--output-root", str(tmp_path / "out")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((tmp_path / "out").glob("96_checked/*/metrics.jsonl")):
        time.sleep(0.5)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("klear:")]
    assert len(lines) == 1 and "interrupted" in lines[0] and "--resume" in lines[0], err[-2000:]
    run_dir = next((tmp_path / "out" / "96_checked").iterdir())
    assert json.loads((run_dir / "status.json").read_text())["status"] == "interrupted"
    from klear_lib import report

    assert report.read_run(run_dir).status == "interrupted"
    assert cli.main(["run", "--resume", str(run_dir), *DIRS]) == 0
    assert not (run_dir / "status.json").exists() and report.read_run(run_dir).status == "ran"
    assert [r["step"] for r in runs.read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2]
    assert json.loads((run_dir / "params.json").read_text())["resumed"]


def test_a_run_that_went_well_prints_no_kernel_chatter(tmp_path):
    """Every run used to print ipykernel's "running over TCP without encryption" warning, and a run's end often
    "KeyboardInterrupt caught in kernel" (jupyter_client interrupts a kernel before shutting it down). The kernel
    now talks over IPC and is shut down without the interrupt; three runs, since the second line came by a race."""
    from klear_lib import runner

    assert runner.quiet_kernel_manager()().transport == "ipc"
    for _ in range(3):
        done = subprocess.run([sys.executable, "-m", "klear_lib.cli", "run", "99_dummy", "--preset", "smoke", *DIRS,
                               "--output-root", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "without encryption" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr[-2000:]


def test_two_kernels_started_at_once_from_one_folder_do_not_share_sockets(tmp_path, monkeypatch):
    """jupyter_client named a kernel's IPC sockets ``kernel-ipc-<n>`` in the working directory, the lowest free
    ``n``: two `klear run` started together from one checkout (the suite's two workers did, 2026-12-05) took the same
    sockets, each kernel refused the other client's messages ("Invalid Signature") and both runs failed (this test
    on that code: one kernel or neither answered, 3 tries of 3). Two kernels started at once from one folder now each
    answer their own client, and nothing is written into that folder."""
    import threading

    from klear_lib import runner

    monkeypatch.chdir(tmp_path)
    managers = [runner.quiet_kernel_manager()(kernel_name="python3") for _ in range(2)]
    assert managers[0].ip != managers[1].ip and all(pathlib.Path(m.ip).is_absolute() for m in managers)
    barrier, answers = threading.Barrier(2), {}

    def start_and_ask(i):
        barrier.wait()
        managers[i].start_kernel()
        client = managers[i].client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            reply = client.execute_interactive(f"print({i} * 1000 + 7)", timeout=60,
                                               output_hook=lambda m: m["msg_type"] == "stream" and answers.setdefault(
                                                   i, m["content"]["text"]))
            answers[f"status{i}"] = reply["content"]["status"]
        finally:
            client.stop_channels()
            managers[i].shutdown_kernel(now=True)

    threads = [threading.Thread(target=start_and_ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    assert answers == {0: "7\n", 1: "1007\n", "status0": "ok", "status1": "ok"}
    assert list(tmp_path.iterdir()) == []  # no socket files left in the working directory
