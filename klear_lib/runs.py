"""The run-directory contract: what every run writes, and the only thing plots and reports read.

A run directory is ``<output_root>/<notebook name>/<YYYYmmdd-HHMMSS>`` (``create_run_dir``) and holds:

==================  ===========================================================================
``config.json``     the resolved run config (``write_run_metadata``), sorted keys
``versions.json``   python, platform, the processor, the versions of the packages that shape a result, and
                    ``sandbox``: how the code sandbox bounds a sample here (``cgroup v2``/``cgroup v1``/``none``),
                    ``sampler``: the generation path (``klear_lib.sampler.setting``, switch ``KLEAR_SAMPLER``;
                    written by the callers, ``notebook.start_run`` and ``train.launch``, which sit above both)
``git.json``        ``{"commit", "dirty", "branch", "root"}`` of the checkout that ran
``metrics.jsonl``   one JSON object per line, appended as training goes (``MetricsWriter``)
``summary.json``    the run's final numbers (``write_summary``)
``notebook.ipynb``  the executed notebook, when the run went through ``klear run`` (papermill)
``params.json``     the notebook parameters ``klear run`` passed, written before execution, and
                    ``workers_resolved``: the worker counts this machine gave (``workers: auto`` -> its cores)
``preset.json``     the preset the parameters are (or ``custom``, with what differs), and the launcher
==================  ===========================================================================

Every file is written whole or not at all (``write_atomic``: a temporary file, fsync'ed, renamed), except
``metrics.jsonl``, which is appended one whole line at a time (``MetricsWriter``). A full disk therefore leaves
each file as it was before the failed write, and ``is_disk_full`` recognises the error.

JSON encoding (``to_jsonable``): numpy and torch scalars become Python numbers, tensors and arrays
lists, dataclasses dicts, paths strings. The files are strict JSON (RFC 8259), readable by any tool:
NaN is written as ``null`` and ±inf as ``±1e999`` (a valid JSON number that every IEEE-754 parser,
Python's included, reads back as ±inf). ``read_metrics`` reads ``null`` back as NaN, so a metric
round-trips; in metrics, ``null`` means "no value" (pandas reads it as NaN too).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import errno
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import random
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

CONFIG_FILE = "config.json"
VERSIONS_FILE = "versions.json"
GIT_FILE = "git.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
NOTEBOOK_FILE = "notebook.ipynb"  # written by `klear run`, not by the notebook itself
PARAMS_FILE = "params.json"  # written by `klear run` before it executes the notebook
STATUS_FILE = "status.json"  # written by `klear run` (klear_lib.runner) when a run is interrupted or fails
PRESET_FILE = "preset.json"  # which preset the run's parameters are, however it was launched (write_preset_record)

# What every run directory holds, however it was run. A run through `klear run` also holds NOTEBOOK_FILE:
# check it with `check_run_dir(d, RUN_CONTRACT + (NOTEBOOK_FILE,))`.
RUN_CONTRACT = (CONFIG_FILE, VERSIONS_FILE, GIT_FILE, METRICS_FILE, SUMMARY_FILE)

# Distributions whose version can change a result (pip names; klear_lib is the "klear" distribution).
TRACKED_PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "datasets",
    "tokenizers",
    "papermill",
    "nbval",
    "numpy",
    "klear_lib",
)
NOT_INSTALLED = "not installed"

# ----------------------------------------------------------------------------------------------------------
# Seeding: the one place the project sets seeds.


def set_seed(seed: int) -> None:
    """Seed Python's `random`, numpy and torch (all devices) from one integer: the generators transformers'
    `set_seed` seeds, to the same states, without importing transformers (≈5 CPU-seconds in a process, a kernel
    among them, that does not otherwise need it).

    Deterministic kernels (`torch.use_deterministic_algorithms`) are not switched on: on CPU the project's
    runs repeat bit for bit without them, and on GPU they cost speed and fail on some ops.
    PYTHONHASHSEED cannot be set from inside a running process; it does not affect the project's results.
    """
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    try:
        import torch
    except ImportError:
        pass
    else:
        torch.manual_seed(seed)  # also seeds every CUDA device (and the other accelerators torch knows)


# ----------------------------------------------------------------------------------------------------------
# Run directories.


def create_run_dir(root: str | os.PathLike, name: str, *, stamp: str | None = None) -> pathlib.Path:
    """Create and return a new, empty ``root/name/<stamp>``; the stamp defaults to the local YYYYmmdd-HHMMSS.

    If that folder exists (two runs in the same second), ``-2``, ``-3``, ... is appended. ``mkdir`` without
    ``exist_ok`` is atomic, so concurrent runs never share a folder.
    """
    if not name or pathlib.Path(name).name != name or name in (".", ".."):
        raise ValueError(f"run name must be a plain folder name, got {name!r}")
    stamp = stamp or _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    parent = pathlib.Path(root) / name
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        candidate = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise RuntimeError(f"no free run directory name for {parent / stamp}")


def check_run_dir(run_dir: str | os.PathLike, contract: Iterable[str] = RUN_CONTRACT) -> list[str]:
    """Return the files of `contract` that `run_dir` lacks, in contract order (empty: the run is complete)."""
    run_dir = pathlib.Path(run_dir)
    return [f for f in contract if not (run_dir / f).is_file()]


# ----------------------------------------------------------------------------------------------------------
# JSON encoding shared by every file of the contract.


def to_jsonable(obj: Any, where: str = "value") -> Any:
    """Convert `obj` into plain JSON types (see the module docstring for NaN/inf); `where` names it in errors."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)  # also turns an IntEnum or a bool-like subclass into a plain int
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        return float(obj)  # ±inf stays a float here; to_json_text writes it as ±1e999
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value, where)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name), f"{where}.{f.name}") for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, (set, frozenset)):
        return [to_jsonable(v, f"{where}[]") for v in sorted(obj, key=repr)]
    # numpy scalars/arrays and torch tensors, without importing either: both have .tolist()
    # (a 0-d array or tensor and a numpy scalar give a Python scalar, anything else a nested list).
    tolist = getattr(obj, "tolist", None)
    if callable(tolist) and type(obj).__module__.split(".")[0] in ("numpy", "torch"):
        if hasattr(obj, "detach"):
            obj = obj.detach().cpu()
            tolist = obj.tolist
        return to_jsonable(tolist(), where)
    raise TypeError(f"{where}: cannot write a {type(obj).__qualname__} to JSON")


