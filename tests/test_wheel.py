"""The distribution a TRL or verl user depends on: the wheel's core (no extra) is torch alone, so that it installs
beside their stack without replacing it, and the GPPO+ERC loss runs from that core with nothing else installed.

The wheel is built from a copy of the package's files (pyproject.toml, README.md, LICENSE, klear_lib/), so that
building leaves nothing in the checkout. The install test makes a fresh venv, installs the torch release this venv
runs (from pip's configured sources, else PyTorch's CPU index, as the Makefile fetches it), then the wheel with its
core requirements, and runs a GPPO+ERC loss and its backward there against values computed by hand.
"""

import email.parser
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import venv
import zipfile

import pytest
import torch
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parent.parent
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # the Makefile's fallback
# Nothing a notebook run, a test or an editor needs belongs in what `pip install klear` pulls in.
NOT_IN_CORE = {"papermill", "nbval", "nbformat", "ipykernel", "matplotlib", "pandas", "pytest", "pytest-xdist",
               "hypothesis", "jupytext", "ruff", "tensorboard", "uv", "jupyterlab", "ipywidgets", "trl",
               "transformers", "datasets", "vllm", "verl", "ray"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "klear_lib", src / "klear_lib", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (whl,) = out.glob("klear-*.whl")
    return whl


def metadata(whl: pathlib.Path):
    with zipfile.ZipFile(whl) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode()), z.namelist()


def test_the_wheels_core_is_torch_alone_and_names_its_license(wheel):
    meta, files = metadata(wheel)
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    core = [r for r in reqs if r.marker is None]
    assert [str(r) for r in core] == ["torch>=2.4"], f"the wheel's base requirements: {[str(r) for r in core]}"
    assert not {r.name.lower() for r in core} & NOT_IN_CORE
    extras = set(meta.get_all("Provides-Extra"))
    assert {"trl", "notebooks", "verl", "gpu", "ray", "test", "dev"} <= extras, sorted(extras)
    in_extra = {r.name for r in reqs if r.marker is not None and r.marker.evaluate({"extra": "notebooks"})}
    assert {"papermill", "nbval", "klear"} <= in_extra, "the notebooks' tools moved to the notebooks extra"
    assert meta["License-Expression"] == "Apache-2.0"
    (lic,) = [n for n in files if n.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as z:
        text = z.read(lic).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert text == (ROOT / "LICENSE").read_text()


# GPPO+ERC on one response of three tokens, A = +1, ε = (0.2, 0.28), ERC (0.8, 1.2), token-mean, by hand:
#   r = (1.0, 1.5, 0.9); entropies new (1, 1, 2) over old (1, 1, 1): ρ = (1, 1, 2), token 3 ERC-stopped
#   values -r·A, -(1+ε_h)·A (clipped), -r·A: (-1, -1.28, -0.9) -> loss = -3.18 / 3 = -1.06
#   ∂loss/∂log π: (-r, -(1+ε_h) [GPPO keeps the clipped token's gradient; PPO-clip gives 0], 0 [ERC]) / 3
CORE_SCRIPT = r"""
import importlib.util, json, math, sys
import torch
from klear_lib.losses import compute_policy_loss
from klear_lib.recipe import KlearLossConfig
import klear_lib.integrations.verl as verl_adapter

log_prob = torch.tensor([[0.0, math.log(1.5), math.log(0.9)]], requires_grad=True)
loss, metrics = compute_policy_loss(
    "gppo", old_log_prob=torch.zeros(1, 3), log_prob=log_prob, advantages=torch.ones(1),
    response_mask=torch.ones(1, 3, dtype=torch.bool), config={"erc_low": 0.8, "erc_high": 1.2},
    entropy=torch.tensor([[1.0, 1.0, 2.0]]), old_entropy=torch.ones(1, 3))
loss.backward()
others = [m for m in ("transformers", "trl", "datasets", "numpy", "pandas", "papermill", "verl")
          if importlib.util.find_spec(m) is not None]
print(json.dumps({"loss": loss.item(), "grad": log_prob.grad.tolist()[0], "erc_high": metrics["actor/erc_frac_high"],
                  "recipe": KlearLossConfig().loss_name, "verl_losses": sorted(verl_adapter.LOSSES),
                  "others": others, "torch": torch.__version__}))
"""


def _pip(python: pathlib.Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    return subprocess.run([str(python), "-m", "pip", "install", "-q", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.slow
def test_the_core_installs_beside_torch_alone_and_runs_gppo_with_erc(wheel, tmp_path):
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    torch_req = f"torch=={torch.__version__}"  # the release this venv runs (the CPU build here)
    res = _pip(python, torch_req)
    if res.returncode != 0:
        res = _pip(python, "--extra-index-url", TORCH_CPU_INDEX, torch_req)
    if res.returncode != 0:
        pytest.skip(f"{torch_req} cannot be installed here: {res.stderr.strip()[-300:]}")
    before = set(_freeze(python))
    start = time.perf_counter()
    res = _pip(python, str(wheel), timeout=300)
    seconds = time.perf_counter() - start
    assert res.returncode == 0, res.stderr[-3000:]
    added = set(_freeze(python)) - before
    assert {a.split("==")[0].lower() for a in added} == {"klear"}, f"installing the core added {sorted(added)}"
    assert "torch==" + torch.__version__ in before
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    size = sum(f.stat().st_size for f in (site / "klear_lib").rglob("*") if f.is_file())
    print(f"core install beside torch alone: {seconds:.1f} s, klear_lib {size / 1e6:.2f} MB")
    out = subprocess.run([str(python), "-c", CORE_SCRIPT], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["others"] == [], f"the fresh venv holds more than torch: {got['others']}"
    assert got["loss"] == pytest.approx(-3.18 / 3, abs=1e-6)
    assert got["grad"] == pytest.approx([-1 / 3, -1.28 / 3, 0.0], abs=1e-6)
    assert got["erc_high"] == pytest.approx(1 / 3)
    assert got["recipe"] == "gppo" and {"gppo", "gppo_erc"} <= set(got["verl_losses"])
    pip_check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert pip_check.returncode == 0, pip_check.stdout + pip_check.stderr


def _freeze(python: pathlib.Path) -> list[str]:
    """``name==version`` of every distribution in the venv of ``python``."""
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return [f"{d['name']}=={d['version']}" for d in json.loads(out.stdout)]
