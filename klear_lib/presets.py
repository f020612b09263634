"""Notebook parameters: the presets (``params/<notebook>/<preset>.yaml``), ``-p key=value`` overrides, and their
checks against the notebook before a kernel starts.

A preset is a flat mapping of the notebook's parameters. ``-p key=value`` overrides one; the value is read as YAML
(``-p seed=2`` is an int, ``-p rl_lr=1.0e-4`` a float, ``-p name=abc`` a string). Every key must be a parameter of
the notebook's ``parameters``-tagged cell, and every notebook declares ``run_dir`` (klear sets it). Every value is
checked against the type of the parameter's default, and the notebook's cells tagged ``config`` are run once on the
parameters (``dry_run_config``); the first error is a ``KlearError`` naming the key, the value and what was expected.

One YAML reader (``load_yaml_file``) serves the presets, the ``-p`` values and ``klear_lib.train.launch``'s config
files; a preset must read the same under YAML 1.1 (papermill's reader), where ``4e-3`` is a string.

Used by the runner (``klear_lib.runner``), the notebooks' preset record (``klear_lib.notebook``), the launch script
and the command line; it imports nothing of klear_lib.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import io
import math
import os
import pathlib
import re
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

RUN_DIR_PARAM = "run_dir"
# Presets in the order the project uses them; any other preset is listed after these, alphabetically.
PRESET_ORDER = ("smoke", "tiny", "gpu", "paper")
_SCALARS = (type(None), bool, int, float, str)


class KlearError(Exception):
    """A user error: main() prints it without a traceback and exits with status 2."""


def default_repo_root() -> pathlib.Path:
    """The checkout holding this package when it has a notebooks/ folder (an editable install), else the cwd."""
    candidate = pathlib.Path(__file__).resolve().parent.parent
    return candidate if (candidate / "notebooks").is_dir() else pathlib.Path.cwd().resolve()


def list_notebooks(notebooks_dir: str | os.PathLike) -> list[pathlib.Path]:
    return sorted(p for p in pathlib.Path(notebooks_dir).glob("*.ipynb") if not p.name.startswith("."))


NOT_PRESETS = {"claims", "retired", "not_tested"}  # params/<notebook>/<these>.yaml: claims, not presets


def list_presets(name: str, params_dir: str | os.PathLike) -> list[str]:
    found = {p.stem for p in (pathlib.Path(params_dir) / name).glob("*.yaml")} - NOT_PRESETS
    known = [p for p in PRESET_ORDER if p in found]
    return known + sorted(found - set(known))


def default_preset(name: str, params_dir: str | os.PathLike) -> str:
    """The preset a notebook's parameters cell holds as its defaults: ``tiny`` (the CPU stand-in), or, for a notebook
    without one (08 runs a real model: ``small-real``), its one preset that is neither ``smoke`` nor a GPU preset."""
    found = list_presets(name, params_dir)
    if "tiny" in found or not found:
        return "tiny"
    own = [p for p in found if p not in PRESET_ORDER]
    return own[0] if len(own) == 1 else "tiny"


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
    """`["seed=2", "lr=1e-4"]` -> `{"seed": 2, "lr": 0.0001}`. A key given twice is an error (which one was meant
    cannot be known: the last one used to win silently)."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise KlearError(f"-p {item!r}: expected key=value with a Python identifier as key")
        if key in out:
            raise KlearError(f"-p {key} is given twice ({given[key]!r}, then {item!r}): give each parameter once")
        out[key], given[key] = parse_value(value), item
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


def load_params_with_sources(
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
    return load_params_with_sources(name, preset, overrides, params_dir)[0]


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
    text: ``-p seeds=1`` is ``"1"``); no value may be an infinite or NaN float. A worker count (``WORKER_PARAMS``) is
    ``auto`` or an integer the machine has cores for (``resolve_workers``), kept as given. Returns the values,
    converted; KlearError names key, value and type."""
    sources = sources or {}
    out = {}
    for key, value in params.items():
        default = _default_value(declared.get(key, {}))
        src = sources.get(key, "parameters")
        expected = type(default)
        ok = value
        if key in WORKER_PARAMS:  # "auto" or a count the machine has, whatever the default's type
            try:
                resolve_workers(value, key)
            except ValueError as err:
                raise KlearError(f"{err} (from {src})") from None
            out[key] = value
            continue
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
        if isinstance(ok, float) and not math.isfinite(ok):  # `1e400` reads as inf, and inf > 0 passes range checks
            raise KlearError(f"{key} = {value!r} (from {src}): expected a finite number")
        elif isinstance(default, str):
            if isinstance(value, bool):
                raise KlearError(f"{key} = {value!r} (from {src}): expected text like {default!r}")
            ok = value if isinstance(value, str) else (f"{value:g}" if isinstance(value, float) else str(value))
        out[key] = ok
    return out


# Worker counts: how many units of work (``workers``, notebooks 01-06) or judge processes (``judge_workers``, 07) run
# at once. ``auto`` is the cores this process may use, so that ``make reproduce`` scales with the machine; a count
# above them is refused before a kernel starts: more one-thread workers than cores only time-share them.
# Results do not depend on the count: every unit runs with a fixed number of torch threads (klear_lib.experiment).
AUTO = "auto"
WORKER_PARAMS = ("workers", "judge_workers")


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (``taskset``, a container's cpuset) where the platform
    has one, else ``os.cpu_count()``; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def resolve_workers(value: Any, key: str = "workers") -> int:
    """A worker count as a number: ``"auto"`` -> ``usable_cpus()``, an integer 1..usable_cpus() -> itself.
    ValueError, naming ``key``, the value and the cores, for anything else: 0, negatives, floats, bools, other text
    (``"3"`` too: one spelling per value), and counts above the cores. Called by the notebooks' config cells (so a
    papermill or JupyterLab run resolves it too) and by ``check_types`` (``klear run``, before a kernel starts)."""
    cores = usable_cpus()
    if value == AUTO:
        return cores
    count = value
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{key} = {value!r}: expected an integer >= 1 or {AUTO!r} (this machine's {cores} cores)")
    if count > cores:
        raise ValueError(f"{key} = {count}: this machine gives this process {cores} core{'s' * (cores != 1)}; "
                         f"use {key}: {AUTO} or at most {cores}")
    return count


def resolved_workers(params: Mapping[str, Any]) -> dict[str, int]:
    """The worker counts among ``params`` (``WORKER_PARAMS``), resolved (``resolve_workers``): what ``klear run``
    records in ``params.json`` beside the values as given."""
    return {k: resolve_workers(params[k], k) for k in WORKER_PARAMS if k in params}


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
