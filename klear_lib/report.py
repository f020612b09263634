"""`outputs/report.html`: one self-contained page gathering every run directory (see klear_lib.runs).

The page is the first thing to open after ``make reproduce``. It reads only what the run-directory contract
puts on disk, plus ``<output root>/reproduce.json`` when ``klear reproduce`` wrote one:

    collect_runs(root)   every ``<root>/<notebook>/<stamp>/`` as a RunInfo, with a status:
                         "ran"         summary.json present and the contract complete (the notebook ran; whether
                                       a claim reproduced is the claims table's business, never a status);
                         "failed"      the executed notebook holds an error output, or reproduce.json says so;
                         "incomplete"  no error found, but contract files missing or unreadable (still running,
                                       or killed without a word);
                         "interrupted" `klear run` recorded a Ctrl-C in ``status.json``;
                         "damaged"     ``metrics.jsonl`` holds a line that is not a JSON object (named: file, line)
                       A failed run shows its cause from ``status.json`` when `klear run` wrote one (a cell raised,
                       or the kernel died, out of memory where the kernel's cgroup counted it) and the last cell.
                       Only folders named like a run (``YYYYmmdd-HHMMSS``) are runs; others are listed as unknown.
    render_report(root)  writes ``<root>/report.html``: first one table of every claim of every notebook's newest
                         run with its verdict, effect and interval (``klear_lib.claims``), then an overview
                         table, a wall-time chart, and one section per notebook (its newest run; older runs
                         listed). Runs at the ``smoke`` preset are marked: their numbers test the code path only.

Figures are embedded as base64 data URIs and the CSS is inline, so the file can be mailed or archived alone.
Every string read from a file is HTML-escaped; only the caller's ``intro_html`` is inserted as is.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import html
import io
import json
import math
import os
import re
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from klear_lib import runs

REPORT_FILE = "report.html"
REPRODUCE_FILE = "reproduce.json"  # written by `klear reproduce`
REPORT_NOTEBOOK = "00_report"  # the notebook that renders this report: its runs appear nowhere in it
MAX_SUMMARY_ROWS = 40
MAX_ERROR_CHARS = 300
_FAILING = ("failed", "error")  # reproduce.json statuses (any case) that mean the notebook did not finish
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_STAMP = re.compile(r"(\d{8}-\d{6})(?:-(\d+))?")
_IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".svg": "image/svg+xml"}


@dataclasses.dataclass
class RunInfo:
    """What the report knows about one run directory (or, with an empty stamp, a notebook that made none)."""

    notebook: str
    run_dir: Path
    stamp: str
    status: str  # "ran" | "failed" | "incomplete" | "interrupted" | "damaged"
    error: str | None = None  # "<ename>: <evalue> (cell N)", or reproduce.json's message
    missing: list[str] = dataclasses.field(default_factory=list)  # contract files absent or unreadable
    preset: str | None = None  # preset.json's verdict ("smoke", "tiny", ..., "custom"), else params.json's request
    preset_nearest: str | None = None  # for a custom run: the preset it differs least from ...
    preset_differs: dict = dataclasses.field(default_factory=dict)  # ... and how: {key: {"run": v, "preset": v}}
    launcher: str | None = None  # who started it (preset.json): "klear run", "jupyter", "kernel", "python"
    params: dict = dataclasses.field(default_factory=dict)
    config: dict = dataclasses.field(default_factory=dict)
    git: dict = dataclasses.field(default_factory=dict)
    versions: dict = dataclasses.field(default_factory=dict)
    summary: dict = dataclasses.field(default_factory=dict)
    figures: list[Path] = dataclasses.field(default_factory=list)
    seeds: list[int] = dataclasses.field(default_factory=list)
    seconds: float | None = None  # wall time `klear run` recorded in params.json


# ----------------------------------------------------------------------------------------------------------
# Reading run directories.


def _stamp_key(stamp: str) -> tuple:
    """Sort key of a run stamp: `20250101-120000-10` after `-2` (create_run_dir's same-second suffix)."""
    m = _STAMP.fullmatch(stamp)
    return (m[1], int(m[2] or 1)) if m else (stamp, 0)


def _read_json(path: Path) -> tuple[Any, bool]:
    """(content, ok): ok is False when the file is absent, truncated or not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), True
    except (OSError, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None, False


def _parse_seeds(value: Any) -> list[int] | None:
    """`"0,1,2"` / `[0, 1, 2]` / `3` -> a list of ints; None when `value` is not one of those."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    if isinstance(value, (list, tuple)):
        try:
            return [int(v) for v in value if not isinstance(v, bool)]
        except (TypeError, ValueError):
            return None
    return None


def _seeds(params: Mapping, config: Mapping) -> list[int]:
    for source in (params, config):
        for key in ("seeds", "seed"):
            if key in source and (seeds := _parse_seeds(source[key])) is not None:
                return seeds
    return []


def cell_number(cells: Sequence[Mapping], pos: int) -> int:
    """The one number a cell goes by everywhere (``klear run``'s message, ``status.json``, the report): Jupyter's
    ``In [N]``, the label JupyterLab shows beside the cell when the executed ``notebook.ipynb`` is opened. It is
    the cell's execution count; a cell whose count was not saved yet (the kernel died while it ran) gets the count
    papermill gives it, its 1-based place among the code cells (papermill runs them once each, in order)."""
    count = cells[pos].get("execution_count")
    return count if isinstance(count, int) and count > 0 else sum(
        1 for c in cells[: pos + 1] if c.get("cell_type") == "code")


def _notebook_error(nb: Mapping) -> str | None:
    """"<ename>: <evalue> (cell [N])" for the first error output of an executed notebook, else None.

    N is ``cell_number``: Jupyter's ``In [N]``, as `klear run` prints it. Cells tagged ``raises-exception`` fail
    on purpose and are skipped. With no error output, a cell that papermill marked failed (a dead kernel) still
    counts.
    """
    cells = nb.get("cells") or []
    for pos, cell in enumerate(cells):
        meta = cell.get("metadata") or {}
        if "raises-exception" in (meta.get("tags") or []):
            continue
        where = f"[{cell_number(cells, pos)}]"
        for out in cell.get("outputs") or []:
            if out.get("output_type") == "error":
                ename = str(out.get("ename", "Error"))
                evalue = " ".join(_ANSI.sub("", str(out.get("evalue", ""))).split())
                budget = MAX_ERROR_CHARS - len(ename) - len(f": (cell {where})") - 2
                if len(evalue) > budget:
                    evalue = evalue[: max(budget, 20)] + "…"
                return f"{ename}: {evalue} (cell {where})"
    for pos, cell in enumerate(cells):
        if ((cell.get("metadata") or {}).get("papermill") or {}).get("status") == "failed":
            return f"execution failed without an error output (cell [{cell_number(cells, pos)}])"
    return None


def _figures(run_dir: Path, summary: Mapping) -> list[Path]:
    listed = summary.get("figures")
    if isinstance(listed, list) and listed:
        return [run_dir / str(f) for f in listed]
    return sorted((run_dir / "figures").glob("*.png"))


def _reproduce_rows(output_root: Path) -> list[dict]:
    log = read_reproduce_log(output_root)
    return [r for r in (log or {}).get("rows", []) if isinstance(r, dict) and r.get("notebook")]


def _row_key(row: Mapping) -> tuple[str, str] | None:
    """(notebook, stamp) of a reproduce.json row's run directory; None when it names none."""
    run_dir = row.get("run_dir")
    if not run_dir:
        return None
    parts = Path(str(run_dir)).parts
    return (parts[-2], parts[-1]) if len(parts) >= 2 else None


def _failing(row: Mapping) -> bool:
    return str(row.get("status", "")).lower() in _FAILING


RUN_STAMP = re.compile(r"\d{8}-\d{6}(-\d+)?")  # runs.create_run_dir's folder names


def _metrics_damage(path: Path) -> str | None:
    """None if every line of a metrics.jsonl is a JSON object; else the first bad line, named by file and line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # read_metrics warns on a truncated last line: damage too
            runs.read_metrics(path)
    except (runs.MetricsFormatError, UserWarning) as err:
        return f"damaged metrics: {err}"
    except (OSError, UnicodeDecodeError) as err:
        return f"damaged metrics: {path}: {err}"
    return None


def _status_text(recorded: Mapping) -> str:
    """One line from klear run's status.json: the cause, the error, the last cell."""
    parts = [str(recorded.get("cause") or recorded.get("status"))]
    if recorded.get("error"):
        parts.append(str(recorded["error"]))
    if recorded.get("cell") is not None:
        parts.append(f"last cell [{recorded['cell']}]: {recorded.get('cell_source', '')}")
    return "; ".join(parts)


def read_run(run_dir: str | os.PathLike, reproduce_row: Mapping | None = None) -> RunInfo:
    """The RunInfo of one run directory; `reproduce_row` is its row of reproduce.json, if any."""
    run_dir = Path(run_dir)
    missing: list[str] = []
    damage: str | None = None
    loaded: dict[str, dict] = {}
    params_record, params_ok = _read_json(run_dir / runs.PARAMS_FILE)
    through_klear = (run_dir / runs.PARAMS_FILE).exists()  # `klear run` also writes notebook.ipynb
    contract = runs.RUN_CONTRACT + ((runs.NOTEBOOK_FILE,) if through_klear else ())
    notebook: Any = None
    for name in contract:
        path = run_dir / name
        if name == runs.METRICS_FILE:
            if not path.is_file():
                missing.append(name)
            else:
                damage = _metrics_damage(path)
            continue
        content, ok = _read_json(path)
        if not ok or not isinstance(content, dict):
            missing.append(name)
        elif name == runs.NOTEBOOK_FILE:
            notebook = content
        else:
            loaded[name] = content
    if through_klear and (not params_ok or not isinstance(params_record, dict)):
        missing.append(runs.PARAMS_FILE)
        params_record = {}
    params_record = params_record if isinstance(params_record, dict) else {}
    if notebook is None and not through_klear and (run_dir / runs.NOTEBOOK_FILE).is_file():
        notebook, _ = _read_json(run_dir / runs.NOTEBOOK_FILE)  # a hand-made run with a notebook

    params = params_record.get("params") if isinstance(params_record.get("params"), dict) else {}
    # preset.json (every launcher: klear_lib.notebook.start_run) says which preset the parameters are; a run
    # from papermill or JupyterLab has no params.json, so its parameters come from there too.
    preset_record, _ = _read_json(run_dir / runs.PRESET_FILE)
    preset_record = preset_record if isinstance(preset_record, dict) else {}
    if not params and isinstance(preset_record.get("params"), dict):
        params = preset_record["params"]
    config = loaded.get(runs.CONFIG_FILE, {})
    summary = loaded.get(runs.SUMMARY_FILE, {})
    error = _notebook_error(notebook) if isinstance(notebook, dict) else None
    recorded, _ = _read_json(run_dir / runs.STATUS_FILE)
    recorded = recorded if isinstance(recorded, dict) else {}
    if recorded.get("status") == "interrupted":
        status, error = "interrupted", _status_text(recorded)
    elif recorded.get("status") == "failed":
        status, error = "failed", _status_text(recorded)
    elif error is not None:
        status = "failed"
    elif reproduce_row is not None and _failing(reproduce_row):
        status = "failed"
        error = str(reproduce_row.get("message") or f"klear reproduce: {reproduce_row.get('status')}")
    elif damage is not None:
        status, error = "damaged", damage
    else:
        status = "incomplete" if missing else "ran"
    preset = preset_record.get("preset") or params_record.get("preset")
    differs = preset_record.get("differs") if preset == "custom" else None
    return RunInfo(
        notebook=run_dir.parent.name,
        run_dir=run_dir,
        stamp=run_dir.name,
        status=status,
        error=error,
        missing=missing,
        preset=None if preset is None else str(preset),
        preset_nearest=preset_record.get("nearest") if preset == "custom" else None,
        preset_differs=differs if isinstance(differs, dict) else {},
        launcher=preset_record.get("launcher"),
        params=params,
        config=config,
        git=loaded.get(runs.GIT_FILE, {}),
        versions=loaded.get(runs.VERSIONS_FILE, {}),
        summary=summary,
        figures=_figures(run_dir, summary),
        seeds=_seeds(params, config),
        seconds=params_record.get("seconds") if _is_num(params_record.get("seconds")) else None,
    )


def collect_runs(output_root: str | os.PathLike) -> list[RunInfo]:
    """Every run directory ``<output_root>/<notebook>/<stamp>/``, sorted by (notebook, stamp).

    Files (the report itself, reproduce.json, READMEs) and hidden or ``_``-prefixed folders are skipped.
    A missing, truncated or non-JSON file never raises: it is named in the run's `missing`.
    """
    root = Path(output_root)
    if not root.is_dir():
        return []
    rows = {_row_key(r): r for r in _reproduce_rows(root)}
    found = []
    for nb_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        for run_dir in nb_dir.iterdir():
            if run_dir.is_dir() and RUN_STAMP.fullmatch(run_dir.name):
                found.append(read_run(run_dir, rows.get((nb_dir.name, run_dir.name))))
    return sorted(found, key=lambda r: (r.notebook, _stamp_key(r.stamp)))


def unknown_folders(output_root: str | os.PathLike) -> list[Path]:
    """Folders under ``<root>/<notebook>/`` that are not named like a run (``backup/``, ``old-runs/`` ...): not
    read as runs, listed in the report."""
    root = Path(output_root)
    if not root.is_dir():
        return []
    return sorted(run_dir for nb_dir in root.iterdir() if nb_dir.is_dir() and not nb_dir.name.startswith((".", "_"))
                  for run_dir in nb_dir.iterdir()
                  if run_dir.is_dir() and not run_dir.name.startswith(".") and not RUN_STAMP.fullmatch(run_dir.name))


def latest_runs(runs_: Iterable[RunInfo]) -> dict[str, RunInfo]:
    """The newest run of each notebook (by stamp), keyed by notebook name in name order."""
    latest: dict[str, RunInfo] = {}
    for run in runs_:
        held = latest.get(run.notebook)
        if held is None or _stamp_key(run.stamp) > _stamp_key(held.stamp):
            latest[run.notebook] = run
    return dict(sorted(latest.items()))


def read_reproduce_log(output_root: str | os.PathLike) -> dict | None:
    """``<output_root>/reproduce.json`` as written by `klear reproduce`; None if absent (or unreadable, with
    a warning). Its shape: ``{"preset", "started", "total_s", "rows": [{"notebook", "status", "seconds",
    "run_dir", "message"}, ...]}``."""
    path = Path(output_root) / REPRODUCE_FILE
    if not path.exists():
        return None
    log, ok = _read_json(path)
    if not ok or not isinstance(log, dict):
        warnings.warn(f"{path}: not a readable JSON object; the report ignores it")
        return None
    if not isinstance(log.get("rows"), list):
        log["rows"] = []
    return log


def beside_paper(summary: Mapping) -> pd.DataFrame | None:
    """``summary["beside_paper"]`` (``{"caption", "columns", "rows", "note"?}``) as a DataFrame, or None.

    The caption and note travel in ``df.attrs``; a null in a number column reads as NaN. A row whose length
    differs from the columns' raises ValueError naming ``beside_paper.rows[i]``.
    """
    table = summary.get("beside_paper")
    if table is None:
        return None
    if not isinstance(table, Mapping) or not isinstance(table.get("columns"), list):
        raise ValueError("summary['beside_paper'] must be a dict with a 'columns' list and a 'rows' list")
    columns, rows = table["columns"], table.get("rows") or []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            n = len(row) if isinstance(row, list) else type(row).__name__
            raise ValueError(
                f"summary['beside_paper']: beside_paper.rows[{i}] has {n} values, "
                f"beside_paper.columns has {len(columns)} ({', '.join(map(str, columns))})"
            )
    df = pd.DataFrame(rows, columns=columns)
    df.attrs["caption"] = str(table.get("caption") or "")
    df.attrs["note"] = str(table.get("note") or "")
    return df


# ----------------------------------------------------------------------------------------------------------
# HTML pieces.

_CSS = """
body{max-width:1100px;margin:2em auto;padding:0 1em;font-family:system-ui,-apple-system,"Segoe UI",Helvetica,
Arial,sans-serif;line-height:1.45;color:#222}
h1{margin-bottom:.2em}h2{margin-top:0}h3{margin:1.2em 0 .4em;font-size:1.05em}
section{border-top:2px solid #ccc;margin-top:2.5em;padding-top:1em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border:1px solid #bbb;padding:.25em .55em;text-align:left;vertical-align:top}
th{background:#f2f2f2}td.num{text-align:right;font-variant-numeric:tabular-nums}
caption{caption-side:top;text-align:left;font-weight:600;padding-bottom:.3em}
tr.row-failed td{background:#fdecea}tr.row-incomplete td{background:#fff6e0}
.badge{display:inline-block;padding:.05em .5em;border-radius:.3em;font-size:.75em;font-weight:600;
color:#fff;vertical-align:middle}
.ran{background:#2e7d32}.failed{background:#c62828}.incomplete{background:#d98c00}.smoke{background:#6d6d6d}
.custom{background:#1565c0}
.interrupted{background:#d98c00}.damaged{background:#8e24aa}tr.row-damaged td{background:#f3e5f5}
tr.row-interrupted td{background:#fff6e0}
.reproduced{background:#2e7d32}.reversed{background:#c62828}.inconclusive{background:#8a8a8a}
.error{border:1px solid #c62828;background:#fdecea;color:#8e1c1c;padding:.5em .7em;white-space:pre-wrap;
font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em;margin:.6em 0}
.warn{border-left:4px solid #d98c00;padding-left:.6em}
.meta,.note{color:#555;font-size:.9em}
img{max-width:100%;height:auto}figure{margin:1em 0;break-inside:avoid}
figcaption{color:#555;font-size:.85em}
pre{white-space:pre-wrap;font-size:.8em;background:#f7f7f7;padding:.5em;border:1px solid #ddd}
details{margin:.8em 0}summary{cursor:pointer;font-weight:600}
@media print{body{max-width:none;margin:0}section{break-before:page}a{color:inherit;text-decoration:none}}
"""

_e = html.escape


def _fmt(value: Any) -> str:
    """A cell's text: numbers to 4 significant digits, NaN and null as "–", ints and text as they are."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.4g}"
    try:
        if pd.isna(value):  # numpy NaN, pd.NA, NaT
            return "–"
    except (TypeError, ValueError):
        pass
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars
        return _fmt(value.item())
    return str(value)


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) or hasattr(value, "dtype")


def _signed(value: Any) -> str:
    """An effect or interval end: signed, 3 significant digits (``+0.336``, ``-0.0322``)."""
    return f"{value:+.3g}" if _is_num(value) and not isinstance(value, bool) else _fmt(value)


def _td(value: Any) -> str:
    return f'<td class="num">{_e(_fmt(value))}</td>' if _is_num(value) else f"<td>{_e(_fmt(value))}</td>"


def _badge(status: str) -> str:
    return f'<span class="badge {_e(status)}">{_e(status)}</span>'


MARKED_PRESETS = ("smoke", "custom")  # runs whose numbers are marked wherever they appear


def _smoke_badge(run: "RunInfo") -> str:
    """A badge for a smoke run (its numbers test the code path only) or a custom one (its parameters are no
    preset's); nothing for a run of a committed preset."""
    return " " + _badge(run.preset) if run.preset in MARKED_PRESETS else ""


def _differs_text(run: "RunInfo", limit: int = 6) -> str:
    """``nearest preset: key run-value (preset preset-value), ...`` of a custom run."""
    items = [f"{k} {_fmt(v.get('run'))} ({run.preset_nearest}: {_fmt(v.get('preset'))})"
             for k, v in run.preset_differs.items() if isinstance(v, Mapping)]
    more = f", and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


FRAGILE_HTML = ('<br><span class="meta">below the MDE: a rerun may not repeat this verdict</span>')
CLAIM_COLUMNS = ("notebook", "role", "claim", "source", "metric", "effect", "95% interval", "p", "MDE", "seeds",
                 "verdict for the stand-in", "what the stand-in can and cannot show")
CHECK_COLUMNS = ("notebook", "check", "metric", "measured", "result", "what it checks")
UNTESTED_COLUMNS = ("notebook (preset)", "role", "claim", "what it needs that the run had not")
VERDICT_TEXT = {  # each verdict phrased for what was shown: an effect in the tiny stand-in, not in the paper's setting
    "reproduced": "the stand-in shows the paper's direction",
    "reversed": "the stand-in shows the opposite direction",
    "inconclusive": "the stand-in cannot tell (no effect as large as the MDE was seen)",
}
ROLE_ORDER = {"primary": 0, "secondary": 1, "check": 2}


def claim_rows(latest: Mapping[str, "RunInfo"]) -> list[dict]:
    """Every claim (``summary["claims"]``) of every notebook's newest run that ran, with its notebook and preset,
    primary claims first, then secondary ones, then checks (each group in notebook order); malformed claims are
    skipped with a warning naming the run."""
    from klear_lib.claims import validate_claims

    out = []
    for nb, run in latest.items():
        found = run.summary.get("claims") if isinstance(run.summary, dict) else None
        if run.status != "ran" or not found:
            continue
        try:
            validate_claims(found, where=f"{run.run_dir}/summary.json claims")
        except ValueError as err:
            warnings.warn(f"report: skipping the claims of {run.run_dir}: {err}")
            continue
        own_starts = bool(run.summary.get("start_per_seed"))
        out += [{**c, "notebook": nb, "preset": run.preset, "start_per_seed": own_starts} for c in found]
    return sorted(out, key=lambda c: ROLE_ORDER[c["role"]])  # stable: notebook order within a role


def below_mde(r: Mapping) -> bool:
    """A decided claim (``reproduced`` / ``reversed``) whose effect is smaller than its MDE: the run had under 80%
    power for an effect of the size it saw, so a rerun on other noise (another machine trains other starts) may not
    repeat the verdict. Across two machine instances, 2 of the 3 verdicts that moved were of this kind
    (``docs/results.md``, 2026-12-04)."""
    mde = r.get("mde")
    return (r.get("verdict") in ("reproduced", "reversed") and isinstance(mde, (int, float))
            and math.isfinite(mde) and abs(r["effect"]) < mde)


def untested_rows(latest: Mapping[str, "RunInfo"], params_folder: str | os.PathLike | None = None) -> list[dict]:
    """The claims a notebook declares (``params/<notebook>/claims.yaml`` in ``params_folder``, default the
    checkout's) that its newest run did not make: one row each (notebook, preset, role, claim, id) with ``needs``,
    what the claim's ``requires`` asks of the parameters beside what the run had (``arms: dapo_half_lr (this run:
    dapo,...)``); for a claim without ``requires`` (07's checks, made from what ran) or one whose requirement the
    run meets (declared after it ran), says so."""
    from klear_lib import claims, notebook

    folder = Path(params_folder) if params_folder is not None else notebook.params_dir()
    out = []
    for nb, run in latest.items():
        found = run.summary.get("claims") if isinstance(run.summary, dict) else None
        path = folder / nb / notebook.CLAIMS_FILE if folder is not None else None
        if run.status != "ran" or not found or path is None or not path.is_file():
            continue
        try:
            declared = claims.load_declared(path)
        except ValueError as err:
            warnings.warn(f"report: cannot read {path}: {err}")
            continue
        made = {c.get("id") for c in found if isinstance(c, Mapping)}
        for cid, d in declared.items():
            if cid in made:
                continue
            unmet = [(k, w) for k, w in (d.get("requires") or {}).items()
                     if k not in run.params or not claims.requirement_met(run.params[k], w)]
            needs = "; ".join(
                f"{k}: {'set' if w is True else ', '.join(map(str, w if isinstance(w, list) else [w]))} (this run: "
                f"{run.params[k] if k in run.params else 'no such parameter'})" for k, w in unmet)
            if not needs:
                needs = ("declared after this run (its parameters meet what the claim needs)" if d.get("requires")
                         else "what it compares did not run (the notebook decides from what ran)")
            out.append({"notebook": nb, "preset": run.preset, "role": d["role"], "claim": d["claim"], "id": cid,
                        "needs": needs})
    return sorted(out, key=lambda c: ROLE_ORDER[c["role"]])


def forest_plot(rows: Sequence[Mapping]) -> str:
    """One panel per paired claim (primary first, then secondary, then the paired checks such as the A/A noise floor):
    the effect and its 95% interval, the per-seed differences as dots, and the band of effects smaller than the MDE
    (what the run could not have told from 0) around 0; each panel on its own scale (the claims' metrics differ),
    coloured by verdict (a check by its outcome). An embedded PNG, or "" without claims."""
    rows = [r for r in rows if "per_seed" in r]
    if not rows:
        return ""
    from matplotlib.figure import Figure

    colors = {"reproduced": "#2e7d32", "reversed": "#c62828", "inconclusive": "#6d6d6d"}
    fig = Figure(figsize=(9, 0.62 * len(rows) + 1.1))
    axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
    for ax, r in zip(axes, rows):
        dots = list(r["per_seed"].values())
        reach = max([abs(r["ci_low"]), abs(r["ci_high"]), *map(abs, dots), r.get("mde") or 0, 1e-12])
        if r.get("mde") or r.get("undetectable"):  # undetectable at these seeds: the whole axis
            band = r["mde"] if r.get("mde") else 1.15 * reach
            ax.axvspan(-band, band, color="#dddddd", lw=0)
        ax.axvline(0, color="#444", lw=0.8)
        ax.scatter(dots, [0.0] * len(dots), s=9, color="#777", alpha=0.7, zorder=2)
        c = colors[r.get("outcome", r["verdict"])]
        ax.plot([r["ci_low"], r["ci_high"]], [0, 0], color=c, lw=2.5, zorder=3)
        ax.plot([r["effect"]], [0], marker="D", color=c, ms=6, zorder=4)
        ax.set_xlim(-1.15 * reach, 1.15 * reach)
        ax.set_yticks([])
        ax.tick_params(axis="x", labelsize=7, pad=1)
        label = f'{r["notebook"][:2]} {r["role"][:3]}  {r["id"]}' + (f' ({r["preset"]})' if r["preset"] in
                                                                    MARKED_PRESETS else "")
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=7.5)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
    fig.suptitle("Every claim: effect (◆), 95% interval (bar), seeds (dots), MDE band (grey); each row its own scale",
                 fontsize=9)
    fig.subplots_adjust(left=0.42, right=0.98, top=1 - 0.5 / (0.62 * len(rows) + 1.1), bottom=0.35 / len(rows),
                        hspace=0.9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    return (f'<figure><img src="{uri}" alt="forest plot of every claim"><figcaption>Forest plot: one row per claim, '
            "primary claims first, the paired checks last (chk; the A/A row is the stand-in's noise floor). A dot is "
            "one seed's paired difference; the grey band holds the effects the run had less than 80% power to "
            "detect.</figcaption></figure>")


def _mde_text(r: Mapping) -> str:
    return "∞ (none detectable at these seeds)" if r.get("undetectable") else _num(r.get("mde"))


def _num(x, digits=3):
    return "–" if x is None else f"{x:.{digits}g}"


def claims_html(latest: Mapping[str, "RunInfo"]) -> str:
    """The report's first section: the forest plot, then one row per primary and secondary claim with its verdict
    phrased for the stand-in, then the checks apart (pass/fail, not counted); smoke and custom runs marked."""
    rows = claim_rows(latest)
    if not rows:
        return "<h2>Claims</h2><p>No notebook run has written claims yet.</p>"
    tested = [r for r in rows if r["role"] != "check"]
    checks = [r for r in rows if r["role"] == "check"]
    counts = {v: sum(r["verdict"] == v for r in tested) for v in ("reproduced", "reversed", "inconclusive")}
    primary = {v: sum(r["verdict"] == v for r in tested if r["role"] == "primary") for v in counts}
    marked = {r["preset"] for r in rows} & set(MARKED_PRESETS)
    head = "<thead><tr>" + "".join(f"<th>{_e(c)}</th>" for c in CLAIM_COLUMNS) + "</tr></thead>"
    body = []
    for r in tested:
        interval = f"[{_signed(r['ci_low'])}, {_signed(r['ci_high'])}]"
        mark = f" ({r['preset']})" if r["preset"] in MARKED_PRESETS else ""
        p = r.get("p_adjusted", r["p_value"])
        body.append(
            f'<tr><td><a href="#{_e(r["notebook"])}">{_e(r["notebook"])}</a>{_e(mark)}</td><td>{_e(r["role"])}</td>'
            f'<td>{_e(r["claim"])}<br><span class="meta">{_e(r["id"])}</span></td><td>{_e(r["source"])}</td>'
            f'<td>{_e(r["metric"])}</td><td class="num">{_e(_signed(r["effect"]))}</td>'
            f'<td class="num">{_e(interval)}</td><td class="num">{_e(_num(p, 2))}'
            f'{" (Holm)" if r["role"] == "secondary" else ""}</td><td class="num">{_e(_mde_text(r))}</td>'
            f'<td class="num">{_e(_fmt(r["seeds"]))}<br><span class="meta">'
            f'{"a start each" if r.get("start_per_seed") else "one start"}</span></td>'
            f'<td>{_badge(r["verdict"])} {_e(VERDICT_TEXT[r["verdict"]])}'
            f'{FRAGILE_HTML if below_mde(r) else ""}</td>'
            f'<td class="meta">{_e(r.get("scope", ""))}</td></tr>')
    check_rows = []
    for r in checks:
        mark = f" ({r['preset']})" if r["preset"] in MARKED_PRESETS else ""
        measured = (f"{_signed(r['effect'])} [{_signed(r['ci_low'])}, {_signed(r['ci_high'])}], {r['outcome']} "
                    f"(expected {r['expect']})" if "expect" in r else f"{_num(r['effect'], 4)} ({r['criterion']})")
        check_rows.append(
            f'<tr><td><a href="#{_e(r["notebook"])}">{_e(r["notebook"])}</a>{_e(mark)}</td>'
            f'<td>{_e(r["claim"])}<br><span class="meta">{_e(r["id"])}</span></td><td>{_e(r["metric"])}</td>'
            f'<td>{_e(measured)}</td><td>{_badge("ran" if r["verdict"] == "pass" else "failed")} '
            f'{_e(r["verdict"])}</td><td class="meta">{_e(r.get("scope", ""))}</td></tr>')
    note = ""
    if "smoke" in marked:
        note += ("<p class=\"warn\">Some claims come from <code>smoke</code> runs: those check the code path on a "
                 "few steps, and their verdicts mean nothing.</p>")
    if "custom" in marked:
        note += ("<p class=\"warn\">Some claims come from <code>custom</code> runs: their parameters match no "
                 "committed preset (each run's section says what differs).</p>")
    # notebooks whose summary says each seed trained its own start (``start_per_seed``): their intervals cover it
    own = [nb for nb, run in latest.items() if run.status == "ran" and isinstance(run.summary, dict)
           and run.summary.get("start_per_seed")]
    starts = (f"In {', '.join(_e(nb) for nb in own)} each seed trains its own SFT start, so an interval covers how "
              "the start varies; elsewhere " if own else "")
    tally = (f"<p>{len(tested)} claims tested against the papers ({sum(primary.values())} primary, one per notebook "
             f"that tests a paper; the rest secondary): " + ", ".join(f"{n} {v}" for v, n in counts.items())
             + " (primary: " + ", ".join(f"{n} {v}" for v, n in primary.items()) + "). "
             "Each verdict comes from one calibrated rule (<code>klear_lib.claims</code>): the paired Student-t "
             "95% interval over seeds must exclude 0 and, from 6 seeds up, the exact sign-flip test must agree "
             "(p ≤ 0.05; Holm-adjusted within a notebook for secondary claims; never below 3 seeds). Its "
             "false-positive rate on null data is at most 5% (measured in <code>tests/test_claims.py</code>). A "
             "verdict says what a 1M-parameter stand-in showed in minutes of CPU training, not whether the paper "
             "is right at its scale. " + starts +
             "the seeds vary training from one trained starting model (a notebook's base or SFT warm start; one "
             "per regime in 05): an interval covers that noise, not how the start varies. A run "
             "is bit-identical on one machine; another processor (each run records <code>cpu</code>, "
             "<code>cpu_id</code> and <code>cpu_capability</code> in <code>versions.json</code>, and 03, 04 and 06 "
             "the sha256 of each seed's start in <code>sft_start_sha256</code>) can train another start, and "
             "effects and verdicts can move with it (<code>docs/results.md</code>). "
             f"{len(checks)} checks (positive controls, pipeline checks, the noise floor) "
             "are listed apart and not counted.</p>")
    fragile = [r for r in tested if below_mde(r)]
    if fragile:
        one = len(fragile) == 1
        tally += (f"<p>{len(fragile)} of the {sum(r['verdict'] != 'inconclusive' for r in tested)} decided verdicts "
                  f"{'is' if one else 'are'} smaller than {'its' if one else 'their'} MDE (marked <i>below the "
                  "MDE</i>): the run had under 80% power for an effect of that size, so a rerun on other noise, "
                  f"another machine's starts included, may not repeat {'it' if one else 'them'}. Quote "
                  f"{'it' if one else 'them'} with the interval, not alone.</p>")
    untested = untested_rows(latest)
    if untested:
        tally += (f"<p>{len(untested)} declared claims were not tested by these runs, each listed below with why "
                  "(mostly an arm, a subset or a flag its preset leaves out). They are neither verdicts nor "
                  "counted.</p>")
    untested_html = ("<h3>Declared, not tested by these runs (not counted)</h3><table><thead><tr>"
                     + "".join(f"<th>{_e(c)}</th>" for c in UNTESTED_COLUMNS) + "</tr></thead><tbody>"
                     + "".join(f'<tr><td><a href="#{_e(r["notebook"])}">{_e(r["notebook"])}</a> ({_e(r["preset"])})'
                               f'</td><td>{_e(r["role"])}</td><td>{_e(r["claim"])}<br><span class="meta">'
                               f'{_e(r["id"])}</span></td><td>{_e(r["needs"])}</td></tr>' for r in untested)
                     + "</tbody></table>") if untested else ""
    checks_html = ("<h3>Checks (pass/fail, not counted)</h3><table><thead><tr>"
                   + "".join(f"<th>{_e(c)}</th>" for c in CHECK_COLUMNS) + "</tr></thead><tbody>"
                   + "".join(check_rows) + "</tbody></table>") if checks else ""
    return ("<h2>Claims</h2>" + tally + note + forest_plot(rows)
            + f"<table>{head}<tbody>{''.join(body)}</tbody></table>" + checks_html + untested_html)


def _table(header: Sequence[str] | None, rows: Iterable[Sequence[Any]], caption: str = "") -> str:
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    head = "<thead><tr>" + "".join(f"<th>{_e(str(h))}</th>" for h in header) + "</tr></thead>" if header else ""
    body = "".join("<tr>" + "".join(_td(v) for v in row) + "</tr>" for row in rows)
    return f"<table>{cap}{head}<tbody>{body}</tbody></table>"


def _flatten(d: Mapping, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Summary scalars as ("a/b", value); short lists of scalars joined with ", "; other lists dropped."""
    for key, value in d.items():
        if not prefix and key in ("beside_paper", "figures"):
            continue
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from _flatten(value, name)
        elif isinstance(value, list):
            if len(value) <= 12 and all(v is None or isinstance(v, (str, int, float)) for v in value):
                yield name, ", ".join(_fmt(v) for v in value)
        else:
            yield name, value


def _data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _figure_html(path: Path, base: Path) -> str:
    try:
        shown = str(path.relative_to(base))
    except ValueError:
        shown = str(path)
    mime = _IMAGE_TYPES.get(path.suffix.lower())
    if not path.is_file():
        return f'<p class="warn">figure listed in summary.json but missing: <code>{_e(shown)}</code></p>'
    if mime is None:
        return f'<p class="meta">figure not embedded (not an image type the page shows): <code>{_e(shown)}</code></p>'
    return (f'<figure><img src="{_data_uri(path, mime)}" alt="{_e(path.name)}">'
            f"<figcaption>{_e(shown)}</figcaption></figure>")


def _beside_paper_html(summary: Mapping) -> str:
    try:
        df = beside_paper(summary)
    except ValueError as err:
        return f'<div class="error">{_e(str(err))}</div>'
    if df is None:
        return ""
    out = ["<h3>Beside the paper</h3>",
           _table([str(c) for c in df.columns], df.itertuples(index=False, name=None), df.attrs.get("caption", ""))]
    if df.attrs.get("note"):
        out.append(f'<p class="note">{_e(df.attrs["note"])}</p>')
    return "\n".join(out)


def _commit_text(git: Mapping, short: bool = False) -> str:
    commit = str(git.get("commit") or "unknown")
    commit = commit[:12] if short and re.fullmatch(r"[0-9a-f]{40}", commit) else commit
    return commit + (" (dirty)" if git.get("dirty") else "")


def _stamp_text(run: RunInfo) -> str:
    return run.stamp or "(no run directory)"


def run_section_html(run: RunInfo, older: Sequence[RunInfo] = ()) -> str:
    """One ``<section>`` for a notebook: its newest `run` in full, the `older` runs as a list."""
    nb = _e(run.notebook)
    parts = [f'<section id="{nb}">', f"<h2>{nb} {_badge(run.status)}{_smoke_badge(run)}</h2>"]
    meta = [f"run <code>{_e(_stamp_text(run))}</code>"]
    if run.preset:
        meta.append(f"preset <code>{_e(run.preset)}</code>")
    if run.seeds:
        meta.append(f"seeds {_e(', '.join(map(str, run.seeds)))}")
    meta.append(f"<code>{_e(str(run.run_dir))}</code>")
    parts.append(f'<p class="meta">{" · ".join(meta)}</p>')
    if run.preset == "smoke":
        parts.append('<p class="warn">A <code>smoke</code> run: it checks that every code path runs, on a few steps; '
                     "its numbers and verdicts mean nothing.</p>")
    elif run.preset == "custom":
        nearest = f" It differs from <code>{_e(str(run.preset_nearest))}</code> in: {_e(_differs_text(run))}." \
            if run.preset_nearest and run.preset_differs else ""
        parts.append('<p class="warn">A <code>custom</code> run: its parameters match no committed preset, so its '
                     f"numbers are not the preset's.{nearest}</p>")
    if run.status in ("failed", "interrupted", "damaged"):
        parts.append(f'<div class="error">{_e(run.error or run.status)}</div>')
    if run.missing and run.stamp:
        what = "interrupted or still running" if run.status == "incomplete" else "files the run did not write"
        parts.append(f'<p class="warn">Missing or unreadable ({what}): {_e(", ".join(run.missing))}</p>')

    parts.append(_beside_paper_html(run.summary))
    parts.extend(_figure_html(f, run.run_dir) for f in run.figures)

    numbers = list(_flatten(run.summary))
    if numbers:
        parts.append("<h3>Summary numbers</h3>")
        parts.append(_table(["key", "value"], numbers[:MAX_SUMMARY_ROWS]))
        if len(numbers) > MAX_SUMMARY_ROWS:
            parts.append(f'<p class="note">… and {len(numbers) - MAX_SUMMARY_ROWS} more in summary.json</p>')

    if run.stamp:
        facts = [("preset", run.preset), ("launched by", run.launcher),
                 ("seeds", ", ".join(map(str, run.seeds)) or None),
                 ("commit", _commit_text(run.git) if run.git else None), ("branch", run.git.get("branch")),
                 ("run directory", str(run.run_dir))]
        parts.append("<details><summary>Run details: preset, code, versions, config</summary>")
        parts.append(_table(None, facts))
        if run.params:
            parts.append(_table(["parameter", "value"], sorted(run.params.items()), "notebook parameters"))
        if run.versions:
            parts.append(_table(["package", "version"], sorted(run.versions.items()), "versions"))
        if run.config:
            config_text = json.dumps(run.config, indent=2, sort_keys=True, default=str)
            parts.append(f"<p class=\"meta\">config.json</p><pre>{_e(config_text)}</pre>")
        parts.append("</details>")

    if older:
        parts.append("<h3>Older runs</h3><ul>")
        for o in older:
            err = f" — {_e(o.error)}" if o.error else ""
            miss = f" (missing {_e(', '.join(o.missing))})" if o.status == "incomplete" and o.missing else ""
            preset = f" [{_e(o.preset)}]" if o.preset else ""
            parts.append(f"<li><code>{_e(_stamp_text(o))}</code>{preset} {_badge(o.status)}{err}{miss}</li>")
        parts.append("</ul>")
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


# ----------------------------------------------------------------------------------------------------------
# The page.


def _wall_time_chart(rows: Sequence[Mapping]) -> str:
    """A horizontal bar per reproduce.json row (seconds), coloured by status, as an embedded PNG."""
    rows = [r for r in rows if isinstance(r.get("seconds"), (int, float))]
    if not rows:
        return ""
    from matplotlib.figure import Figure  # no pyplot: leaves the caller's backend and figures alone

    colors = {"ran": "#2e7d32", "ok": "#2e7d32", "incomplete": "#d98c00"}
    fig = Figure(figsize=(8, 0.45 * len(rows) + 1.0))
    ax = fig.add_subplot()
    names = [str(r["notebook"]) for r in rows][::-1]
    secs = [float(r["seconds"]) for r in rows][::-1]
    stat = [str(r.get("status", "")).lower() for r in rows][::-1]
    ax.barh(names, secs, color=[colors.get(s, "#c62828") for s in stat])
    for y, (s, st) in enumerate(zip(secs, stat)):
        ax.text(s, y, f" {s:.0f} s" + ("" if st in ("ran", "ok") else f" ({st})"), va="center", fontsize=8)
    ax.set_xlabel("wall time (s)")
    ax.set_xlim(0, max(secs) * 1.15 or 1)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    return (f'<figure><img src="{uri}" alt="wall time per notebook">'
            "<figcaption>wall time per notebook (klear reproduce)</figcaption></figure>")


def _parse_time(text: Any) -> _dt.datetime | None:
    """A naive local datetime from an ISO time or a run stamp; None if it is neither."""
    if not isinstance(text, str):
        return None
    try:
        t = _dt.datetime.fromisoformat(text)
    except ValueError:
        m = _STAMP.fullmatch(text)
        return _dt.datetime.strptime(m[1], "%Y%m%d-%H%M%S") if m else None
    return t.astimezone().replace(tzinfo=None) if t.tzinfo else t


def _placeholder(row: Mapping, output_root: Path) -> RunInfo:
    nb = str(row["notebook"])
    return RunInfo(notebook=nb, run_dir=Path(str(row.get("run_dir") or output_root / nb)), stamp="",
                   status="failed", error=str(row.get("message") or f"klear reproduce: {row.get('status')}"),
                   missing=list(runs.RUN_CONTRACT))


def render_report(
    output_root: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    title: str = "Klear reproduction report",
    intro_html: str = "",
) -> Path:
    """Write the report (default ``<output_root>/report.html``, atomically) and return its path.

    Sections follow notebook-name order, one per notebook: its newest run, older runs listed. A notebook that
    reproduce.json reports as failed without a run directory appears as failed with the log's message (as
    its newest run, unless a run directory is newer than the log). The 00_report notebook's own runs are left
    out of the page.
    """
    root = Path(output_root)
    out = Path(out) if out is not None else root / REPORT_FILE
    all_runs = [r for r in collect_runs(root) if r.notebook != REPORT_NOTEBOOK]
    log = read_reproduce_log(root)
    rows = [r for r in _reproduce_rows(root) if r["notebook"] != REPORT_NOTEBOOK]
    latest = latest_runs(all_runs)
    by_nb: dict[str, list[RunInfo]] = {}
    for run in all_runs:
        by_nb.setdefault(run.notebook, []).append(run)

    known = {(r.notebook, r.stamp) for r in all_runs}
    log_time = _parse_time((log or {}).get("started"))
    for row in rows:
        if _row_key(row) in known or not _failing(row):
            continue
        ph, held = _placeholder(row, root), latest.get(str(row["notebook"]))
        by_nb.setdefault(ph.notebook, []).append(ph)
        held_time = _parse_time(held.stamp) if held else None
        if held is None or log_time is None or held_time is None or held_time < log_time:
            latest[ph.notebook] = ph
    latest = dict(sorted(latest.items()))

    seconds = {nb: run.seconds for nb, run in latest.items() if run.seconds is not None}
    for row in rows:
        held = latest.get(str(row["notebook"]))
        if held is not None and (_row_key(row) == (held.notebook, held.stamp) or not held.stamp):
            seconds[held.notebook] = row.get("seconds")

    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    commits: dict[str, list[str]] = {}
    for run in latest.values():
        if run.git:
            commits.setdefault(_commit_text(run.git, short=True), []).append(run.notebook)
    commit_html = "; ".join(
        f"<code>{_e(c)}</code>" + (f" ({_e(', '.join(nbs))})" if len(commits) > 1 else "")
        for c, nbs in commits.items()
    ) or "unknown"
    head = [f"Generated {_e(now)} from <code>{_e(str(root.resolve()))}</code>.", f"Code: {commit_html}."]
    if log:
        total = log.get("total_s")
        head.append(
            f"Last <code>klear reproduce</code>: preset <code>{_e(str(log.get('preset')))}</code>, started "
            f"{_e(str(log.get('started')))}" + (f", {_e(_fmt(total))} s in all" if _is_num(total) else "") + "."
        )

    counts = {s: sum(r.status == s for r in latest.values())
              for s in ("ran", "failed", "incomplete", "interrupted", "damaged")}
    overview = ["<table><thead><tr><th>notebook</th><th>status</th><th>run</th><th>seconds</th><th>error</th>"
                "</tr></thead><tbody>"]
    for nb, run in latest.items():
        err = run.error or (f"missing {', '.join(run.missing)}" if run.status == "incomplete" else "")
        err = err if len(err) <= MAX_ERROR_CHARS else err[:MAX_ERROR_CHARS] + "…"
        overview.append(
            f'<tr class="row-{_e(run.status)}"><td><a href="#{_e(nb)}">{_e(nb)}</a></td><td>{_badge(run.status)}'
            f'{_smoke_badge(run)}</td>'
            f"<td><code>{_e(_stamp_text(run))}</code></td>{_td(seconds.get(nb))}<td>{_e(err)}</td></tr>"
        )
    overview.append("</tbody></table>")

    body = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">{" ".join(head)}</p>',
        intro_html,
        claims_html(latest),
        "<h2>Overview</h2>",
        f"<p>{len(latest)} notebooks: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + ".</p>"
        if latest else "<p>No run directories yet.</p>",
        "".join(overview) if latest else "",
        _unknown_html(root),
        _wall_time_chart(rows),
    ]
    for nb, run in latest.items():
        older = sorted((r for r in by_nb.get(nb, []) if r is not run), key=lambda r: _stamp_key(r.stamp),
                       reverse=True)
        body.append(run_section_html(run, older))
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(b for b in body if b) + "\n</body></html>\n")
    _write_atomic(out, page)
    return out


def _unknown_html(root: Path) -> str:
    folders = unknown_folders(root)
    if not folders:
        return ""
    items = "".join(f"<li><code>{_e(str(f.relative_to(root)))}</code></li>" for f in folders)
    return f'<p class="warn">Folders not named like a run (YYYYmmdd-HHMMSS), not read as runs:</p><ul>{items}</ul>'


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file beside `path`, then rename it over `path` (a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600: the report is for others to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
