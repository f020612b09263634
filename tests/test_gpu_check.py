"""scripts/gpu_check.sh --cpu (the GPU check's own path on the CPU, at tiny sizes): every stage runs and passes its
checks, vLLM is skipped with its reason, and the JSON holds the measurements; the wheels the check carries to a bare
CUDA machine are the pinned versions and close over their dependencies. Not a GPU test: on the CPU the device checks
compare the CPU with itself."""

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")  # tools/ is no package
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

RUN_STAGES = ("environment", "sft", "fp32_master_weights", "logprob_backends", "rl_hf", "gpu_tests")


def test_gpu_check_cpu_runs_every_stage_and_writes_one_json(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PY": sys.executable}
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json"]  # one flat file under $OUT
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["device"] == "cpu" and report["ok"] is True
    stages = report["stages"]
    assert list(stages) == list(gpu_check.STAGES)
    for name in RUN_STAGES:
        rec = stages[name]
        assert rec["status"] == "passed", (name, rec.get("error"), [c for c in rec["checks"] if not c["ok"]])
        assert rec["checks"] and all(c["ok"] for c in rec["checks"])
        assert rec["seconds"] > 0 and rec["peak_memory_mib"] > 0 and rec["memory_kind"]
    for name in ("sft", "logprob_backends", "rl_hf"):  # the stages that process tokens say how fast
        assert stages[name]["tokens_per_s"] > 0 and stages[name]["tokens_kind"], name
    assert stages["rl_vllm"]["status"] == "skipped" and "GPU" in stages["rl_vllm"]["reason"]
    # what the stages measured, not only that they ran
    lp = {c["name"]: c["value"] for c in stages["logprob_backends"]["checks"]}
    assert lp["fp32: log-prob |klear - TRL| max"] < 1e-5 and lp["fp32: gradient ||klear - TRL|| / ||TRL||"] < 1e-5
    rl = stages["rl_hf"]["metrics"]
    assert rl["steps"] >= 1 and rl["generated_groups"] == [4] and 1 <= rl["kept_groups"][0] <= 2
    assert stages["sft"]["metrics"]["loss_after"] < stages["sft"]["metrics"]["loss_before"]
    tests = stages["gpu_tests"]["metrics"]
    assert tests["counts"]["tests"] >= 2 and all(c["outcome"] == "skipped" for c in tests["cases"])  # no GPU here
    assert report["stages"]["environment"]["metrics"]["versions"]["trl"] == "1.16.0"
    print(f"gpu_check.sh --cpu: {wall:.0f}s wall, stages {[(n, s['seconds']) for n, s in stages.items()]}")


def test_a_failing_stage_is_recorded_and_the_next_still_runs(tmp_path, monkeypatch):
    """Each stage is independent of the others' failure: the error is recorded, the later stages run."""
    def broken(rec, *a):
        raise RuntimeError("planted failure")

    run = gpu_check.Check(tmp_path, "cpu", budget_s=600)
    run.stage("sft", broken)
    run.stage("later", lambda rec, *a: gpu_check.check(rec, "ran", 1, True, "1"))
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["stages"]["sft"]["status"] == "failed" and "planted failure" in report["stages"]["sft"]["error"]
    assert report["stages"]["later"]["status"] == "passed" and report["ok"] is False
    out_of_time = gpu_check.Check(tmp_path, "cpu", budget_s=-1)
    assert out_of_time.stage("x", lambda rec, *a: None)["status"] == "skipped"


def test_the_wheels_are_the_pins_and_close_over_their_dependencies():
    """The wheels scripts/gpu_wheels.sh downloads: trl and datasets at pyproject.toml's pins, their other
    dependencies at the installed versions, and every Requires-Dist of each either among them or on a bare image."""
    pins = dict(re.findall(r'^\s*"([A-Za-z0-9_.-]+)==([^"]+)",', (ROOT / "pyproject.toml").read_text(), re.M))
    assert gpu_check.WHEELS["trl"] == pins["trl"] and gpu_check.WHEELS["datasets"] == pins["datasets"]
    def norm(name: str) -> str:  # a distribution name as pip compares them
        return re.sub(r"[-_.]+", "-", name).lower()

    wheels = {norm(k) for k in gpu_check.WHEELS}
    bare = {norm(b) for b in gpu_check.BARE_IMAGE}
    for name, version in gpu_check.WHEELS.items():
        assert importlib.metadata.version(name) == version, name  # the CPU environment runs the same versions
        for req in importlib.metadata.requires(name) or []:
            if "extra ==" in req:
                continue
            dep = norm(re.match(r"[A-Za-z0-9_.-]+", req).group(0))
            assert dep in wheels or dep in bare, f"{name} needs {dep}: neither carried nor on a bare image"
    listed = subprocess.run([sys.executable, "-S", str(ROOT / "tools" / "gpu_check.py"), "--wheels"],
                            capture_output=True, text=True, timeout=60)  # -S: the standard library only
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [f"{k}=={v}" for k, v in gpu_check.WHEELS.items()]
