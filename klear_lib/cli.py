"""`klear`: run the project's notebooks headless with papermill, with named presets and checked parameters.

    klear list
    klear params 03_rl_clip_variants                              # every parameter with its value in each preset
    klear run 03_rl_clip_variants --preset tiny -p seeds=0,1 -p lrs=1.0e-4
    klear run --resume outputs/03_rl_clip_variants/<stamp>        # continue an interrupted run (units not redone)
    klear prepare 03 --preset smoke --out build/nb/03.ipynb      # inject parameters, don't execute (nbval)
    klear prepare --all --preset smoke --out build/nb             # ... every notebook with the preset (make test)
    klear reproduce --preset tiny                                 # every notebook that has params/<nb>/tiny.yaml,
                                                                  # then the report
    klear report                                                  # outputs/report.html from every run under outputs/
    klear lab                                                     # JupyterLab at the repository, on notebooks/
    klear lab 03 --preset smoke                                   # ... on a prepared copy in outputs/lab/

A preset is ``params/<notebook>/<preset>.yaml``: a flat mapping of the notebook's parameters. ``-p key=value``
overrides one; the value is read as YAML (``-p seed=2`` is an int, ``-p lr=1.0e-4`` a float, ``-p name=abc``
a string). Every key must be a parameter of the notebook's ``parameters``-tagged cell, and every notebook
declares ``run_dir``: klear sets it to a fresh ``outputs/<notebook>/<stamp>`` folder, where the notebook
writes its run directory (see klear_lib.runs) and papermill writes the executed ``notebook.ipynb``.

Bad input fails before a kernel starts: every value is checked against the type of the parameter's default (a
number given for a string parameter, e.g. ``-p seeds=1``, is taken as its text), and the notebook's cells tagged
``config`` (which build and validate its config) are run once on the parameters, in this process, against a
scratch run directory; the first error names the key, the value and what was expected. Ctrl-C marks the run
``interrupted`` (``status.json``) and prints one line; a failed or dead kernel is recorded in ``status.json``
with its cause and the last cell. A full disk is one line too (what failed, the free space, the ``--resume``
command), and a run does not start with less than ``runs.min_free_mb()`` free. Every file klear writes is written
whole or not at all (``runs.write_atomic``), papermill's ``notebook.ipynb`` included. The kernel and the units'
workers get ``KLEAR_RUN_OWNER`` (this process): they end, and record nothing more, when it dies by any signal.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import difflib
import io
import os
import pathlib
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from klear_lib import __version__, runs

RUN_DIR_PARAM = "run_dir"
STATUS_FILE = "status.json"  # written by `klear run` when a run is interrupted or fails: why, and where
KERNEL_NAME = "python3"
# Presets in the order the project uses them; any other preset is listed after these, alphabetically.
PRESET_ORDER = ("smoke", "tiny", "gpu", "paper")
_SCALARS = (type(None), bool, int, float, str)


class KlearError(Exception):
    """A user error: main() prints it without a traceback and exits with status 2."""


class NotebookFailed(Exception):
    """A notebook raised while papermill executed it; the partially executed copy is at `output`."""

    def __init__(self, name: str, output: pathlib.Path, cause: BaseException, cell: int | None = None):
        self.name, self.output, self.cause = name, output, cause
        detail = getattr(cause, "evalue", None) or str(cause)
        ename = getattr(cause, "ename", None) or type(cause).__name__
        cell = getattr(cause, "exec_count", None) or cell  # In [N]: report.cell_number, as status.json has it
        where = f" in cell [{cell}]" if cell is not None else ""
        super().__init__(
            f"{name} failed{where}: {ename}: {detail}\n  partially executed notebook: {output}"
        )


# ----------------------------------------------------------------------------------------------------------
# Where things are.


@dataclasses.dataclass(frozen=True)
class Layout:
    """The folders klear reads and writes; every one can be overridden on the command line."""

    repo_root: pathlib.Path  # papermill runs notebooks here, so their relative paths resolve
    notebooks_dir: pathlib.Path
    params_dir: pathlib.Path
    output_root: pathlib.Path

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Layout:
        root = pathlib.Path(args.repo_root).resolve() if args.repo_root else default_repo_root()

        def pick(flag, default):
            return pathlib.Path(flag).resolve() if flag else root / default

        return cls(
            repo_root=root,
            notebooks_dir=pick(args.notebooks_dir, "notebooks"),
            params_dir=pick(args.params_dir, "params"),
            output_root=pick(getattr(args, "output_root", None), "outputs"),
        )


def require_notebooks(layout: "Layout") -> None:
    """KlearError unless the notebooks folder exists (klear run outside a checkout, without --repo-root)."""
    if not layout.notebooks_dir.is_dir():
        raise KlearError(f"no notebooks folder at {layout.notebooks_dir}: run klear inside a klear checkout, or pass "
                         "--repo-root (or --notebooks-dir and --params-dir)")


def default_repo_root() -> pathlib.Path:
    """The checkout holding this package when it has a notebooks/ folder (an editable install), else the cwd."""
    candidate = pathlib.Path(__file__).resolve().parent.parent
    return candidate if (candidate / "notebooks").is_dir() else pathlib.Path.cwd().resolve()


def list_notebooks(notebooks_dir: str | os.PathLike) -> list[pathlib.Path]:
    return sorted(p for p in pathlib.Path(notebooks_dir).glob("*.ipynb") if not p.name.startswith("."))


NOT_PRESETS = {"claims"}  # params/<notebook>/claims.yaml: the notebook's declared claims, not a preset


def list_presets(name: str, params_dir: str | os.PathLike) -> list[str]:
    found = {p.stem for p in (pathlib.Path(params_dir) / name).glob("*.yaml")} - NOT_PRESETS
    known = [p for p in PRESET_ORDER if p in found]
    return known + sorted(found - set(known))


def resolve_notebook(spec: str, notebooks_dir: str | os.PathLike) -> pathlib.Path:
    """The notebook that `spec` names: a path to an .ipynb, a name with or without .ipynb, or a unique prefix."""
    notebooks_dir = pathlib.Path(notebooks_dir)
    as_path = pathlib.Path(spec)
    if as_path.suffix == ".ipynb" and as_path.is_file():
        return as_path.resolve()
    stem = spec[: -len(".ipynb")] if spec.endswith(".ipynb") else spec
    exact = notebooks_dir / f"{stem}.ipynb"
    if exact.is_file():
        return exact.resolve()
    available = list_notebooks(notebooks_dir)
    matches = [p for p in available if p.stem.startswith(stem)]
    if len(matches) == 1:
        return matches[0].resolve()
    names = ", ".join(p.stem for p in available) or "none"
    if matches:
        raise KlearError(f"{spec!r} matches several notebooks: {', '.join(p.stem for p in matches)}")
    raise KlearError(f"no notebook {spec!r} in {notebooks_dir}; notebooks: {names}")


# ----------------------------------------------------------------------------------------------------------
# Parameters: preset file, then -p overrides, then validation against the notebook.


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, plus floats written without a dot (`1e-4`), which YAML 1.1 reads as strings."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_value(text: str) -> Any:
    """A `-p` value or a preset value, read as YAML: `2` -> 2, `1e-4` -> 0.0001, `true` -> True, `abc` -> 'abc'."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