# json.dumps cannot write ±inf as a JSON number (it writes the non-standard `Infinity`), so infinities
# travel through it as sentinel strings and become `1e999` in the text.
_INF_TOKENS = {math.inf: '"__klear_pos_inf__"', -math.inf: '"__klear_neg_inf__"'}


def _encode_inf(obj: Any) -> Any:
    if isinstance(obj, float) and math.isinf(obj):
        return _INF_TOKENS[obj][1:-1]
    if isinstance(obj, dict):
        return {k: _encode_inf(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_encode_inf(v) for v in obj]
    return obj


def to_json_text(obj: Any, where: str = "value", **dumps_kwargs: Any) -> str:
    """`obj` as strict JSON text (`to_jsonable`, then ±inf as ±1e999); `dumps_kwargs` go to json.dumps."""
    text = json.dumps(_encode_inf(to_jsonable(obj, where)), allow_nan=False, **dumps_kwargs)
    return text.replace(_INF_TOKENS[math.inf], "1e999").replace(_INF_TOKENS[-math.inf], "-1e999")


def write_atomic(path: str | os.PathLike, data: str | bytes, *, fsync: bool = True) -> None:
    """Write `data` to `path` whole or not at all: into a temporary file beside it (fsync'ed unless ``fsync`` is
    False), renamed over `path`. A crash or a full disk leaves the old file (or none) and no temporary file."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(err, OSError) and err.filename is None:
            err.filename = str(path)  # a failed write() names no file: name the one that was being written
        raise
    if fsync:  # the rename itself: cheap, and a crash right after it then keeps the new file
        try:
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass


def _write_json(path: pathlib.Path, obj: Any) -> None:
    """Write `obj` as sorted, indented JSON, atomically (a crash leaves the old file or the new one)."""
    write_atomic(path, to_json_text(obj, path.stem, sort_keys=True, indent=2) + "\n")


# ----------------------------------------------------------------------------------------------------------
# Free space.

MIN_FREE_MB = 200
"""``klear run`` refuses to start with less free space than this on the output root (``KLEAR_MIN_FREE_MB``
changes it): a tiny-preset notebook writes a few MB to 60 MB (models, figures, records), a GPU preset GBs."""
MIN_FREE_ENV = "KLEAR_MIN_FREE_MB"
_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "StorageFull", "QuotaExceeded")


def min_free_mb() -> float:
    """The free space ``klear run`` needs to start, in MB: ``KLEAR_MIN_FREE_MB`` or ``MIN_FREE_MB``."""
    value = os.environ.get(MIN_FREE_ENV, "")
    try:
        return float(value) if value.strip() else float(MIN_FREE_MB)
    except ValueError:
        raise ValueError(f"{MIN_FREE_ENV}={value!r}: expected a number of MB") from None


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes (for an unprivileged user) on the filesystem holding `path` or its nearest existing parent."""
    path = pathlib.Path(path).absolute()
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def describe_free(path: str | os.PathLike) -> str:
    """``"3.1 MB free on /mnt/out"`` (the filesystem of `path`), or ``"free space unknown"``."""
    free = free_bytes(path)
    if free is None:
        return "free space unknown"
    return f"{free / 1e6:.1f} MB free on {path}"


def is_disk_full(err: BaseException | str) -> bool:
    """Whether `err` (an exception, its chain, or a message) says the disk or the quota is full: ENOSPC, EDQUOT,
    or the text those give (also safetensors' ``StorageFull`` and a worker's traceback)."""
    seen = 0
    while isinstance(err, BaseException) and seen < 20:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(t in str(err) for t in _FULL_TEXTS):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return isinstance(err, str) and any(t in err for t in _FULL_TEXTS)


# ----------------------------------------------------------------------------------------------------------
# Metadata: config, versions, git.


def package_versions(names: Iterable[str] = TRACKED_PACKAGES) -> dict[str, str]:
    """Installed version of each distribution in `names`, or "not installed"; read from metadata, no imports."""
    out = {}
    for name in names:
        dist = "klear" if name == "klear_lib" else name
        try:
            out[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            if name == "klear_lib":  # running from a checkout that was never pip-installed
                from klear_lib import __version__

                out[name] = f"{__version__} (not pip-installed)"
            else:
                out[name] = NOT_INSTALLED
    return out


def _git(args: list[str], cwd: pathlib.Path) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):  # no git binary, or a hung one
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_info(*search: str | os.PathLike) -> dict[str, Any]:
    """Commit, dirty flag and branch of the first git checkout found among `search`.

    By default it looks at the checkout holding the klear_lib package (the code that ran), then at the
    current directory. Outside any checkout: ``{"commit": "unknown", "dirty": None, "branch": None}``.
    "dirty" counts changes to tracked files only (untracked files such as run outputs do not count).
    A detached HEAD has branch None.
    """
    if not search:
        search = (pathlib.Path(__file__).resolve().parent, pathlib.Path.cwd())
    for d in search:
        d = pathlib.Path(d)
        if not d.is_dir():
            continue
        root = _git(["rev-parse", "--show-toplevel"], d)
        if root is None:
            continue
        root_path = pathlib.Path(root)
        commit = _git(["rev-parse", "HEAD"], root_path)  # None in a repo without commits
        status = _git(["status", "--porcelain", "--untracked-files=no"], root_path)
        branch = _git(["rev-parse", "--abbrev-ref", "HEAD"], root_path)
        return {
            "commit": commit or "unknown",
            "dirty": None if status is None else bool(status),
            "branch": None if branch in (None, "HEAD") else branch,
            "root": root,
        }
    return {"commit": "unknown", "dirty": None, "branch": None, "root": None}


def cpu_record() -> dict[str, str]:
    """The processor behind a run's floating point: ``cpu`` (its model name), ``cpu_count`` (logical cores) and
    ``cpu_capability``, the vector instruction set torch's CPU kernels dispatch to (``AVX2``, ``AVX512``, ...).
    Runs from the same seeds are bit-identical on one machine, but two machines whose kernels differ train
    different weights: what this records says whether two runs could be identical. ``cpu_id``: family, model and
    stepping from ``/proc/cpuinfo`` (``25/17/1``), which tell apart processor generations that a cloud gives the
    same model name; empty where there is no ``/proc/cpuinfo``."""
    import torch

    model, ident = platform.processor() or platform.machine(), {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, _, value = line.partition(":")
                ident.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = ident.get("model name", model)
    cpu_id = "/".join(ident.get(k, "?") for k in ("cpu family", "model", "stepping")) if ident else ""
    return {"cpu": model, "cpu_id": cpu_id, "cpu_count": str(os.cpu_count()),
            "cpu_capability": str(torch.backends.cpu.get_cpu_capability())}


def write_run_metadata(run_dir: str | os.PathLike, config: Any, *, versions: Mapping[str, Any] | None = None) -> None:
    """Write config.json (the resolved config), versions.json and git.json into `run_dir`.

    `config` is a dataclass (nested dataclasses allowed) or a mapping; it is written with sorted keys.
    `versions`: more facts about the machine for versions.json, from the layers above this one (the code
    sandbox's mode: ``rewards.sandbox.sandbox_mode``, passed by every training run's start).
    """
    if not (dataclasses.is_dataclass(config) and not isinstance(config, type)) and not isinstance(
        config, Mapping
    ):
        raise TypeError(f"config must be a dataclass instance or a mapping, got {type(config).__qualname__}")
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_json(run_dir / CONFIG_FILE, config)
    versions = {"python": sys.version.split()[0], "platform": platform.platform(), **cpu_record(),
                **package_versions(), **(versions or {})}
    _write_json(run_dir / VERSIONS_FILE, versions)
    _write_json(run_dir / GIT_FILE, git_info())


def write_preset_record(run_dir: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Write ``preset.json``: ``{"preset": name | "custom" | null, "nearest", "differs", "params", "launcher"}``
    (``klear_lib.notebook.identify_preset``), atomically."""
    _write_json(pathlib.Path(run_dir) / PRESET_FILE, record)


# ----------------------------------------------------------------------------------------------------------
# metrics.jsonl


class MetricsFormatError(ValueError):
    """A metrics.jsonl line that is not a JSON object, away from the end of the file."""


class MetricsWriter:
    """Append metric records to a JSON-lines file, one per line, each flushed and fsync'ed as written.

    >>> with MetricsWriter(run_dir / "metrics.jsonl") as log:
    ...     log.write({"step": 1, "train/loss": loss})   # numpy/torch scalars are fine

    The file is opened for appending, so a resumed run continues it. A partial last line left by a crash
    is cut off (with a warning) before the first new record, so it cannot corrupt the middle of the file; a
    write that fails (a full disk) cuts its own partial line off before it raises.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_partial_last_line(self.path)
        self._f = open(self.path, "ab", buffering=0)  # noqa: SIM115 (closed by close())

    def write(self, record: Mapping[str, Any]) -> None:
        if not isinstance(record, Mapping):
            raise TypeError(f"a metrics record must be a dict, got {type(record).__qualname__}")
        data = (to_json_text(record, "record", separators=(",", ":")) + "\n").encode("utf-8")
        fd = self._f.fileno()
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:  # a raw write may write part of it: a crash leaves at most one partial line
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as err:  # a full disk: cut the partial line off (truncating needs no space), then say so
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            if err.filename is None:
                err.filename = str(self.path)
            raise

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _drop_partial_last_line(path: pathlib.Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1  # 0 when the only line is partial
    warnings.warn(f"{path}: dropping a partial last line left by an interrupted run: {data[keep:][:80]!r}")
    with open(path, "r+b") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())


def _nan_for_null(obj: Any) -> Any:
    if obj is None:
        return math.nan
    if isinstance(obj, dict):
        return {k: _nan_for_null(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_for_null(v) for v in obj]
    return obj


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read the records of a metrics.jsonl file; ``null`` values come back as NaN.

    A partial last line (the file does not end in a newline: the run crashed mid-write) is skipped with a
    warning. Any other line that is not a JSON object raises MetricsFormatError naming ``file:line``.
    Blank lines are skipped.
    """
    path = pathlib.Path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    # After the final "\n" split() leaves "", so the last element is a partial line exactly when it is non-empty.
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if lineno == len(lines):
                warnings.warn(f"{path}:{lineno}: skipping a truncated last line (interrupted run?): {line[:80]!r}")
                break
            raise MetricsFormatError(f"{path}:{lineno}: not valid JSON ({err.msg}): {line[:80]!r}") from None
        if not isinstance(record, dict):
            raise MetricsFormatError(f"{path}:{lineno}: a record must be a JSON object, got: {line[:80]!r}")
        records.append(_nan_for_null(record))
    return records


# ----------------------------------------------------------------------------------------------------------
# summary.json


def write_summary(run_dir: str | os.PathLike, summary: Mapping[str, Any]) -> None:
    """Write the run's final numbers to ``run_dir/summary.json`` (sorted keys, atomic)."""
    if not isinstance(summary, Mapping):
        raise TypeError(f"summary must be a dict, got {type(summary).__qualname__}")
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_json(run_dir / SUMMARY_FILE, summary)


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Read ``run_dir/summary.json`` as written (a NaN written there reads back as None)."""
    path = pathlib.Path(run_dir) / SUMMARY_FILE
    with open(path, encoding="utf-8") as f:
        return json.load(f)
