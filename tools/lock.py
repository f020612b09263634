"""Write and check the lock files in ``locks/``: one per environment and Python version (docs/scale.md).

    python tools/lock.py            # (re)write every lock
    python tools/lock.py --check    # recompile into a temporary folder and diff against the committed locks

Each lock is ``uv pip compile`` output for Linux x86_64 (manylinux_2_28) and one Python version, resolved against
PyPI as it stood at ``EXCLUDE_NEWER``, starting from the lock already there (uv keeps each pin that the inputs
still allow). ``--check`` starts from the committed lock too, so it fails only when an input (``pyproject.toml``,
``locks/*.in``) changed without its lock; not when the index later shows a release dated before
``EXCLUDE_NEWER`` (a mirror filled in late did, on 2026-12-02: httpx 0.29.0, accelerate 1.16.0). Needs uv
``UV_VERSION`` (the ``test`` extra installs it; other uv versions word the files differently) and PyPI.

The CPU lock names torch's CPU build (``torch==2.13.0+cpu``), which is on PyTorch's CPU index, not on PyPI. uv is
pointed at that one wheel, which pip fetches first: from pip's own configuration where it finds it there (a local
wheel folder), else from PyTorch's CPU index. No machine path ends up in a lock: uv writes the command below as
the header, not its own.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import difflib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOCKS = ROOT / "locks"
UV_VERSION = "0.13.9"
EXCLUDE_NEWER = "2026-12-01T00:00:00Z"
PLATFORM = "x86_64-manylinux_2_28"  # uv's name
PIP_PLATFORM = "manylinux_2_28_x86_64"  # pip's name for the same
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
COMMAND = "python tools/lock.py"


@dataclasses.dataclass(frozen=True)
class Environment:
    name: str
    use: str
    inputs: tuple[str, ...]  # relative to the repository root, as uv writes them into the lock's annotations
    pythons: tuple[str, ...]
    extras: tuple[str, ...] = ()  # pyproject extras resolved into the lock (environments built on pyproject.toml)
    # Environments not built on pyproject.toml (klear goes in with --no-deps): pyproject's base pins and these
    # extras' pins must agree with the lock wherever the same package is in it, or be declared different in the
    # .in file (``# differs from pyproject: <reason>``); tests/test_locks.py checks it.
    compared_extras: tuple[str, ...] = ()
    cpu_torch: bool = False  # the lock names torch's CPU build

    def lock(self, python: str) -> pathlib.Path:
        return LOCKS / f"{self.name}-py{python.replace('.', '')}.txt"

    @property
    def on_pyproject(self) -> bool:
        return "pyproject.toml" in self.inputs


ENVIRONMENTS = (
    Environment("cpu", "CPU suite, notebooks, JupyterLab (make test, make reproduce)",
                ("pyproject.toml", "locks/cpu.in"), ("3.11",), extras=("dev",), cpu_torch=True),
    Environment("gpu", "GPU training and evaluation with vLLM (pip install -e '.[gpu]')",
                ("pyproject.toml",), ("3.11", "3.12"), extras=("gpu", "test", "lab")),  # gpu includes trl, notebooks
    Environment("unsloth", "SFT with unsloth (its own: unsloth caps trl and datasets below the main pins)",
                ("locks/unsloth.in",), ("3.11", "3.12"), compared_extras=("notebooks", "test")),
    Environment("verl", "RL on verl + Ray (its own: verl 0.9.1 pins torch 2.11.0 and transformers 5.9.0)",
                ("locks/verl.in",), ("3.11", "3.12"), compared_extras=("trl", "verl", "ray", "verl-test")),
)


def uv_command() -> list[str]:
    """uv ``UV_VERSION``: the one this Python has (the ``test`` extra), else the one on PATH."""
    candidates = [[sys.executable, "-m", "uv"]]
    if shutil.which("uv"):
        candidates.append([shutil.which("uv")])
    seen = []
    for cmd in candidates:
        try:
            out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if out.returncode != 0:
            continue
        version = out.stdout.split()[1] if len(out.stdout.split()) > 1 else out.stdout.strip()
        if version == UV_VERSION:
            return cmd
        seen.append(f"{' '.join(cmd)} is {version}")
    raise SystemExit(f"tools/lock.py needs uv {UV_VERSION} (pip install uv=={UV_VERSION}, or the test extra); "
                     f"found: {', '.join(seen) or 'none'}")


def uv_env() -> dict[str, str]:
    """The environment without uv settings that would change a resolution (indexes, find-links, exclude-newer)."""
    keep = {"UV_CACHE_DIR", "UV_NO_CACHE", "UV_OFFLINE", "UV_HTTP_TIMEOUT", "UV_CONCURRENT_DOWNLOADS"}
    return {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in keep}


def cpu_torch_requirement() -> str:
    """The ``torch==X+cpu`` line of locks/cpu.in."""
    for line in (LOCKS / "cpu.in").read_text().splitlines():
        req = line.split("#", 1)[0].strip()
        if req.startswith("torch=="):
            return req
    raise SystemExit("locks/cpu.in has no torch==<version>+cpu line")


def fetch_cpu_torch(into: pathlib.Path, python: str) -> None:
    """Download the CPU torch wheel for ``python`` into ``into`` with pip: from where pip is configured to look
    first (a local wheel folder, a mirror), then from PyTorch's CPU index."""
    req = cpu_torch_requirement()
    base = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", python, "--platform", PIP_PLATFORM, "-d", str(into), req]
    for extra in ([], ["--extra-index-url", TORCH_CPU_INDEX]):
        out = subprocess.run(base + extra, capture_output=True, text=True)
        if out.returncode == 0:
            return
    raise SystemExit(f"pip could not fetch {req} for Python {python} (from its configured sources nor "
                     f"{TORCH_CPU_INDEX}):\n{out.stderr[-3000:]}")


