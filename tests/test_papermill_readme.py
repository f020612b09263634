"""The README's plain-papermill command runs as written, at the `smoke` preset: papermill reads the preset with
PyYAML (YAML 1.1), where `4e-3` would be a string, and without klear its run still lands in its own run directory
under the output root, marked `smoke` (preset.json) for the report."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import nbformat

from klear_lib import report, runs

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_readme_papermill_command_runs_at_smoke(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    [command] = re.findall(r"`(\.venv/bin/papermill notebooks/\S+ outputs/\S+ -f params/\S+/smoke\.yaml)`", readme)
    argv = shlex.split(command)
    # Run it as written, word for word, from a folder that looks like the checkout (its notebooks, presets, venv and
    # outputs/), so that the relative paths resolve and the executed copy lands there, not in the repository.
    for name in ("notebooks", "params"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / ".venv").symlink_to(pathlib.Path(sys.executable).parent.parent)
    out_root = tmp_path / "outputs"
    out_root.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "KLEAR_OUTPUT_ROOT": str(out_root), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("KLEAR_LAUNCHER", None)
    env.pop("KLEAR_PARAMS_DIR", None)
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    executed = nbformat.read(tmp_path / argv[2], as_version=4)
    assert argv[2].startswith("outputs/")  # not in the checkout's tracked files
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    [run_dir] = sorted((out_root / "07_evaluation").iterdir())
    assert runs.check_run_dir(run_dir) == []
    record = json.loads((run_dir / runs.PRESET_FILE).read_text())
    assert (record["preset"], record["launcher"]) == ("smoke", "kernel"), record
    assert record["params"]["sft_lr"] == 0.004  # a float, as the preset means it
    run = report.read_run(run_dir)
    assert (run.status, run.preset) == ("ran", "smoke")
    # the run's cached SFT start lies in its own output root, beside its run directories (notebook.cache_root)
    assert any((out_root / ".cache").glob("*/manifest.json")), sorted(out_root.iterdir())