def load_yaml_file(path: str | os.PathLike, *, like_yaml_1_1: bool = False) -> Any:
    """A preset or config file, read as the CLI reads values (``1e-4`` is a float): one parser for the CLI's
    presets and ``-p`` overrides and for ``klear_lib.train.launch``'s config files.

    ``like_yaml_1_1`` (presets: papermill reads them too, ``papermill -f``): the file must also read the same under
    ``yaml.safe_load`` (YAML 1.1, papermill's reader), where ``4e-3`` is the string ``'4e-3'``; a file that differs
    is refused, naming the key and a spelling both readers agree on (``0.004``, ``4.0e-3``)."""
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
        ours = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        raise KlearError(f"{path}: not valid YAML: {err}") from None
    differs = _first_difference(ours, yaml.safe_load(text)) if like_yaml_1_1 else None
    if differs is not None:
        where, value, other = differs
        hint = f"; write {_float_text(value)}" if isinstance(value, float) and isinstance(other, str) else ""
        raise KlearError(f"{path}: {where} is the {type(other).__name__} {other!r} under YAML 1.1 (yaml.safe_load, "
                         f"papermill's reader) but the {type(value).__name__} {value!r} under klear's reader{hint}")
    return ours


def _float_text(value: float) -> str:
    """A float as YAML 1.1 reads it back as a float: ``0.004`` -> ``4.0e-3``-style text with a dot."""
    text = repr(value)
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


def _first_difference(a: Any, b: Any, where: str = "") -> tuple[str, Any, Any] | None:
    """The first place (``key``, ``key.sub``, ``key[2]``) where two loaded YAML documents differ in value or type."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        for key in a:
            found = _first_difference(a[key], b[key], f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if type(a) is type(b) and a == b else (where or "the document", a, b)


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`["seed=2", "lr=1e-4"]` -> `{"seed": 2, "lr": 0.0001}`; a later key wins."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise KlearError(f"-p {item!r}: expected key=value with a Python identifier as key")
        out[key] = parse_value(value)
    return out


def _check_scalars(params: Mapping[str, Any], source: str) -> None:
    for key, value in params.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise KlearError(f"{source}: parameter name {key!r} is not a Python identifier")
        if not isinstance(value, _SCALARS):
            raise KlearError(
                f"{source}: {key} = {value!r} is a {type(value).__name__}; notebook parameters are flat "
                "scalars (number, string, bool, null): derive anything else in the notebook"
            )


def _load_params_with_sources(
    name: str, preset: str, overrides: Sequence[str] | Mapping[str, Any], params_dir: pathlib.Path
) -> tuple[dict[str, Any], dict[str, str]]:
    path = params_dir / name / f"{preset}.yaml"
    if not path.is_file():
        presets = list_presets(name, params_dir)
        if not presets:
            raise KlearError(f"no presets for notebook {name!r}: {params_dir / name} has no *.yaml")
        raise KlearError(f"no preset {preset!r} for {name}; its presets: {', '.join(presets)}")
    loaded = load_yaml_file(path, like_yaml_1_1=True)
    loaded = {} if loaded is None else loaded
    if not isinstance(loaded, dict):
        raise KlearError(f"{path}: a preset must be a mapping of parameter: value, got {type(loaded).__name__}")
    _check_scalars(loaded, str(path))
    if isinstance(overrides, Mapping):
        extra = dict(overrides)
    else:
        extra = parse_overrides(overrides)
    _check_scalars(extra, "-p")
    sources = {k: str(path) for k in loaded} | {k: "-p" for k in extra}
    return {**loaded, **extra}, sources


def load_params(
    name: str,
    preset: str,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    params_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """The parameters of `params_dir/<name>/<preset>.yaml` with `overrides` (`["k=v", ...]` or a dict) on top."""
    params_dir = pathlib.Path(params_dir) if params_dir is not None else default_repo_root() / "params"
    return _load_params_with_sources(name, preset, overrides, params_dir)[0]


def notebook_parameters(notebook: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The parameters declared in the notebook's `parameters`-tagged cell, as papermill infers them."""
    import papermill

    return papermill.inspect_notebook(str(notebook))