def compile_lock(uv: list[str], env: Environment, python: str, out: pathlib.Path, wheels: pathlib.Path) -> None:
    cmd = [*uv, "pip", "compile", *env.inputs]
    for extra in env.extras:
        cmd += ["--extra", extra]
    cmd += ["--python-version", python, "--python-platform", PLATFORM, "--no-python-downloads", "--no-config",
            "--exclude-newer", EXCLUDE_NEWER, "--custom-compile-command", COMMAND, "--quiet", "-o", str(out)]
    if env.cpu_torch:
        wheels.mkdir(parents=True, exist_ok=True)
        fetch_cpu_torch(wheels, python)
        cmd += ["--find-links", str(wheels)]
    res = subprocess.run(cmd, cwd=ROOT, env=uv_env(), capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{env.lock(python).relative_to(ROOT)} does not resolve:\n{res.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="recompile into a temporary folder and diff; write nothing")
    args = ap.parse_args(argv)
    uv = uv_command()
    stale = []
    with tempfile.TemporaryDirectory(prefix="klear-lock-") as tmp:
        tmp = pathlib.Path(tmp)
        wheels = tmp / "wheels"  # one folder per Python version: the CPU torch wheel of each
        jobs = [(env, python, env.lock(python)) for env in ENVIRONMENTS for python in env.pythons]
        outs = [tmp / target.name if args.check else target for _, _, target in jobs]
        if args.check:  # from the committed lock, as a write starts from it: uv keeps a pin its inputs still allow
            for (_, _, target), out in zip(jobs, outs):
                if target.exists():
                    shutil.copyfile(target, out)
        # The resolutions are independent and wait mostly on PyPI: run them at once (uv locks its shared cache).
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as ex:
            futures = [ex.submit(compile_lock, uv, env, python, out, wheels / python)
                       for (env, python, _), out in zip(jobs, outs)]
        for (env, python, target), out, fut in zip(jobs, outs, futures):
            fut.result()  # a lock that does not resolve raises its SystemExit here, in the order of ENVIRONMENTS
            if not args.check:
                print(f"wrote {target.relative_to(ROOT)}: {count_pins(out)} packages")
                continue
            old = target.read_text().splitlines(keepends=True) if target.exists() else []
            new = out.read_text().splitlines(keepends=True)
            if old != new:
                stale.append(target.relative_to(ROOT))
                sys.stdout.writelines(difflib.unified_diff(old, new, str(target.relative_to(ROOT)), "recompiled"))
            else:
                print(f"{target.relative_to(ROOT)}: up to date ({count_pins(out)} packages)")
    if stale:
        print(f"stale: {', '.join(map(str, stale))}; run `{COMMAND}` and commit the locks", file=sys.stderr)
        return 1
    return 0


def count_pins(path: pathlib.Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line and not line.startswith(("#", " ")))


if __name__ == "__main__":
    sys.exit(main())
