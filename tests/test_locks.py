"""The lock files in locks/ against pyproject.toml and their inputs (tools/lock.py writes them; docs/scale.md).

Offline: every lock line is an exact pin; pyproject's core requirements are ranges (torch alone) that every lock
admits, its extras exact pins; each environment built on pyproject.toml holds every pin of its extras at the same
version; the unsloth and verl environments (klear installed there with --no-deps) agree with pyproject wherever they
hold the same package, except the differences their .in files declare with a reason; the CPU lock holds torch's CPU
build and nothing CUDA, torchvision, torchaudio or torchcodec; the GPU locks' vLLM is inside TRL's supported range.
The set-up venv passes `pip check`. Online (PyPI): recompiling every lock gives the committed files (tools/lock.py
--check).
"""

import importlib.util
import inspect
import os
import pathlib
import re
import subprocess
import sys
import urllib.request

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11 (the project's version)")

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("klear_lock_tool", ROOT / "tools" / "lock.py")
lock_tool = sys.modules.setdefault("klear_lock_tool", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(lock_tool)  # registered first: its dataclass looks its module up by name

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")
DIFFERS = "# differs from pyproject:"
LOCKS = [(env, py) for env in lock_tool.ENVIRONMENTS for py in env.pythons]
LOCK_IDS = [f"{env.name}-py{py}" for env, py in LOCKS]


def read_lock(path: pathlib.Path) -> dict[str, Version]:
    """{canonical name: version} of a lock; asserts every requirement line is one exact pin, each package once."""
    pins = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = PIN.match(line)
        assert m, f"{path.name}:{n}: {line!r} is not an exact pin (name==version)"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"{path.name}:{n}: {name} pinned twice"
        pins[name] = Version(m.group(2))
    return pins


def read_via(path: pathlib.Path) -> dict[str, set[str]]:
    """{canonical name: the packages uv's annotations say require it} of a lock."""
    via, current = {}, None
    for line in path.read_text().splitlines():
        if m := PIN.match(line):
            current = canonicalize_name(m.group(1))
            via[current] = set()
        elif current and (m := re.match(r"^\s+#\s+(?:via\s+)?([A-Za-z0-9][A-Za-z0-9._-]*)", line)):
            if m.group(1) != "via":
                via[current].add(canonicalize_name(m.group(1)))
    return via


def pyproject_requirements(extras=()) -> list[Requirement]:
    """The core requirements and those of ``extras``, an extra that names klear's own (``klear[trl]``) expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs, todo, seen = [Requirement(r) for r in project["dependencies"]], list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for r in map(Requirement, project["optional-dependencies"][extra]):
            if canonicalize_name(r.name) == "klear":
                todo += sorted(r.extras)
            else:
                reqs.append(r)
    return reqs


def by_name(reqs: list[Requirement]) -> dict[str, list[Requirement]]:
    """{canonical name: its requirements} (torch has two: the core's range and the notebooks' pin)."""
    out: dict[str, list[Requirement]] = {}
    for r in reqs:
        out.setdefault(canonicalize_name(r.name), []).append(r)
    return out


def exact_version(req: Requirement) -> Version:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req} is not an exact pin"
    return Version(spec.version)


def admits(req: Requirement, version: Version) -> bool:
    """``req``'s versions hold ``version`` (its public part: torch==2.13.0 admits the CPU build 2.13.0+cpu)."""
    return req.specifier.contains(Version(version.public), prereleases=True)


def agrees(ours: Requirement, theirs: Requirement) -> bool:
    """A lock input agrees with a pyproject requirement: the same extras where pyproject pins exactly, and a version
    pyproject admits."""
    same_extras = ours.extras == theirs.extras or not any(s.operator == "==" for s in ours.specifier)
    return same_extras and admits(ours, exact_version(theirs))


def read_in(path: pathlib.Path) -> dict[str, tuple[Requirement, str | None]]:
    """{canonical name: (requirement, declared reason or None)} of a .in file."""
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        req_text, _, comment = line.partition("#")
        if not req_text.strip():
            continue
        req = Requirement(req_text.strip())
        reason = None
        if ("#" + comment).startswith(DIFFERS):
            reason = ("#" + comment)[len(DIFFERS):].strip()
            assert reason, f"{path.name}:{n}: a declared difference needs its reason"
        out[canonicalize_name(req.name)] = (req, reason)
    return out


def lock_pins(env, python):
    return read_lock(env.lock(python))


def test_every_lock_is_written_by_the_tool_and_none_else():
    assert {p.name for p in (ROOT / "locks").glob("*.txt")} == {env.lock(py).name for env, py in LOCKS}


@pytest.mark.parametrize("env,python", LOCKS, ids=LOCK_IDS)
def test_lock_is_exact_pins_from_the_tool_without_machine_paths(env, python):
    path = env.lock(python)
    text = path.read_text()
    pins = read_lock(path)
    assert len(pins) > 50, f"{path.name}: only {len(pins)} pins"
    assert text.startswith("# This file was autogenerated by uv via the following command:\n"
                           f"#    {lock_tool.COMMAND}\n"), f"{path.name}: not written by {lock_tool.COMMAND}"
    for bad in ("/opt/", "/tmp/", "/work/", "/root/", "/home/", "file:", "--find-links", "--index-url"):
        assert bad not in text, f"{path.name} mentions {bad!r}: a lock must install on any machine"


@pytest.mark.parametrize("env,python", [(e, p) for e, p in LOCKS if e.on_pyproject],
                         ids=[i for (e, _), i in zip(LOCKS, LOCK_IDS) if e.on_pyproject])
def test_pyproject_pins_are_in_its_locks(env, python):
    pins = lock_pins(env, python)
    for req in pyproject_requirements(env.extras):
        name = canonicalize_name(req.name)
        assert name in pins, f"{env.lock(python).name} lacks {req} (pyproject.toml)"
        got = pins[name]
        # torch==2.13.0 admits its CPU build 2.13.0+cpu (PEP 440: a pin without a local label matches any label)
        assert admits(req, got), f"{env.lock(python).name}: {name}=={got}, pyproject.toml requires {req}"


def test_the_core_is_ranges_every_lock_admits_and_every_extra_exact_pins():
    """The core (no extra) installs beside another torch stack: lower-bounded ranges, each admitting the version of
    every lock that holds the package (the ends tested: torch 2.13.0 in cpu/gpu/unsloth, 2.11.0 in verl); the extras
    are the reproducibility stack, exact pins (or another of klear's extras)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = [Requirement(r) for r in project["dependencies"]]
    assert [canonicalize_name(r.name) for r in core] == ["torch"], "the core is torch alone (tests/test_wheel.py)"
    held = set()
    for req in core:
        assert any(s.operator == ">=" for s in req.specifier), f"{req}: the core's ranges need a lower bound"
        assert not any(s.operator == "==" for s in req.specifier), f"{req}: the core pins nothing exactly"
        for env, python in LOCKS:
            got = lock_pins(env, python).get(canonicalize_name(req.name))
            if got is not None:
                held.add(Version(got.public))
                assert admits(req, got), f"{env.lock(python).name}: {req.name}=={got} outside the core's {req}"
    assert {Version("2.11.0"), Version("2.13.0")} <= held, f"torch versions of the locks: {sorted(held)}"
    for extra, reqs in project["optional-dependencies"].items():
        for req in map(Requirement, reqs):
            if canonicalize_name(req.name) == "klear":
                assert set(req.extras) <= set(project["optional-dependencies"]), f"[{extra}]: {req}"
            else:
                exact_version(req)


def test_cpu_lock_has_the_cpu_torch_and_nothing_cuda():
    (env,) = [e for e in lock_tool.ENVIRONMENTS if e.cpu_torch]
    for python in env.pythons:
        pins = lock_pins(env, python)
        assert pins["torch"].local == "cpu", f"torch=={pins['torch']}: the CPU lock must name the CPU build"
        # They break `import transformers` next to the CPU torch (the project's rule).
        for name in ("torchvision", "torchaudio", "torchcodec"):
            assert name not in pins, f"{env.lock(python).name} holds {name}"
        cuda = sorted(n for n in pins if n.startswith(("nvidia-", "cuda-")) or n == "triton")
        assert not cuda, f"{env.lock(python).name} holds CUDA packages {cuda}"


def trl_supported_vllm() -> tuple[Version, Version]:
    """TRL's supported vLLM range, read from the installed TRL's own check."""
    from trl import import_utils
    src = inspect.getsource(import_utils.is_vllm_available)
    m = re.search(r'Version\("([\d.]+)"\)\s*<=\s*\w+\s*<=\s*Version\("([\d.]+)"\)', src)
    assert m, "TRL's is_vllm_available no longer states its vLLM range as expected: re-read it"
    return Version(m.group(1)), Version(m.group(2))


def test_gpu_locks_take_a_vllm_trl_supports_built_for_the_pinned_torch():
    import trl
    gpu = by_name(pyproject_requirements(("gpu",)))
    (torch_pin,) = [exact_version(r) for r in gpu["torch"] if r.specifier.__str__().startswith("==")]
    (trl_pin,) = map(exact_version, gpu["trl"])
    assert Version(trl.__version__) == trl_pin
    low, high = trl_supported_vllm()
    for python in ("3.11", "3.12"):
        env = next(e for e in lock_tool.ENVIRONMENTS if e.name == "gpu")
        path = env.lock(python)
        pins = read_lock(path)
        assert low <= pins["vllm"] <= high, f"{path.name}: vllm=={pins['vllm']} outside TRL's {low}-{high}"
        assert pins["torch"] == torch_pin, f"{path.name}: torch=={pins['torch']}, pyproject pins {torch_pin}"
        # vLLM's wheels are compiled against one torch release and require it exactly: the resolver put vllm among
        # the packages that constrain torch here, so the torch above is the one this vllm asks for.
        assert "vllm" in read_via(path)["torch"], f"{path.name}: vllm is not among torch's dependents"


@pytest.mark.parametrize("env", [e for e in lock_tool.ENVIRONMENTS if not e.on_pyproject], ids=lambda e: e.name)
def test_own_environments_agree_with_pyproject_but_where_declared(env):
    (in_file,) = [ROOT / p for p in env.inputs]
    declared = read_in(in_file)
    pyproject = by_name(pyproject_requirements(env.compared_extras))
    for name, (req, reason) in declared.items():
        if reason is not None:
            assert name in pyproject, f"{in_file.name}: {name} declared different but pyproject.toml does not pin it"
            assert not all(agrees(ours, req) for ours in pyproject[name]), (
                f"{in_file.name}: {req} is declared different from pyproject's {pyproject[name]} but agrees")
        elif name in pyproject:
            for ours in pyproject[name]:
                assert agrees(ours, req), (f"{in_file.name}: {req} differs from pyproject's {ours}: align it or "
                                           f"declare it (`{DIFFERS} <reason>`)")
    for python in env.pythons:
        pins = lock_pins(env, python)
        for name, (req, _) in declared.items():
            assert pins.get(name) == exact_version(req), f"{env.lock(python).name}: {name}=={pins.get(name)}, " \
                                                         f"{in_file.name} pins {req}"
        for name, reqs in pyproject.items():
            if name in pins and name not in declared:
                for ours in reqs:
                    assert admits(ours, pins[name]), (
                        f"{env.lock(python).name}: {name}=={pins[name]} but pyproject.toml requires {ours}: pin it "
                        f"in {in_file.name}, declared (`{DIFFERS} <reason>`) if it must differ")


def test_unsloth_environment_is_what_the_docs_say():
    """unsloth's own environment exists because unsloth caps trl and datasets below the main pins."""
    env = next(e for e in lock_tool.ENVIRONMENTS if e.name == "unsloth")
    main = {canonicalize_name(r.name): exact_version(r) for r in pyproject_requirements(("notebooks",))
            if any(s.operator == "==" for s in r.specifier)}
    for python in env.pythons:
        pins = lock_pins(env, python)
        assert pins["trl"] < main["trl"] and pins["datasets"] < main["datasets"]
        assert pins["transformers"] == main["transformers"] and pins["torch"] == main["torch"]


def test_environment_yml_installs_the_cpu_lock():
    text = (ROOT / "environment.yml").read_text()
    env = next(e for e in lock_tool.ENVIRONMENTS if e.cpu_torch)
    (python,) = env.pythons
    assert re.search(rf"^\s*- python={re.escape(python)}\s*$", text, re.M), "environment.yml's Python is not the lock's"
    assert f"-r {env.lock(python).relative_to(ROOT)}" in text


def test_pip_check_passes_in_this_venv():
    """The set-up venv is consistent: verl's loss code lives outside site-packages, where pip does not check it."""
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"pip check in {sys.prefix}:\n{out.stdout}{out.stderr}"


def pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10):
            return True
    except OSError:
        return False


@pytest.mark.slow
def test_locks_recompile_to_the_committed_files():
    """tools/lock.py --check: PyPI as of the tool's --exclude-newer date, from the committed locks (as a write
    starts), gives back every committed lock; an input changed without its lock fails it. CI reaches
    PyPI (it runs there as a failure, not a skip); elsewhere an unreachable PyPI skips."""
    if not pypi_reachable():
        if os.environ.get("CI"):
            pytest.fail("PyPI is unreachable from CI")
        pytest.skip("PyPI is unreachable")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "lock.py"), "--check"], capture_output=True,
                         text=True, timeout=1800, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-4000:]
