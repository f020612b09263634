"""`klear`: the command line. Runs the project's notebooks headless with papermill, with named presets and checked
parameters; every command is a thin layer over ``klear_lib.presets`` (parameters) and ``klear_lib.runner`` (runs).
Nothing in klear_lib imports this module.

    klear list
    klear params 03_rl_clip_variants                              # every parameter with its value in each preset
    klear run 03_rl_clip_variants --preset tiny -p seeds=0,1 -p rl_lr=1.0e-4
    klear run --resume outputs/03_rl_clip_variants/<stamp>        # continue an interrupted run (units not redone)
    klear prepare 03 --preset smoke --out build/nb/03.ipynb      # inject parameters, don't execute (nbval)
    klear prepare --all --preset smoke --out build/nb             # ... every notebook with the preset (make test)
    klear reproduce --preset tiny                                 # every notebook that has params/<nb>/tiny.yaml,
                                                                  # at once over one pool of cores, then the report
    klear reproduce --plan --cores 2 16 64                        # predicted wall-clock from the recorded runs
    klear report                                                  # outputs/report.html from every run under outputs/
    klear report --compare OTHER/outputs                          # ... with a "Compared with" section
    klear compare outputs OTHER/outputs                           # two trees (or two run directories), claim by claim
    klear lab                                                     # JupyterLab at the repository, on notebooks/
    klear lab 03 --preset smoke                                   # ... on a prepared copy in outputs/lab/

A preset is ``params/<notebook>/<preset>.yaml``; ``-p key=value`` overrides one value (``klear_lib.presets``).
klear sets the notebook's ``run_dir`` to a fresh ``outputs/<notebook>/<stamp>`` folder, where the notebook writes
its run directory (see klear_lib.runs) and papermill writes the executed ``notebook.ipynb`` (``klear_lib.runner``).
Exit status: 0 ok, 1 a notebook failed, 2 a usage error (one line, no traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Sequence

from klear_lib import __version__, presets, runner
from klear_lib.presets import KlearError


def layout_from_args(args: argparse.Namespace) -> runner.Layout:
    """The folders of a command: ``--repo-root`` (default: this checkout, else the cwd) and the folders under it."""
    root = pathlib.Path(args.repo_root).resolve() if args.repo_root else presets.default_repo_root()

    def pick(flag, default):
        return pathlib.Path(flag).resolve() if flag else root / default

    return runner.Layout(
        repo_root=root,
        notebooks_dir=pick(args.notebooks_dir, "notebooks"),
        params_dir=pick(args.params_dir, "params"),
        output_root=pick(getattr(args, "output_root", None), "outputs"),
    )


def _cmd_list(args: argparse.Namespace, layout: runner.Layout) -> int:
    runner.require_notebooks(layout)
    notebooks = presets.list_notebooks(layout.notebooks_dir)
    if not notebooks:
        raise KlearError(f"no notebooks (*.ipynb) in {layout.notebooks_dir}")
    width = max(len(p.stem) for p in notebooks)
    for nb in notebooks:
        names = presets.list_presets(nb.stem, layout.params_dir)
        print(f"{nb.stem:<{width}}  {', '.join(names) if names else '(no presets)'}")
    return 0


def _cmd_params(args: argparse.Namespace, layout: runner.Layout) -> int:
    """Every parameter of a notebook with its default and its value in each preset (or one preset)."""
    runner.require_notebooks(layout)
    notebook = presets.resolve_notebook(args.notebook, layout.notebooks_dir)
    declared = presets.notebook_parameters(notebook)
    shown = [args.preset] if args.preset else presets.list_presets(notebook.stem, layout.params_dir)
    values = {p: presets.load_params_with_sources(notebook.stem, p, (), layout.params_dir)[0] for p in shown}
    rows = [["parameter", "default", *shown]]
    for key, param in declared.items():
        if key == presets.RUN_DIR_PARAM:
            continue
        rows.append([key, str(param.get("default")), *(repr(values[p][key]) if key in values[p] else "·"
                                                        for p in shown)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"(· = the notebook's default; {notebook.stem} in {layout.notebooks_dir})")
    return 0


def _cmd_run(args: argparse.Namespace, layout: runner.Layout) -> int:
    runner.require_notebooks(layout)
    params, executor, address = _executor_params(args)
    if args.resume and (args.notebook or params):
        raise KlearError("--resume continues a run with its recorded notebook and parameters: give no notebook "
                         "and no -p with it")
    if not args.resume and not args.notebook:
        raise KlearError("name a notebook (klear list shows them), or give --resume RUN_DIR")
    try:
        run_dir = runner.run_notebook(args.notebook, args.preset, params, layout=layout, resume=args.resume,
                                      executor=executor, ray_address=address)
    except runner.NotebookFailed as err:
        print(f"klear: {err}", file=sys.stderr)
        return 1
    except runner.RunInterrupted as err:
        print(f"klear: {err}", file=sys.stderr)
        return 130
    runner.report_contract(run_dir)
    _print_card(run_dir=run_dir)
    print(run_dir)
    return 0


def _print_card(*, run_dir: pathlib.Path | None = None, output_root: pathlib.Path | None = None,
                report_path: pathlib.Path | None = None) -> None:
    """The report card (klear_lib.report): one run's claims on stderr after ``klear run`` (stdout stays the run
    directory alone, for scripts), every notebook's after ``klear reproduce`` on stdout. A card that cannot be read
    is one line of warning: the run itself is done."""
    from klear_lib import report

    try:
        if run_dir is not None:
            text = report.card_markdown(report.run_card(report.read_run(run_dir)), single=True,
                                        title=f"{run_dir.parent.name} {run_dir.name}")
        else:
            text = report.card_markdown(report.gather(output_root).card, report=report_path)
    except (OSError, ValueError) as err:
        print(f"klear: warning: no report card: {err}", file=sys.stderr)
        return
    print("\n" + text, file=sys.stderr if run_dir is not None else sys.stdout, flush=True)


EXECUTOR_PARAMS = ("executor", "ray_address")  # -p keys that say where units run, not what a notebook computes


def _executor_params(args: argparse.Namespace) -> tuple[list[str], str | None, str | None]:
    """``--executor``/``--ray-address``, or the same as ``-p executor=ray``/``-p ray_address=...`` (taken out of
    the notebook's parameters: where units run changes none of their numbers); the other ``-p`` as given."""
    executor, address, rest = args.executor, args.ray_address, []
    for item in args.param:
        key, sep, value = item.partition("=")
        if sep and key.strip() in EXECUTOR_PARAMS:
            value = str(presets.parse_value(value))  # read as every -p value is (YAML: quotes and all)
            if key.strip() == "executor":
                executor = value
            else:
                address = value
        else:
            rest.append(item)
    if executor not in (None, "local", "ray"):
        raise KlearError(f"executor {executor!r}: expected local or ray")
    if address and executor != "ray":
        raise KlearError("--ray-address needs --executor ray")
    if executor == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise KlearError("--executor ray needs Ray in this environment: pip install 'ray==2.60.0' (the 'ray' "
                             "extra)")
    return rest, executor, address


def _cmd_prepare(args: argparse.Namespace, layout: runner.Layout) -> int:
    if args.all:
        return _prepare_all(args, layout)
    if not args.notebook:
        raise KlearError("prepare needs a notebook name (klear list shows them), or --all")
    out = runner.prepare_notebook(args.notebook, args.preset, args.out, args.param, layout=layout, run_dir=args.run_dir)
    print(out)
    return 0


def _prepare_all(args: argparse.Namespace, layout: runner.Layout) -> int:
    """``prepare --all``: every notebook that has the preset (the report's included) into ``<out>/<notebook>.ipynb``,
    run directory ``<out>/runs/<notebook>/<stamp>`` (one stamp, named as klear names run folders), in one process
    (papermill's import alone is ≈3 s a process; make test prepares eight notebooks)."""
    if args.notebook or args.param or args.run_dir:
        raise KlearError("prepare --all takes no notebook, -p or --run-dir: it writes <--out>/<notebook>.ipynb for "
                         "every notebook with the preset, run directory <--out>/runs/<notebook>/<stamp>")
    runner.require_notebooks(layout)
    out, stamp = pathlib.Path(args.out), time.strftime("%Y%m%d-%H%M%S")
    names = [nb.stem for nb in presets.list_notebooks(layout.notebooks_dir)
             if (layout.params_dir / nb.stem / f"{args.preset}.yaml").is_file()]
    if not names:
        raise KlearError(f"no notebook in {layout.notebooks_dir} has a {args.preset!r} preset in {layout.params_dir}")
    for name in names:
        print(runner.prepare_notebook(name, args.preset, out / f"{name}.ipynb", layout=layout,
                               run_dir=out / "runs" / name / stamp))
    return 0


def _cmd_lab(args: argparse.Namespace, layout: runner.Layout) -> int:
    """JupyterLab at the repository root (jupytext's configuration, one entry per notebook; klear_lib.lab); with a
    notebook, on a prepared copy of it with the preset's parameters, outside the tracked files."""
    import subprocess

    from klear_lib import lab

    runner.require_notebooks(layout)
    if not layout.output_root.resolve().is_relative_to(layout.repo_root.resolve()):
        raise KlearError(f"--output-root {layout.output_root} is outside the repository {layout.repo_root}: JupyterLab "
                         "opens only files under its root (the repository, so that jupytext reads jupytext.toml)")
    open_path = None
    if args.notebook:
        notebook, name, params = runner.resolve(args.notebook, args.preset, args.param, layout, dry_run=True)
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


def _cmd_report(args: argparse.Namespace, layout: runner.Layout) -> int:
    from klear_lib import compare, report

    if not report.collect_runs(layout.output_root) and not (layout.output_root / runner.REPRODUCE_LOG).is_file():
        raise KlearError(f"no run directories under {layout.output_root}: run a notebook first "
                         "(klear run NOTEBOOK), or pass --output-root")
    # read before the report notebook runs, so that a wrong --compare is one line and exit 2 before any work
    comparison = compare.compare(layout.output_root, args.compare) if args.compare else None
    path = runner.make_report(layout, args.preset)
    if comparison is not None:  # the page again, as the report notebook writes it, with the "Compared with" section
        report.render_report(layout.output_root, path, comparison=comparison)
        report.write_card(layout.output_root, comparison=comparison)
    print(path)
    return 0


def _cmd_compare(args: argparse.Namespace, layout: runner.Layout) -> int:
    """Two outputs trees (or two run directories of one notebook) side by side, claim by claim (klear_lib.compare):
    the table on stdout, or its data as JSON."""
    import json

    from klear_lib import compare, report

    data = compare.compare(args.a, args.b)
    print(json.dumps(data, indent=2) + "\n" if args.json else report.comparison_markdown(data), end="")
    return 0


def _cmd_reproduce(args: argparse.Namespace, layout: runner.Layout) -> int:
    """Every notebook with the preset at once, as ``klear run`` children over one pool of unit slots, in the order
    of the dependency graph (``klear_lib.schedule``), then the report, the table, the card and the plan; with
    ``--plan``, only the plan from the latest recorded runs."""
    from klear_lib import schedule

    if args.plan:
        return _print_plan(args, layout)
    runner.require_notebooks(layout)
    preset = args.preset or "tiny"
    if args.cores and len(args.cores) > 1:
        raise KlearError("klear reproduce runs on one number of cores: give --cores N once (several with --plan)")
    cores = args.cores[0] if args.cores else presets.usable_cpus()
    if cores < 1 or (args.max_notebooks or 0) < 0:
        raise KlearError("--cores must be >= 1 and --max-notebooks >= 0 (0: every ready notebook at once)")
    names = [nb.stem for nb in presets.list_notebooks(layout.notebooks_dir)
             if not nb.stem.startswith(runner.REPORT_PREFIX)
             and (layout.params_dir / nb.stem / f"{preset}.yaml").is_file()]
    if not names:
        print(f"no notebook in {layout.notebooks_dir} has a {preset!r} preset in {layout.params_dir}")
        return 1
    at_once = args.max_notebooks or schedule.default_max_notebooks(cores, presets.usable_cpus())
    earlier = schedule.recorded_runs(layout.output_root, preset)  # longest expected first, where a run is recorded
    rank = schedule.upward_rank({n: r.work for n, r in earlier.items()},
                                schedule.dependencies(earlier), {n: r.wall for n, r in earlier.items()})
    clock, cpu = time.monotonic(), runner._cpu_seconds()
    log = {"preset": preset, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": cores,
           "max_notebooks": at_once, "total_s": 0.0, "rows": []}

    def record(rows: list[dict]) -> None:
        log["rows"] = rows
        log["total_s"] = round(time.monotonic() - clock, 1)
        runner.write_reproduce_log(layout, log)

    def plan_of(rows: list[dict], *, with_report: bool):
        """The plan of this reproduce's runs (and the report notebook's, once it ran), written to plan.json."""
        made = {r["notebook"]: pathlib.Path(r["run_dir"]) for r in rows if r["status"] in schedule.OK}
        if with_report:
            made.update({n: d for n, d in schedule.latest_runs(layout.output_root, preset).items()
                         if n.startswith(runner.REPORT_PREFIX)})  # the report notebook's run, if it has one
        recorded = schedule.recorded_runs(layout.output_root, run_dirs=made)
        if not recorded:
            return None, None
        data = schedule.plan(recorded, sorted({*schedule.PLAN_CORES, cores}), max_notebooks=args.max_notebooks or None)
        return data, schedule.write_plan(layout.output_root, data)

    print(f"== {', '.join(names)} ({preset}): {cores} unit slots, {at_once or 'all'} notebooks at once",
          file=sys.stderr, flush=True)
    with runner._adopting_descendants():  # a child's orphans come here: their CPU time is counted, they are reaped
        rows = schedule.run_notebooks(layout, preset, names, cores=cores, max_notebooks=at_once,
                                      rank={n: rank.get(n, 0.0) for n in names}, on_row=record)
    for row in rows:
        if row["status"] in ("FAILED", "ERROR", "skipped"):
            print(f"klear: {row['notebook']}: {row['status']}: {row['message']}", file=sys.stderr)
    plan_of(rows, with_report=False)  # plan.json before the report, so that its card states the predictions
    print("== report", file=sys.stderr, flush=True)
    start = time.time()
    report_path = runner.make_report(layout, preset)
    log["report"] = {"start": round(start, 3), "end": round(time.time(), 3), "path": str(report_path)}
    log["cpu_seconds"] = round(runner._cpu_seconds() - cpu, 1)
    record(rows)
    origin = min(r["start"] for r in rows)
    table = [(r["notebook"], r["status"], r["seconds"], r["start"] - origin, r["run_dir"] or r["message"])
             for r in rows] + [("report", "ran", log["report"]["end"] - start, start - origin, str(report_path))]
    width = max(len(r[0]) for r in table)
    print(f"{'notebook':<{width}}  {'status':<11}  {'time':>7}  {'start':>7}  run directory")
    for name, status, seconds, began, where in table:
        print(f"{name:<{width}}  {status:<11}  {seconds:>6.1f}s  {began:>6.1f}s  {where}")
    total = time.monotonic() - clock
    print(f"total: {total:.0f}s ({total / 60:.1f} min), {log['cpu_seconds']:.0f} CPU-s; report: {report_path}")
    _print_card(output_root=layout.output_root, report_path=report_path)
    data, path = plan_of(rows, with_report=True)  # again, now with the report notebook's own run
    if data:
        print("\n" + schedule.plan_table(data) + f"\n(written to {path})")
    failed = [r["notebook"] for r in rows if r["status"] in ("FAILED", "ERROR")]
    skipped = [r["notebook"] for r in rows if r["status"] == "skipped"]
    if failed:
        print(f"klear: {len(failed)} of {len(rows)} notebooks failed: {', '.join(failed)}", file=sys.stderr)
    if skipped:
        print(f"klear: {len(skipped)} skipped after a failure: {', '.join(skipped)}", file=sys.stderr)
    if any(r["status"] == "interrupted" for r in rows):
        return 130
    return 1 if failed or skipped else 0


def _print_plan(args: argparse.Namespace, layout: runner.Layout) -> int:
    """``klear reproduce --plan``: the predicted wall-clock per number of cores from the latest finished run of each
    notebook with ``--preset`` (default: the last ``klear reproduce``'s preset, else any); exit 2 when none is
    recorded."""
    from klear_lib import schedule

    preset = args.preset or schedule.last_reproduce_preset(layout.output_root)
    recorded = schedule.recorded_runs(layout.output_root, preset)
    if not recorded:
        which = f" with the {preset!r} preset" if preset else ""
        raise KlearError(f"--plan: no finished run{which} under {layout.output_root} to plan from: run klear "
                         "reproduce (or klear run) first, or pass --output-root")
    cores = args.cores or list(schedule.PLAN_CORES)
    if min(cores) < 1:
        raise KlearError("--cores must be >= 1")
    print(schedule.plan_table(schedule.plan(recorded, cores, max_notebooks=args.max_notebooks or None)))
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
    p.add_argument("--executor", choices=("local", "ray"), help="where units of work run: local (this machine's "
                   "worker processes, the default) or ray (tasks on a Ray cluster; also -p executor=ray); a run "
                   "started with one resumes with the other")
    p.add_argument("--ray-address", help="the Ray cluster (default: auto, the running one, else a local one)")
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
    p = sub.add_parser("reproduce", parents=[dirs], help="run every notebook that has the preset, at once over "
                                                          "one pool of cores (04 and 06 after 03), then the report")
    p.add_argument("--preset", help="default: tiny (with --plan: the last reproduce's preset, else any)")
    p.add_argument("--output-root", help="default: outputs")
    p.add_argument("--cores", type=int, nargs="+", metavar="N", help="units at once across all notebooks (default: "
                   "the cores this process may use); with --plan, the core counts to predict (default: 2 4 8 16 64)")
    p.add_argument("--max-notebooks", type=int, default=0, metavar="M", help="notebooks at once (default 0: as many "
                   "as the free memory holds, klear_lib.schedule.default_max_notebooks; with --plan, no limit)")
    p.add_argument("--plan", action="store_true", help="run nothing: predict the wall-clock for each --cores from "
                   "the recorded unit times of the latest runs under the output root")
    p.set_defaults(func=_cmd_reproduce)
    p = sub.add_parser("lab", parents=[params, dirs], help="JupyterLab at the repository; with a notebook, on a "
                                                            "prepared copy with a preset's parameters",
                       epilog="Everything after `--` goes to `jupyter lab` as it is; a headless server, for example: "
                              "klear lab 03 --preset smoke -- --no-browser --port 8890 --ip 127.0.0.1")
    p.add_argument("--output-root", help="the copies go to <output root>/lab/ (default: outputs)")
    p.add_argument("--print-command", action="store_true", help="print the jupyter command instead of running it")
    p.set_defaults(func=_cmd_lab)  # arguments after `--`: main() hands them to `jupyter lab` (the epilog)
    p = sub.add_parser("report", parents=[dirs], help="gather every run under the output root into report.html")
    p.add_argument("--preset", default="tiny", help="preset of the 00_report notebook (default: tiny)")
    p.add_argument("--output-root", help="default: outputs")
    p.add_argument("--compare", metavar="OTHER", help="another outputs tree (or a run directory): the page and "
                   "report.md get a 'Compared with' section, this tree as A, OTHER as B (as klear compare)")
    p.set_defaults(func=_cmd_report)
    p = sub.add_parser("compare", help="two outputs trees (or two run directories of one notebook) side by side, "
                                       "claim by claim: effects, intervals, the z of their difference, flipped "
                                       "verdicts")
    p.add_argument("a", metavar="A", help="an outputs tree (<notebook>/<stamp>/ under it) or one run directory")
    p.add_argument("b", metavar="B", help="likewise; claims are matched by notebook and claim id")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON data instead of the table")
    p.set_defaults(func=_cmd_compare, repo_root=None, notebooks_dir=None, params_dir=None)  # no folders of its own
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
        return args.func(args, layout_from_args(args))
    except KlearError as err:
        print(f"klear: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("klear: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