def validate_params(
    params: Mapping[str, Any],
    valid: Sequence[str] | Mapping[str, Any],
    *,
    notebook: str = "the notebook",
    sources: Mapping[str, str] | None = None,
) -> None:
    """Raise KlearError unless every key of `params` is in `valid` and `run_dir` is declared but not given.

    `valid` is the notebook's parameter names (or `notebook_parameters(...)`); `sources` maps a key to where it
    came from (a preset path or "-p"), for the message.
    """
    valid = list(valid)
    sources = sources or {}
    settable = [k for k in valid if k != RUN_DIR_PARAM]
    if RUN_DIR_PARAM not in valid:
        raise KlearError(
            f"{notebook} declares no {RUN_DIR_PARAM!r} parameter; every notebook needs "
            f"`{RUN_DIR_PARAM} = \"\"` in its parameters-tagged cell (klear sets it to the run directory)"
        )
    for key in params:
        src = sources.get(key, "parameters")
        if key == RUN_DIR_PARAM:
            raise KlearError(
                f"{key} (from {src}) is set by klear: use --output-root (run) or --run-dir (prepare)"
            )
        if key not in valid:
            hint = difflib.get_close_matches(key, settable, n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise KlearError(
                f"unknown parameter {key!r} (from {src}) for {notebook}{did_you_mean}; "
                f"its parameters: {', '.join(settable) or 'none'}"
            )


def notebook_default(param: Mapping[str, Any]) -> Any:
    """The value of one of ``notebook_parameters``' entries (its default's source text, evaluated as a literal);
    None when it is not a literal."""
    try:
        return ast.literal_eval(str(param.get("default")))
    except (ValueError, SyntaxError):
        return None


_default_value = notebook_default


def same_value(a: Any, b: Any) -> bool:
    """Whether two parameter values are the same: a bool only equals a bool, numbers compare as numbers (``3`` is
    ``3.0``), anything else by ``==`` (``"1e-4"`` is not ``1e-4``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


def check_types(params: Mapping[str, Any], declared: Mapping[str, Mapping[str, Any]], *, notebook: str = "the notebook",
                sources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Each value against the type of its parameter's default (``notebook_parameters``): a bool for a bool, an
    int for an int, a number for a float, text for a string (a number given for a string parameter becomes its
    text: ``-p seeds=1`` is ``"1"``). Returns the values, converted; KlearError names key, value and type."""
    sources = sources or {}
    out = {}
    for key, value in params.items():
        default = _default_value(declared.get(key, {}))
        src = sources.get(key, "parameters")
        expected = type(default)
        ok = value
        if default is None or value is None and default is None:
            ok = value
        elif value is None:
            raise KlearError(f"{key} (from {src}) is empty; expected a {expected.__name__} like {default!r}")
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise KlearError(f"{key} = {value!r} (from {src}): expected true or false")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise KlearError(f"{key} = {value!r} (from {src}): expected an integer like {default!r}")
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise KlearError(f"{key} = {value!r} (from {src}): expected a number like {default!r}")
            ok = float(value)
        elif isinstance(default, str):
            if isinstance(value, bool):
                raise KlearError(f"{key} = {value!r} (from {src}): expected text like {default!r}")
            ok = value if isinstance(value, str) else (f"{value:g}" if isinstance(value, float) else str(value))
        out[key] = ok
    return out


CONFIG_TAG = "config"  # cells that build and validate a notebook's config, cheaply: klear runs them first


def dry_run_config(notebook: pathlib.Path, params: Mapping[str, Any]) -> None:
    """Run the notebook's ``parameters`` cell, the parameters, and its ``config``-tagged cells in this process,
    against a scratch run directory; the first exception is a KlearError (one line, its message). A notebook
    without ``config`` cells is not dry-run."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)

    def tagged(tag: str) -> list[str]:
        return [c.source for c in nb.cells if c.cell_type == "code" and tag in c.get("metadata", {}).get("tags", [])]

    config_cells = tagged(CONFIG_TAG)
    if not config_cells:
        return
    with tempfile.TemporaryDirectory(prefix="klear-dry-run-") as scratch:
        namespace: dict[str, Any] = {"__name__": "__klear_dry_run__"}
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                for source in tagged("parameters"):
                    exec(compile(source, f"{notebook.name}:parameters", "exec"), namespace)  # noqa: S102 (own cell)
                namespace.update(params)
                namespace[RUN_DIR_PARAM] = scratch
                for i, source in enumerate(config_cells):
                    exec(compile(source, f"{notebook.name}:config[{i}]", "exec"), namespace)  # noqa: S102 (own cell)
        except Exception as err:  # noqa: BLE001 (the notebook's own validation: reported as a usage error)
            raise KlearError(f"{notebook.stem}: {err}") from None


def _resolve(spec: str, preset: str, overrides: Sequence[str], layout: Layout, *, dry_run: bool = False):
    notebook = resolve_notebook(spec, layout.notebooks_dir)
    name = notebook.stem
    params, sources = _load_params_with_sources(name, preset, overrides, layout.params_dir)
    declared = notebook_parameters(notebook)
    validate_params(params, declared, notebook=name, sources=sources)
    params = check_types(params, declared, notebook=name, sources=sources)
    if dry_run:
        dry_run_config(notebook, params)
    return notebook, name, params


# ----------------------------------------------------------------------------------------------------------
# Running.


def _warn_if_foreign_kernel() -> None:
    """papermill starts the `python3` kernel; warn if its spec launches another interpreter than this one."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        argv0 = KernelSpecManager().get_kernel_spec(KERNEL_NAME).argv[0]
    except Exception:  # noqa: BLE001 (papermill reports a missing kernel itself)
        return
    # jupyter_client replaces a bare "python"/"python3" with sys.executable.
    if os.path.isabs(argv0) and os.path.realpath(argv0) != os.path.realpath(sys.executable):
        print(
            f"klear: warning: the {KERNEL_NAME!r} kernel runs {argv0}, not {sys.executable}; "
            f"run `{sys.executable} -m ipykernel install --sys-prefix` to use this environment",
            file=sys.stderr,
        )


class RunInterrupted(Exception):
    """Ctrl-C during `klear run`: the run directory is marked interrupted (``status.json``)."""

    def __init__(self, run_dir: pathlib.Path):
        self.run_dir = run_dir
        super().__init__(f"interrupted; the partial run is in {run_dir} (continue it: klear run --resume {run_dir})")


def _oom_kills() -> int | None:
    """The cgroup's count of processes the kernel killed for want of memory (cgroup v2), or None."""
    try:
        for line in pathlib.Path("/sys/fs/cgroup/memory.events").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _last_cell(output: pathlib.Path) -> dict:
    """The cell papermill was executing (or that failed) in a partially executed notebook: its number (``In [N]``,
    ``report.cell_number``: the one numbering of the CLI, ``status.json`` and the report) and first line."""
    try:
        import nbformat

        nb = nbformat.read(str(output), as_version=4)
    except Exception:  # noqa: BLE001 (a notebook papermill never wrote)
        return {}
    from klear_lib.report import cell_number

    for pos, cell in enumerate(nb.cells):
        state = ((cell.get("metadata") or {}).get("papermill") or {}).get("status")
        if state in ("running", "failed"):
            first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
            return {"cell": cell_number(nb.cells, pos), "cell_source": first[:120], "cell_status": state}
    return {}


def _write_status(run_dir: pathlib.Path, status: dict) -> bool:
    """Write ``status.json`` whole or not at all; False (nothing written) when the disk is full or unwritable:
    the line klear prints says what happened either way."""
    try:
        runs.write_atomic(run_dir / STATUS_FILE,
                          runs.to_json_text({**status, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2) + "\n")
    except OSError:
        return False
    return True


def _finish_record(run_dir: pathlib.Path, clock: float) -> None:
    """Add the end time and the seconds to params.json (the report shows every run's time)."""
    path = run_dir / runs.PARAMS_FILE
    try:
        import json

        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    record["seconds"] = round(record.get("seconds_before", 0.0) + time.monotonic() - clock, 1)
    try:
        runs.write_atomic(path, runs.to_json_text(record, indent=2) + "\n")
    except OSError:  # a full disk: the record stays as it was at the start (the run's time is not known)
        pass


class DiskFull(NotebookFailed):
    """The disk (or the quota) filled up during ``klear run``: one line saying what failed, the free space, and
    the command that continues the run once there is space (every unit and run-level file written before is
    whole: units are not redone)."""

    def __init__(self, name: str, run_dir: pathlib.Path, cause: BaseException, what: str, *, resumable: bool):
        super().__init__(name, run_dir / runs.NOTEBOOK_FILE, cause)
        then = (f"free some space, then continue the run: klear run --resume {run_dir}" if resumable else
                "nothing ran; free some space and run it again")
        self.line = f"{name}: the disk is full ({what}); {runs.describe_free(run_dir)}; {then}"
        Exception.__init__(self, self.line)

    def __str__(self) -> str:
        return self.line


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FULL_PATH = re.compile(r"(?:No space left on device|Disk quota exceeded): '([^']+)'")


def _disk_full_what(err: BaseException) -> str | None:
    """What the full disk broke, from papermill's error (a cell raised: its text and traceback) or from an OSError
    in this process; None when `err` is not about a full disk."""
    text = _ANSI.sub("", "\n".join([str(getattr(err, "evalue", "") or ""), *(getattr(err, "traceback", None) or []),
                                     str(err)]))
    if not (runs.is_disk_full(err) or runs.is_disk_full(text)):
        return None
    cell = getattr(err, "exec_count", None)
    found = _FULL_PATH.search(text)
    where = f"writing {found.group(1)}" if found else (
        f"writing {err.filename}" if isinstance(err, OSError) and err.filename else "a write failed")
    if cell is not None:
        where += f" in cell [{cell}], {getattr(err, 'ename', None) or type(err).__name__}"
    return where


def _check_free_space(path: pathlib.Path) -> None:
    """KlearError (one line) when the filesystem of `path` has less than ``runs.min_free_mb()`` free."""
    try:
        need = runs.min_free_mb()
    except ValueError as err:
        raise KlearError(str(err)) from None
    free = runs.free_bytes(path)
    if free is not None and free < need * 1e6:
        raise KlearError(f"only {free / 1e6:.1f} MB free on {path}; klear run needs {need:g} MB to start "
                         f"({runs.MIN_FREE_ENV} sets the minimum)")


_ATOMIC_PREFIXES: set[str] = set()


def _write_notebook_atomically(run_dir: pathlib.Path) -> None:
    """papermill rewrites the executed notebook after every cell with a plain ``open(path, "w")``: a full disk
    left it cut mid-string. Its writes under ``run_dir`` go through ``runs.write_atomic`` instead (a papermill
    I/O handler for that path prefix; no fsync, the notebook is rewritten often)."""
    import papermill.iorw as iorw

    prefix = f"{run_dir}{os.sep}"
    if prefix in _ATOMIC_PREFIXES:
        return

    class AtomicLocalHandler(iorw.LocalHandler):
        def write(self, buf, path):
            runs.write_atomic(path, buf, fsync=False)

    iorw.papermill_io.register(prefix, AtomicLocalHandler())
    _ATOMIC_PREFIXES.add(prefix)


@contextlib.contextmanager
def _owning_the_run():
    """``KLEAR_RUN_OWNER`` = this process, for the kernel and its unit workers (``klear_lib.experiment``): they
    end, and record nothing more, when this process dies by any signal."""
    from klear_lib import experiment

    before = os.environ.get(experiment.OWNER_ENV)
    os.environ[experiment.OWNER_ENV] = experiment.process_identity()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(experiment.OWNER_ENV, None)
        else:
            os.environ[experiment.OWNER_ENV] = before


def run_notebook(
    spec: str | None,
    preset: str,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    layout: Layout,
    progress_bar: bool = True,
    resume: str | os.PathLike | None = None,
) -> pathlib.Path:
    """Execute a notebook with a preset into a new run directory and return it; NotebookFailed if it raised
    (DiskFull, one line, when the disk filled up), RunInterrupted on Ctrl-C. ``resume``: run again into that run
    directory, with the notebook, preset and parameters its ``params.json`` recorded (``spec``, ``preset`` and
    ``overrides`` must not be given); the units of work it finished are not redone (``klear_lib.experiment``).
    Refused (KlearError) with less than ``runs.min_free_mb()`` free on the output root."""
    import papermill

    if resume is not None:
        _check_free_space(pathlib.Path(resume))
        run_dir, notebook, name, params, record = _resume_record(pathlib.Path(resume), layout)
        preset = record.get("preset", preset)
    else:
        notebook, name, params = _resolve(spec, preset, overrides, layout, dry_run=True)
        _check_free_space(layout.output_root)
        try:
            run_dir = runs.create_run_dir(layout.output_root, name).resolve()
        except OSError as err:
            raise KlearError(f"cannot create a run directory under {layout.output_root}: "
                             f"{err.strerror or err}") from None
        record = {"notebook": name, "notebook_path": str(notebook), "preset": preset, "params": params,
                  RUN_DIR_PARAM: str(run_dir), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    output = run_dir / runs.NOTEBOOK_FILE
    try:
        runs.write_atomic(run_dir / runs.PARAMS_FILE, runs.to_json_text(record, indent=2) + "\n")
    except OSError as err:
        what = _disk_full_what(err)
        if what is None:
            raise
        if resume is None:
            with contextlib.suppress(OSError):
                run_dir.rmdir()  # nothing was written in it
        raise DiskFull(name, run_dir, err, what, resumable=resume is not None) from None
    (run_dir / STATUS_FILE).unlink(missing_ok=True)
    _warn_if_foreign_kernel()
    _write_notebook_atomically(run_dir)
    clock, oom_before = time.monotonic(), _oom_kills()
    # The kernel inherits these: the notebook's preset.json names klear as its launcher and compares the parameters
    # with the presets klear read them from (klear_lib.notebook.start_run).
    kernel_env = contextlib.ExitStack()
    kernel_env.enter_context(_environ({"KLEAR_LAUNCHER": "klear run", "KLEAR_PARAMS_DIR": str(layout.params_dir)}))
    try:
        with _owning_the_run():
            papermill.execute_notebook(
                str(notebook),
                str(output),
                parameters={**params, RUN_DIR_PARAM: str(run_dir)},
                kernel_name=KERNEL_NAME,
                progress_bar=progress_bar,
                stdout_file=sys.stderr,  # stream the notebook's own progress lines (a long cell shows where it is)
                cwd=str(layout.repo_root),
            )
    except KeyboardInterrupt:
        _write_status(run_dir, {"status": "interrupted", "cause": "Ctrl-C (SIGINT)", **_last_cell(output)})
        _finish_record(run_dir, clock)
        raise RunInterrupted(run_dir) from None
    except Exception as err:  # PapermillExecutionError, or a dead kernel: both leave `output` behind
        full = _disk_full_what(err)
        if full is not None:
            _write_status(run_dir, {"status": "failed", "cause": "the disk is full", "error": full,
                                    **_last_cell(output)})
            _finish_record(run_dir, clock)
            raise DiskFull(name, run_dir, err, full, resumable=True) from None
        dead = type(err).__name__ == "DeadKernelError" or "kernel died" in str(err).lower()
        oom_after = _oom_kills()
        status = {"status": "failed", "cause": "the kernel died" if dead else "a cell raised",
                  "error": f"{getattr(err, 'ename', None) or type(err).__name__}: "
                           f"{getattr(err, 'evalue', None) or str(err).strip().splitlines()[-1][:300]}",
                  **_last_cell(output)}
        if dead and oom_before is not None and oom_after is not None and oom_after > oom_before:
            status["cause"] = "the kernel died: out of memory (the cgroup's oom_kill count rose)"
        _write_status(run_dir, status)
        _finish_record(run_dir, clock)
        raise NotebookFailed(name, output, err, cell=status.get("cell")) from err
    finally:
        kernel_env.close()
    _finish_record(run_dir, clock)
    return run_dir


@contextlib.contextmanager
def _environ(values: Mapping[str, str]):
    """Set environment variables for the duration of a block, then put back what was there."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _resume_record(run_dir: pathlib.Path, layout: Layout):
    """What an interrupted run was: its notebook, its parameters (as recorded), its params.json record."""
    import json

    run_dir = run_dir.resolve()
    path = run_dir / runs.PARAMS_FILE
    if not path.is_file():
        raise KlearError(f"--resume {run_dir}: no {runs.PARAMS_FILE} there (not a run directory klear run made)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        name, params = record["notebook"], dict(record["params"])
    except (ValueError, KeyError, TypeError) as err:
        raise KlearError(f"--resume {run_dir}: {runs.PARAMS_FILE} is unreadable ({err})") from None
    notebook = resolve_notebook(name, layout.notebooks_dir)
    record["seconds_before"] = float(record.get("seconds", 0.0))
    record.setdefault("resumed", []).append(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    metrics = run_dir / runs.METRICS_FILE
    if metrics.is_file():  # the notebook writes it again (units of work rebuild it from their own files)
        os.replace(metrics, run_dir / f"{runs.METRICS_FILE}.before-resume")
    return run_dir, notebook, name, params, record


def prepare_notebook(
    spec: str,
    preset: str,
    out: str | os.PathLike,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    layout: Layout,
    run_dir: str | os.PathLike | None = None,
) -> pathlib.Path:
    """Write `out`: the notebook with the preset's parameters injected, not executed (for nbval).

    `run_dir` defaults to a folder named after the notebook beside `out`; it is created.
    """
    import papermill

    notebook, name, params = _resolve(spec, preset, overrides, layout)
    out = pathlib.Path(out).resolve()
    run_dir = pathlib.Path(run_dir).resolve() if run_dir else out.parent / name
    out.parent.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(
        str(notebook),
        str(out),
        parameters={**params, RUN_DIR_PARAM: str(run_dir)},
        kernel_name=KERNEL_NAME,
        prepare_only=True,
        progress_bar=False,
    )
    return out


# ----------------------------------------------------------------------------------------------------------
# Commands.


def _cmd_list(args: argparse.Namespace, layout: Layout) -> int:
    require_notebooks(layout)
    notebooks = list_notebooks(layout.notebooks_dir)
    if not notebooks:
        raise KlearError(f"no notebooks (*.ipynb) in {layout.notebooks_dir}")
    width = max(len(p.stem) for p in notebooks)
    for nb in notebooks:
        presets = list_presets(nb.stem, layout.params_dir)
        print(f"{nb.stem:<{width}}  {', '.join(presets) if presets else '(no presets)'}")
    return 0


def _cmd_params(args: argparse.Namespace, layout: Layout) -> int:
    """Every parameter of a notebook with its default and its value in each preset (or one preset)."""
    require_notebooks(layout)
    notebook = resolve_notebook(args.notebook, layout.notebooks_dir)
    declared = notebook_parameters(notebook)
    presets = [args.preset] if args.preset else list_presets(notebook.stem, layout.params_dir)
    values = {p: _load_params_with_sources(notebook.stem, p, (), layout.params_dir)[0] for p in presets}
    rows = [["parameter", "default", *presets]]
    for key, param in declared.items():
        if key == RUN_DIR_PARAM:
            continue
        rows.append([key, str(param.get("default")), *(repr(values[p][key]) if key in values[p] else "·"
                                                        for p in presets)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"(· = the notebook's default; {notebook.stem} in {layout.notebooks_dir})")
    return 0


def _cmd_run(args: argparse.Namespace, layout: Layout) -> int:
    require_notebooks(layout)
    if args.resume and (args.notebook or args.param):
        raise KlearError("--resume continues a run with its recorded notebook and parameters: give no notebook "
                         "and no -p with it")
    if not args.resume and not args.notebook:
        raise KlearError("name a notebook (klear list shows them), or give --resume RUN_DIR")
    try:
        run_dir = run_notebook(args.notebook, args.preset, args.param, layout=layout, resume=args.resume)
    except NotebookFailed as err:
        print(f"klear: {err}", file=sys.stderr)
        return 1
    except RunInterrupted as err:
        print(f"klear: {err}", file=sys.stderr)
        return 130
    _report_contract(run_dir)
    print(run_dir)
    return 0


def _report_contract(run_dir: pathlib.Path) -> list[str]:
    missing = runs.check_run_dir(run_dir, runs.RUN_CONTRACT + (runs.NOTEBOOK_FILE,))
    if missing:
        print(f"klear: warning: {run_dir} lacks {', '.join(missing)} (see klear_lib.runs)", file=sys.stderr)
    return missing


def _cmd_prepare(args: argparse.Namespace, layout: Layout) -> int:
    if args.all:
        return _prepare_all(args, layout)
    if not args.notebook:
        raise KlearError("prepare needs a notebook name (klear list shows them), or --all")
    out = prepare_notebook(args.notebook, args.preset, args.out, args.param, layout=layout, run_dir=args.run_dir)
    print(out)
    return 0


def _prepare_all(args: argparse.Namespace, layout: Layout) -> int:
    """``prepare --all``: every notebook that has the preset (the report's included) into ``<out>/<notebook>.ipynb``,
    run directory ``<out>/runs/<notebook>/<stamp>`` (one stamp, named as klear names run folders), in one process
    (papermill's import alone is ≈3 s a process; make test prepares eight notebooks)."""
    if args.notebook or args.param or args.run_dir:
        raise KlearError("prepare --all takes no notebook, -p or --run-dir: it writes <--out>/<notebook>.ipynb for "
                         "every notebook with the preset, run directory <--out>/runs/<notebook>/<stamp>")
    require_notebooks(layout)
    out, stamp = pathlib.Path(args.out), time.strftime("%Y%m%d-%H%M%S")
    names = [nb.stem for nb in list_notebooks(layout.notebooks_dir)
             if (layout.params_dir / nb.stem / f"{args.preset}.yaml").is_file()]
    if not names:
        raise KlearError(f"no notebook in {layout.notebooks_dir} has a {args.preset!r} preset in {layout.params_dir}")
    for name in names:
        print(prepare_notebook(name, args.preset, out / f"{name}.ipynb", layout=layout,
                               run_dir=out / "runs" / name / stamp))
    return 0


def _cmd_lab(args: argparse.Namespace, layout: Layout) -> int:
    """JupyterLab at the repository root (jupytext's configuration, one entry per notebook; klear_lib.lab); with a
    notebook, on a prepared copy of it with the preset's parameters, outside the tracked files."""
    import subprocess

    from klear_lib import lab

    require_notebooks(layout)
    if not layout.output_root.resolve().is_relative_to(layout.repo_root.resolve()):
        raise KlearError(f"--output-root {layout.output_root} is outside the repository {layout.repo_root}: JupyterLab "
                         "opens only files under its root (the repository, so that jupytext reads jupytext.toml)")
    open_path = None
    if args.notebook:
        notebook, name, params = _resolve(args.notebook, args.preset, args.param, layout, dry_run=True)
        open_path = lab.prepare_copy(notebook, name, args.preset, params, layout.output_root)
        print(f"klear: a copy of {name} with the {args.preset} preset's parameters: {open_path}\n"
              f"klear: Run All writes a new run directory under {layout.output_root / name}/; the tracked notebook "
              "is not touched", file=sys.stderr)
    elif args.param:
        raise KlearError("--preset and -p need a notebook: klear lab NOTEBOOK --preset smoke")
    argv = lab.lab_argv(layout.repo_root, open_path, layout.output_root / lab.LAB_DIR / "jupyter_server_config.json",
                        args.jupyter_args)
    if args.print_command:
        print(" ".join(argv))
        return 0
    return subprocess.call(argv, cwd=layout.repo_root)


REPORT_PREFIX = "00_"  # notebooks named 00_* gather the others' runs: reproduce runs them last, as the report
REPRODUCE_LOG = "reproduce.json"


def _write_reproduce_log(layout: Layout, log: dict) -> None:
    """outputs/reproduce.json, rewritten after every notebook (a crash of reproduce itself keeps what ran)."""
    layout.output_root.mkdir(parents=True, exist_ok=True)
    runs.write_atomic(layout.output_root / REPRODUCE_LOG, runs.to_json_text(log, indent=2) + "\n")


def make_report(layout: Layout, preset: str = "tiny", *, progress_bar: bool = True) -> pathlib.Path:
    """Write ``<output root>/report.html`` from every run directory under the output root.

    Through the ``00_report`` notebook when the notebooks folder has one with this preset (its executed copy
    lands in its own run directory); directly through ``klear_lib.report`` otherwise, or if that notebook fails.
    """
    from klear_lib import report

    out = layout.output_root / "report.html"
    nb = next((p for p in list_notebooks(layout.notebooks_dir) if p.stem.startswith(REPORT_PREFIX)), None)
    if nb is not None and (layout.params_dir / nb.stem / f"{preset}.yaml").is_file():
        try:
            run_notebook(str(nb), preset, {"output_root": str(layout.output_root), "report_path": str(out)},
                         layout=layout, progress_bar=progress_bar)
        except NotebookFailed as err:
            print(f"klear: {err}\nklear: writing the report without the notebook", file=sys.stderr)
        else:
            if out.is_file():
                return out
    return report.render_report(layout.output_root, out)


def _cmd_report(args: argparse.Namespace, layout: Layout) -> int:
    from klear_lib import report

    if not report.collect_runs(layout.output_root) and not (layout.output_root / REPRODUCE_LOG).is_file():
        raise KlearError(f"no run directories under {layout.output_root}: run a notebook first "
                         "(klear run NOTEBOOK), or pass --output-root")
    print(make_report(layout, args.preset))
    return 0


def _cmd_reproduce(args: argparse.Namespace, layout: Layout) -> int:
    require_notebooks(layout)
    clock = time.monotonic()
    rows = []  # (notebook, status, seconds, run dir or message)
    log = {"preset": args.preset, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "total_s": 0.0, "rows": []}
    for nb in list_notebooks(layout.notebooks_dir):
        if nb.stem.startswith(REPORT_PREFIX) or not (layout.params_dir / nb.stem / f"{args.preset}.yaml").is_file():
            continue
        print(f"== {nb.stem} ({args.preset})", file=sys.stderr, flush=True)
        start = time.monotonic()
        message = ""
        try:
            run_dir = run_notebook(str(nb), args.preset, layout=layout)
        except NotebookFailed as err:
            print(f"klear: {err}", file=sys.stderr)
            status, where, message = "FAILED", str(err.output.parent), str(err).split("\n")[0]
        except KlearError as err:
            print(f"klear: error: {err}", file=sys.stderr)
            status, where, message = "ERROR", "", str(err)
        else:
            missing = _report_contract(run_dir)
            status, where = ("ran" if not missing else "incomplete"), str(run_dir)
            message = f"missing {', '.join(missing)}" if missing else ""
        rows.append((nb.stem, status, time.monotonic() - start, where or message))
        log["rows"].append({"notebook": nb.stem, "status": status, "seconds": round(rows[-1][2], 1),
                            "run_dir": where, "message": message})
        log["total_s"] = round(time.monotonic() - clock, 1)
        _write_reproduce_log(layout, log)
    if not rows:
        print(f"no notebook in {layout.notebooks_dir} has a {args.preset!r} preset in {layout.params_dir}")
        return 1
    print("== report", file=sys.stderr, flush=True)
    start = time.monotonic()
    report_path = make_report(layout, args.preset)
    rows.append(("report", "ran", time.monotonic() - start, str(report_path)))
    width = max(len(r[0]) for r in rows)
    print(f"{'notebook':<{width}}  {'status':<10}  {'time':>7}  run directory")
    for name, status, seconds, where in rows:
        print(f"{name:<{width}}  {status:<10}  {seconds:>6.1f}s  {where}")
    total = time.monotonic() - clock
    print(f"total: {total:.0f}s ({total / 60:.1f} min); report: {report_path}")
    failed = [r[0] for r in rows if r[1] in ("FAILED", "ERROR")]
    if failed:
        print(f"klear: {len(failed)} of {len(rows) - 1} notebooks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    dirs = argparse.ArgumentParser(add_help=False)
    dirs.add_argument("--repo-root", help="where notebooks run (default: this checkout, else the cwd)")
    dirs.add_argument("--notebooks-dir", help="default: <repo root>/notebooks")
    dirs.add_argument("--params-dir", help="default: <repo root>/params")

    params = argparse.ArgumentParser(add_help=False)
    params.add_argument("notebook", nargs="?", help="name (03_rl_clip_variants), with or without .ipynb, or a unique "
                                                    "prefix (03)")
    params.add_argument("--preset", default="tiny", help="params/<notebook>/<preset>.yaml (default: tiny)")
    params.add_argument(
        "-p", "--param", action="append", default=[], metavar="KEY=VALUE",
        help="override one parameter; the value is read as YAML (repeatable)",
    )

    parser = argparse.ArgumentParser(prog="klear", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"klear {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", parents=[params, dirs], help="execute a notebook into a new run directory")
    p.add_argument("--output-root", help="run directories go to <output root>/<notebook>/ (default: outputs)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run in RUN_DIR (its recorded "
                                                       "notebook and parameters; finished units are not redone)")
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("params", parents=[dirs], help="every parameter of a notebook, its default and its presets")
    p.add_argument("notebook", help="name or unique prefix")
    p.add_argument("--preset", help="show one preset only")
    p.set_defaults(func=_cmd_params)
    p = sub.add_parser("list", parents=[dirs], help="list the notebooks and their presets")
    p.set_defaults(func=_cmd_list)
    p = sub.add_parser("prepare", parents=[params, dirs], help="inject parameters without executing (for nbval)")
    p.add_argument("--out", required=True, help="where to write the parameterized notebook (with --all: a folder)")
    p.add_argument("--run-dir", help="the run_dir parameter (default: <dir of --out>/<notebook>)")
    p.add_argument("--all", action="store_true", help="every notebook that has the preset, into the folder --out "
                                                      "(run directories <out>/runs/<notebook>/<stamp>)")
    p.set_defaults(func=_cmd_prepare)
    p = sub.add_parser("reproduce", parents=[dirs], help="run every notebook that has the preset, in name order")
    p.add_argument("--preset", default="tiny", help="default: tiny")
    p.add_argument("--output-root", help="default: outputs")
    p.set_defaults(func=_cmd_reproduce)
    p = sub.add_parser("lab", parents=[params, dirs], help="JupyterLab at the repository; with a notebook, on a "
                                                            "prepared copy with a preset's parameters")
    p.add_argument("--output-root", help="the copies go to <output root>/lab/ (default: outputs)")
    p.add_argument("--print-command", action="store_true", help="print the jupyter command instead of running it")
    p.set_defaults(func=_cmd_lab)  # arguments after `--` go to `jupyter lab` (e.g. -- --no-browser --port 8890)
    p = sub.add_parser("report", parents=[dirs], help="gather every run under the output root into report.html")
    p.add_argument("--preset", default="tiny", help="preset of the 00_report notebook (default: tiny)")
    p.add_argument("--output-root", help="default: outputs")
    p.set_defaults(func=_cmd_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `klear` console script; returns the exit status (0 ok, 1 a notebook failed, 2 a usage error, 130
    interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # klear lab ... -- <jupyter lab's arguments>
    argv = argv[:argv.index("--")] if "--" in argv else argv
    args = build_parser().parse_args(argv)
    args.jupyter_args = extra
    try:
        if extra and args.command != "lab":
            raise KlearError(f"arguments after -- are for `klear lab` only, got: {' '.join(extra)}")
        return args.func(args, Layout.from_args(args))
    except KlearError as err:
        print(f"klear: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("klear: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
