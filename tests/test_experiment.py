"""Units of work in worker processes: results, merged metrics in job order, resume without redoing, failures."""

import pytest

from klear_lib import experiment, runs


def jobs_for(tmp_path, ns, fail=()):
    log = str(tmp_path / "calls.log")
    return [experiment.Job(f"job/n={n}", "jobfns:count_and_write", {"n": n, "log": log, "fail": n in fail})
            for n in ns], tmp_path / "calls.log"


def calls(log):
    return sorted(int(x) for x in log.read_text().split()) if log.exists() else []


def test_jobs_run_in_workers_and_metrics_merge_in_job_order(tmp_path):
    jobs, log = jobs_for(tmp_path, [3, 1, 2])
    results = experiment.run_jobs(jobs, tmp_path / "run", workers=2, threads=1, progress=lambda *_: None)
    assert list(results) == ["job/n=3", "job/n=1", "job/n=2"]
    assert all(r["threads"] == 1 and r["seconds"] >= 0 for r in results.values())
    records = runs.read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [(r["n"], r["i"]) for r in records] == [(3, 0), (3, 1), (3, 2), (1, 0), (2, 0), (2, 1)]
    assert calls(log) == [1, 2, 3]


def test_a_failure_names_the_unit_and_a_rerun_redoes_only_what_did_not_finish(tmp_path):
    jobs, log = jobs_for(tmp_path, [1, 2, 3], fail={2})
    expected = r"unit 'job/n=2' \(jobfns:count_and_write\) failed: RuntimeError: job 2 failed on purpose"
    with pytest.raises(experiment.JobFailed, match=expected):
        experiment.run_jobs(jobs, tmp_path / "run", workers=1, progress=lambda *_: None)
    done_before = calls(log)
    assert 2 in done_before
    # the failed job's partial records are kept on disk but not in metrics.jsonl
    merged = runs.read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all(r["n"] != 2 for r in merged)
    fixed, _ = jobs_for(tmp_path, [1, 2, 3])
    lines = []
    results = experiment.run_jobs(fixed, tmp_path / "run", workers=2, progress=lines.append)
    assert lines[0].startswith("resuming:")
    rerun = calls(log)
    for n in done_before:
        rerun.remove(n)
    assert 2 in rerun and 1 not in rerun  # job 1 finished the first time: not run again
    records = runs.read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [(r["n"], r["i"]) for r in records] == [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]  # no duplicate
    assert set(results) == {"job/n=1", "job/n=2", "job/n=3"}


def test_keys_must_be_unique_and_well_formed(tmp_path):
    jobs, _ = jobs_for(tmp_path, [1, 1])
    with pytest.raises(ValueError, match="unique"):
        experiment.run_jobs(jobs, tmp_path / "run")
    with pytest.raises(ValueError, match="module:function"):
        experiment.Job("x", "no_colon")


def _facts(tmp_path, name, threads=1, **kwargs):
    """``jobfns.worker_facts`` of one unit run in its own run directory, ``threads`` torch threads."""
    job = experiment.Job(f"facts/{name}", "jobfns:worker_facts", kwargs)
    return experiment.run_jobs([job], tmp_path / name, workers=1, threads=threads, progress=lambda *_: None)[job.key]


def test_workers_fork_from_a_forkserver_with_the_heavy_imports_in_place(tmp_path):
    import os

    facts = _facts(tmp_path, "a")
    # peft is imported by nothing but the preload (klear_lib.worker_preload): it is there before the unit imports
    assert facts["peft_imported"], facts
    # the worker's parent is this process's forkserver, not this process; a second run_jobs forks from the same one
    assert facts["ppid"] != os.getpid()
    again = _facts(tmp_path, "b")
    assert again["ppid"] == facts["ppid"] and again["pid"] != facts["pid"]


def test_a_forked_worker_sees_the_drivers_environment_and_directory_now(tmp_path, monkeypatch):
    """The forkserver keeps the environment it started with; each worker gets the driver's as it is at run_jobs
    (set, changed, removed) and its working directory, as a spawned worker would."""
    _facts(tmp_path, "start")  # the forkserver runs from here on
    monkeypatch.setenv("KLEAR_TEST_WORKER_VAR", "set after the forkserver started")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    facts = _facts(tmp_path, "set")
    assert (facts["var"], facts["cwd"]) == ("set after the forkserver started", str(tmp_path / "elsewhere"))
    monkeypatch.delenv("KLEAR_TEST_WORKER_VAR")
    assert _facts(tmp_path, "unset")["var"] is None


def test_a_forked_worker_computes_on_several_threads_as_this_process_does(tmp_path):
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.rand(384, 384, generator=g, dtype=torch.float64)
    facts = _facts(tmp_path, "threads", threads_op=True, threads=2)
    assert facts["threads"] == 2
    assert facts["checksum"] == pytest.approx(float((a @ a).sum()), rel=1e-12)


def test_a_damaged_unit_record_is_named_and_its_unit_runs_again(tmp_path):
    """A truncated done mark (a crash or a full disk outside klear's atomic writes) or a cut records file no longer
    fails the resume with a JSONDecodeError naming no file: the line names the file, and that unit runs again."""
    import json

    jobs, log = jobs_for(tmp_path, [1, 2, 3])
    run = tmp_path / "run"
    experiment.run_jobs(jobs, run, workers=1, progress=lambda *_: None)
    done = run / "units" / "job_n=2.json"
    done.write_text(done.read_text()[:9])
    records = run / "units" / "job_n=1.jsonl"
    records.write_text(records.read_text()[:-4] + "\n")
    lines = []
    results = experiment.run_jobs(jobs, run, workers=1, progress=lines.append)
    assert lines[0].startswith(f"unit 'job/n=1': its record is damaged ({records} line 1: JSONDecodeError: ")
    assert lines[1].startswith(f"unit 'job/n=2': its record is damaged ({done}: JSONDecodeError: ")
    assert lines[0].endswith("; running it again") and lines[2] == "resuming: 1 of 3 units already done, 2 to run"
    assert calls(log) == [1, 1, 2, 2, 3]  # the two damaged units ran again, the sound one did not
    assert json.loads(done.read_text())["n"] == 2 and results["job/n=1"]["n"] == 1
    merged = runs.read_metrics(run / "metrics.jsonl")
    assert [(r["n"], r["i"]) for r in merged] == [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]
