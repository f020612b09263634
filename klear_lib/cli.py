"""`klear`: run the project's notebooks headless with papermill, with named presets and checked parameters.

    klear list
    klear run 03_rl_clip_variants --preset tiny -p seed=2 -p lr=1e-4
    klear prepare 03 --preset smoke --out build/nb/03.ipynb      # inject parameters, don't execute (nbval)
    klear reproduce --preset tiny                                 # every notebook that has params/<nb>/tiny.yaml,
                                                                  # then the report
    klear report                                                  # outputs/report.html from every run under outputs/

A preset is ``params/<notebook>/<preset>.yaml``: a flat mapping of the notebook's parameters. ``-p key=value``
overrides one; the value is read as YAML (``-p seed=2`` is an int, ``-p lr=1e-4`` a float, ``-p name=abc``
a string). Every key must be a parameter of the notebook's ``parameters``-tagged cell, and every notebook
declares ``run_dir``: klear sets it to a fresh ``outputs/<notebook>/<stamp>`` folder, where the notebook
writes its run directory (see klear_lib.runs) and papermill writes the executed ``notebook.ipynb``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import pathlib
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from klear_lib import runs

RUN_DIR_PARAM = "run_dir"
KERNEL_NAME = "python3"
# Presets in the order the project uses them; any other preset is listed after these, alphabetically.
PRESET_ORDER = ("smoke", "tiny", "gpu", "paper")
_SCALARS = (type(None), bool, int, float, str)


class KlearError(Exception):
    """A user error: main() prints it without a traceback and exits with status 2."""


class NotebookFailed(Exception):
    """A notebook raised while papermill executed it; the partially executed copy is at `output`."""

    def __init__(self, name: str, output: pathlib.Path, cause: BaseException):
        self.name, self.output, self.cause = name, output, cause
        detail = getattr(cause, "evalue", None) or str(cause)
        ename = getattr(cause, "ename", None) or type(cause).__name__
        cell = getattr(cause, "exec_count", None)
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
        pick = lambda flag, default: pathlib.Path(flag).resolve() if flag else root / default  # noqa: E731
        return cls(
            repo_root=root,
            notebooks_dir=pick(args.notebooks_dir, "notebooks"),
            params_dir=pick(args.params_dir, "params"),
            output_root=pick(getattr(args, "output_root", None), "outputs"),
        )


def default_repo_root() -> pathlib.Path:
    """The checkout holding this package when it has a notebooks/ folder (an editable install), else the cwd."""
    candidate = pathlib.Path(__file__).resolve().parent.parent
    return candidate if (candidate / "notebooks").is_dir() else pathlib.Path.cwd().resolve()


def list_notebooks(notebooks_dir: str | os.PathLike) -> list[pathlib.Path]:
    return sorted(p for p in pathlib.Path(notebooks_dir).glob("*.ipynb") if not p.name.startswith("."))


def list_presets(name: str, params_dir: str | os.PathLike) -> list[str]:
    found = {p.stem for p in (pathlib.Path(params_dir) / name).glob("*.yaml")}
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
    with open(path, encoding="utf-8") as f:
        try:
            loaded = yaml.load(f, Loader=_Loader)  # noqa: S506
        except yaml.YAMLError as err:
            raise KlearError(f"{path}: not valid YAML: {err}") from None
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


def _resolve(spec: str, preset: str, overrides: Sequence[str], layout: Layout):
    notebook = resolve_notebook(spec, layout.notebooks_dir)
    name = notebook.stem
    params, sources = _load_params_with_sources(name, preset, overrides, layout.params_dir)
    validate_params(params, notebook_parameters(notebook), notebook=name, sources=sources)
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


def run_notebook(
    spec: str,
    preset: str,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    layout: Layout,
    progress_bar: bool = True,
) -> pathlib.Path:
    """Execute a notebook with a preset into a new run directory and return it; NotebookFailed if it raised."""
    import papermill

    notebook, name, params = _resolve(spec, preset, overrides, layout)
    run_dir = runs.create_run_dir(layout.output_root, name).resolve()
    output = run_dir / runs.NOTEBOOK_FILE
    record = {
        "notebook": name,
        "notebook_path": str(notebook),
        "preset": preset,
        "params": params,
        RUN_DIR_PARAM: str(run_dir),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (run_dir / runs.PARAMS_FILE).write_text(runs.to_json_text(record, indent=2) + "\n", encoding="utf-8")
    _warn_if_foreign_kernel()
    try:
        papermill.execute_notebook(
            str(notebook),
            str(output),
            parameters={**params, RUN_DIR_PARAM: str(run_dir)},
            kernel_name=KERNEL_NAME,
            progress_bar=progress_bar,
            stdout_file=sys.stderr,  # stream the notebook's own progress lines (a long cell shows where it is)
            cwd=str(layout.repo_root),
        )
    except Exception as err:  # PapermillExecutionError, or a dead kernel: both leave `output` behind
        raise NotebookFailed(name, output, err) from err
    return run_dir


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
    notebooks = list_notebooks(layout.notebooks_dir)
    if not notebooks:
        print(f"no notebooks in {layout.notebooks_dir}")
        return 0
    width = max(len(p.stem) for p in notebooks)
    for nb in notebooks:
        presets = list_presets(nb.stem, layout.params_dir)
        print(f"{nb.stem:<{width}}  {', '.join(presets) if presets else '(no presets)'}")
    return 0


def _cmd_run(args: argparse.Namespace, layout: Layout) -> int:
    try:
        run_dir = run_notebook(args.notebook, args.preset, args.param, layout=layout)
    except NotebookFailed as err:
        print(f"klear: {err}", file=sys.stderr)
        return 1
    _report_contract(run_dir)
    print(run_dir)
    return 0


def _report_contract(run_dir: pathlib.Path) -> list[str]:
    missing = runs.check_run_dir(run_dir, runs.RUN_CONTRACT + (runs.NOTEBOOK_FILE,))
    if missing:
        print(f"klear: warning: {run_dir} lacks {', '.join(missing)} (see klear_lib.runs)", file=sys.stderr)
    return missing


def _cmd_prepare(args: argparse.Namespace, layout: Layout) -> int:
    out = prepare_notebook(args.notebook, args.preset, args.out, args.param, layout=layout, run_dir=args.run_dir)
    print(out)
    return 0


REPORT_PREFIX = "00_"  # notebooks named 00_* gather the others' runs: reproduce runs them last, as the report
REPRODUCE_LOG = "reproduce.json"


def _write_reproduce_log(layout: Layout, log: dict) -> None:
    """outputs/reproduce.json, rewritten after every notebook (a crash of reproduce itself keeps what ran)."""
    layout.output_root.mkdir(parents=True, exist_ok=True)
    path = layout.output_root / REPRODUCE_LOG
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(runs.to_json_text(log, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


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
    print(make_report(layout, args.preset))
    return 0


def _cmd_reproduce(args: argparse.Namespace, layout: Layout) -> int:
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
    params.add_argument("notebook", help="name (03_rl_clip_variants), with or without .ipynb, or a unique prefix (03)")
    params.add_argument("--preset", required=True, help="params/<notebook>/<preset>.yaml")
    params.add_argument(
        "-p", "--param", action="append", default=[], metavar="KEY=VALUE",
        help="override one parameter; the value is read as YAML (repeatable)",
    )

    parser = argparse.ArgumentParser(prog="klear", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", parents=[params, dirs], help="execute a notebook into a new run directory")
    p.add_argument("--output-root", help="run directories go to <output root>/<notebook>/ (default: outputs)")
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("list", parents=[dirs], help="list the notebooks and their presets")
    p.set_defaults(func=_cmd_list)
    p = sub.add_parser("prepare", parents=[params, dirs], help="inject parameters without executing (for nbval)")
    p.add_argument("--out", required=True, help="where to write the parameterized notebook")
    p.add_argument("--run-dir", help="the run_dir parameter (default: <dir of --out>/<notebook>)")
    p.set_defaults(func=_cmd_prepare)
    p = sub.add_parser("reproduce", parents=[dirs], help="run every notebook that has the preset, in name order")
    p.add_argument("--preset", default="tiny", help="default: tiny")
    p.add_argument("--output-root", help="default: outputs")
    p.set_defaults(func=_cmd_reproduce)
    p = sub.add_parser("report", parents=[dirs], help="gather every run under the output root into report.html")
    p.add_argument("--preset", default="tiny", help="preset of the 00_report notebook (default: tiny)")
    p.add_argument("--output-root", help="default: outputs")
    p.set_defaults(func=_cmd_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `klear` console script; returns the exit status (0 ok, 1 a notebook failed, 2 a usage error)."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args, Layout.from_args(args))
    except KlearError as err:
        print(f"klear: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
