"""tools/gpu_smoke.py (run on GPUs by scripts/gpu_smoke.sh) on the CPU, at its smallest: the script's own code
path stays working between GPU runs. This is not a GPU test: the device checks compare the CPU with itself."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_smoke_script_runs_on_the_cpu(tmp_path):
    out = tmp_path / "smoke"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_smoke.py"), "--device", "cpu", "--rl-steps", "2",
                           "--sft-samples", "300", "--out", str(out)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_smoke.json").read_text())
    rows = {r["check"]: r for r in report["rows"]}
    assert all(r["ok"] for r in report["rows"])
    # on one device the chunked computation still differs from the full-logits one by rounding only
    assert rows["log-prob |device chunked - CPU full logits| max"]["value"] < 1e-4
    assert rows["GPPO+ERC loss |device - CPU|"]["value"] == 0.0
    assert rows["RL steps run"]["value"] == 2
    assert "check" in proc.stdout and "FAIL" not in proc.stdout
