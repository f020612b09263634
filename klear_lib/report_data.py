"""What the report shows, as plain data: every run directory read into a ``RunInfo``, every claim into a dict,
and the page (``gather``) and its card (``Card``) as dataclasses; ``klear_lib.report`` turns them into HTML and
Markdown through the templates in ``klear_lib/templates/``. Nothing here writes HTML: the data can be tested,
and printed (``klear run`` prints a run's card), without a page.

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
    claim_rows(latest)   every claim of every notebook's newest run that ran, primary claims first
    gather(root)         the whole page: the newest run of each notebook (a notebook that ``reproduce.json`` says
                         failed without a run directory as a placeholder), the claims, the card
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from klear_lib import claims as claims_mod
from klear_lib import runs
from klear_lib.report_declared import (
    ROLE_ORDER,
    declared_controls,
    declared_guards,
    not_tested_rows,
    retired_rows,
    untested_rows,
)
from klear_lib.report_verdicts import REPEAT_GOOD, VERDICT_TEXT, annotate

REPORT_FILE = "report.html"
REPRODUCE_FILE = "reproduce.json"  # written by `klear reproduce`
REPORT_NOTEBOOK = "00_report"  # the notebook that renders this report: its runs appear nowhere in it
MAX_SUMMARY_ROWS = 40
MAX_ERROR_CHARS = 300
_FAILING = ("failed", "error", "skipped", "interrupted")  # reproduce.json statuses that mean it did not finish
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
    cpu_seconds: float | None = None  # CPU time (the kernel and the workers it waited for), likewise


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
        cpu_seconds=params_record.get("cpu_seconds") if _is_num(params_record.get("cpu_seconds")) else None,
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



def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) or hasattr(value, "dtype")


def flatten(d: Mapping, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Summary scalars as ("a/b", value); short lists of scalars kept as lists (shown joined); other lists
    dropped. The summary's own tables (``beside_paper``, ``figures``) have their own places on the page."""
    for key, value in d.items():
        if not prefix and key in ("beside_paper", "figures"):
            continue
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from flatten(value, name)
        elif isinstance(value, list):
            if len(value) <= 12 and all(v is None or isinstance(v, (str, int, float)) for v in value):
                yield name, value
        else:
            yield name, value


def commit_text(git: Mapping, short: bool = False) -> str:
    commit = str(git.get("commit") or "unknown")
    commit = commit[:12] if short and re.fullmatch(r"[0-9a-f]{40}", commit) else commit
    return commit + (" (dirty)" if git.get("dirty") else "")


def processor_text(versions: Mapping) -> str | None:
    """``AMD EPYC (cpu_id 25/17/1, AVX512)`` from a run's versions.json (``runs.processor_info``); None when the
    run recorded no processor. Two runs can be bit-identical only on the same ``cpu_id`` and capability."""
    if not versions.get("cpu"):
        return None
    extra = [f"cpu_id {versions['cpu_id']}" if versions.get("cpu_id") else "", versions.get("cpu_capability")]
    extra = [str(e) for e in extra if e]
    return str(versions["cpu"]) + (f" ({', '.join(extra)})" if extra else "")


def sandbox_modes(latest: Mapping[str, RunInfo]) -> dict[str, list[str]]:
    """The code sandbox's mode of each run that recorded one (``versions.json``: ``cgroup v2``/``v1``, or ``none``
    where a user opted in to CPU time no cgroup counts) -> the notebooks."""
    out: dict[str, list[str]] = {}
    for nb, run in latest.items():
        if isinstance(run.versions, Mapping) and run.versions.get("sandbox"):
            out.setdefault(str(run.versions["sandbox"]), []).append(nb)
    return out


# ----------------------------------------------------------------------------------------------------------
# Claims.

STATUSES = ("ran", "failed", "incomplete", "interrupted", "damaged")  # a run's status, in the order counted
MARKED_PRESETS = ("smoke", "custom")  # runs whose numbers are marked wherever they appear
SHORT_CLAIM_CHARS = 66


def short_claim(text: str, limit: int = SHORT_CLAIM_CHARS) -> str:
    """A claim in a few words, for the card and the forest plot's rows: a closing "(X beats Y)" is the paper's
    comparison in its own words and stands for the claim; otherwise the claim without its asides in brackets, cut
    at a word before ``limit`` characters ("…"). Declared claims are sentences written to be read in full (the
    claims table has them); this keeps a row to one or two lines without a second name to maintain per claim."""
    text = " ".join(str(text).split())
    closing = re.search(r"\(([^()]* beats [^()]*)\)$", text)
    if closing:
        return closing[1]
    bare = re.sub(r"\s*\([^()]*\)", "", text).strip() or text
    if len(bare) <= limit:
        return bare
    cut = bare[: limit - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


def notebook_number(notebook: str) -> str:
    """``03`` of ``03_rl_clip_variants``: how the README and the card name a notebook; the name when it has none."""
    head = notebook.split("_", 1)[0]
    return head if head.isdigit() else notebook


def claim_rows(latest: Mapping[str, RunInfo], params_folder: str | os.PathLike | None = None) -> list[dict]:
    """Every claim (``summary["claims"]``) of every notebook's newest run that ran, with its notebook and preset,
    primary claims first, then secondary ones, then checks (each group in notebook order); malformed claims are
    skipped with a warning naming the run. Each row also has ``short`` (``short_claim``), ``below_mde``, ``p``
    (Holm-adjusted for a secondary claim) and the marks of ``report_verdicts.annotate`` (the verdict's words, the
    sign count, the repeat chance of a decided verdict, the controls against or leaving open the explanation, the
    failed checks that guard it, the A/A label, the split-half check's flag; ``control_of`` and ``guards`` from the
    declarations in ``params_folder`` where a run did not write them)."""
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
        out += [{**c, "notebook": nb, "preset": run.preset, "start_per_seed": own_starts,
                 "short": short_claim(c["claim"]), "below_mde": below_mde(c),
                 "p": c.get("p_adjusted", c.get("p_value"))} for c in found]
    annotate(out, declared_controls(latest, params_folder) if out else {},
             declared_guards(latest, params_folder) if out else {})
    return sorted(out, key=lambda c: ROLE_ORDER[c["role"]])  # stable: notebook order within a role


def below_mde(r: Mapping) -> bool:
    """A decided claim (``reproduced`` / ``reversed``) whose effect is smaller than its MDE: the run had under 80%
    power for an effect of the size it saw, so a rerun on other noise (another machine trains other starts) may not
    repeat the verdict. Across two machine instances, 2 of the 3 verdicts that moved were of this kind
    (``docs/results.md``, 2026-12-04). The page shows the chance itself (the row's ``repeat``,
    ``report_verdicts.repeat_chance``), which is under 0.8 exactly for these (the MDE is the effect a rerun
    detects four times in five); this mark stays in the data."""
    mde = r.get("mde")
    return (r.get("verdict") in ("reproduced", "reversed") and isinstance(mde, (int, float))
            and math.isfinite(mde) and abs(r["effect"]) < mde)


@dataclasses.dataclass
class Claims:
    """The claims of the newest runs, sorted and counted: what the claims section and the card say."""

    tested: list[dict]  # primary and secondary claims, primary first
    checks: list[dict]
    untested: list[dict]  # declared, not made by these runs
    retired: list[dict]  # declared once, no longer tested (retired.yaml), with their last result
    counts: dict[str, int]  # verdict -> how many tested claims have it
    primary: dict[str, int]  # ... of the primary claims
    check_counts: dict[str, int]  # "pass" / "fail"
    marked: list[str]  # the marked presets (smoke, custom) some claim comes from
    own_starts: list[str]  # notebooks whose seeds each trained their own start (``start_per_seed``)
    not_tested: list[dict] = dataclasses.field(default_factory=list)  # the papers' claims declared not tested

    @property
    def fragile(self) -> list[dict]:
        """Decided claims whose effect is below their MDE (``below_mde``)."""
        return [r for r in self.tested if r["below_mde"]]

    @property
    def unsure(self) -> list[dict]:
        """Decided claims a rerun with as many seeds repeats with a chance under ``REPEAT_GOOD`` (0.8), or whose
        chance cannot be estimated (no spread among the seeds)."""
        return [r for r in self.tested if r["verdict"] != "inconclusive"
                and (r.get("repeat") is None or r["repeat"] < REPEAT_GOOD)]

    @property
    def split_half_power(self) -> list[tuple[int, float]]:
        """(seeds, chance) for every seed count of the tested claims with a split-half z: the chance that the check
        flags a true shift of one paired sd between the halves at that many seeds (``claims.split_half_power``)."""
        counts = sorted({r["seeds"] for r in self.tested if r.get("block_z") is not None and r["seeds"] >= 4},
                        reverse=True)
        return [(n, claims_mod.split_half_power(n)) for n in counts]

    @property
    def decided(self) -> int:
        return sum(r["verdict"] != "inconclusive" for r in self.tested)

    @property
    def against(self) -> int:
        """Reproduced primaries with a declared control that came out reversed (``report_verdicts.annotate``)."""
        return sum(bool(r.get("controls_against")) for r in self.tested)

    @property
    def open(self) -> int:
        """Reproduced primaries with no control against the paper's explanation and one that came out inconclusive:
        the direction holds, the explanation is open (``report_verdicts.annotate``)."""
        return sum(bool(r.get("controls_open")) and not r.get("controls_against") for r in self.tested)

    @property
    def guarded(self) -> list[dict]:
        """Tested claims that a failed check guards (``guards``): their verdicts are not to be trusted."""
        return [r for r in self.tested if r.get("guard_failures")]


def gather_claims(latest: Mapping[str, RunInfo], params_folder: str | os.PathLike | None = None) -> Claims:
    rows = claim_rows(latest, params_folder)
    tested = [r for r in rows if r["role"] != "check"]
    checks = [r for r in rows if r["role"] == "check"]
    return Claims(
        tested=tested, checks=checks,
        untested=untested_rows(latest, params_folder) if rows else [],
        retired=retired_rows(latest, params_folder) if rows else [],
        not_tested=not_tested_rows(latest, params_folder) if rows else [],
        counts={v: sum(r["verdict"] == v for r in tested) for v in VERDICT_TEXT},
        primary={v: sum(r["verdict"] == v for r in tested if r["role"] == "primary") for v in VERDICT_TEXT},
        check_counts={v: sum(r["verdict"] == v for r in checks) for v in ("pass", "fail")},
        marked=[p for p in MARKED_PRESETS if any(r["preset"] == p for r in rows)],
        own_starts=[nb for nb, run in latest.items() if run.status == "ran" and isinstance(run.summary, dict)
                    and run.summary.get("start_per_seed")],
    )


# ----------------------------------------------------------------------------------------------------------
# The card and the page.


@dataclasses.dataclass
class Card:
    """What a reader needs at a glance, above everything (and in ``report.md``, and on the terminal): the claims
    (the primary ones of a whole report; every tested one of a single run) with verdict, effect, interval and
    seeds; the counts; the time; the code and the processor."""

    rows: list[dict]  # claim rows (``claim_rows``)
    claims: Claims
    runs: int  # notebooks counted (their newest runs)
    statuses: dict[str, int]  # run status -> how many
    wall_seconds: float | None  # the runs' wall-clock, summed
    cpu_seconds: float | None  # their CPU time, summed over the runs that recorded it ...
    cpu_runs: int  # ... this many of them
    commits: list[str]
    processors: list[str]
    presets: list[str]  # every preset of the runs, in notebook order
    sandboxes: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # code sandbox mode -> notebooks
    reproduce_s: float | None = None  # `klear reproduce`'s own total, where it wrote reproduce.json
    plan: list[dict] | None = None  # [{"cores", "predicted_s"}]: the wall-clock predicted from the units (plan_rows)

    @property
    def familywise(self) -> dict | None:
        """``{"k", "alpha", "rate"}``: the chance that at least one of the card's k primary claims comes out decided
        (reproduced or reversed) when none has an effect, each held to the rule's level (at most 5% on null data,
        measured): ``1 - (1 - alpha)^k`` for independent claims (``claims.familywise_rate``). None below 2."""
        k = sum(r["role"] == "primary" for r in self.rows)
        if k < 2:
            return None
        return {"k": k, "alpha": claims_mod.ALPHA, "rate": claims_mod.familywise_rate(k, claims_mod.ALPHA)}


def plan_rows(root: str | os.PathLike) -> list[dict] | None:
    """The wall-clock that ``klear reproduce`` predicted from its recorded units (``<root>/plan.json``, written
    before the report runs: ``klear_lib.schedule.plan``, list scheduling over the notebooks' order), per number of
    cores the larger of the one-pool makespan and all the work (units and the notebooks' own) over the cores, which
    bounds it where kernels compete for few cores. None without a readable plan (a warning names a damaged one)."""
    path = Path(root) / "plan.json"
    if not path.is_file():
        return None
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
        return [{"cores": int(r["cores"]), "predicted_s": max(float(r["one_pool_s"]), float(r["all_work_per_core_s"]))}
                for r in rows]
    except (OSError, ValueError, KeyError, TypeError) as err:
        warnings.warn(f"report: {path} cannot be read as a plan ({type(err).__name__}: {err}); the card leaves it out",
                      stacklevel=2)
        return None


def make_card(latest: Mapping[str, RunInfo], claims_: Claims, *, seconds: Mapping[str, Any] | None = None,
              log: Mapping | None = None, every_claim: bool = False, plan: list[dict] | None = None) -> Card:
    """The card of these runs. ``seconds`` overrides a run's recorded wall time (reproduce.json's, for a notebook
    that failed before it recorded one); ``every_claim``: the secondary claims too (one run's card)."""
    seconds = dict(seconds or {})
    for nb, run in latest.items():
        if nb not in seconds and run.seconds is not None:
            seconds[nb] = run.seconds
    walls = [float(s) for s in seconds.values() if _is_num(s)]
    cpus = [float(r.cpu_seconds) for r in latest.values() if r.cpu_seconds is not None]
    statuses = {s: n for s in STATUSES if (n := sum(r.status == s for r in latest.values()))}
    total = (log or {}).get("total_s")
    return Card(
        rows=[r for r in claims_.tested if every_claim or r["role"] == "primary"],
        claims=claims_, runs=len(latest), statuses=statuses,
        wall_seconds=sum(walls) if walls else None, cpu_seconds=sum(cpus) if cpus else None, cpu_runs=len(cpus),
        commits=list(dict.fromkeys(commit_text(r.git, short=True) for r in latest.values() if r.git)),
        processors=list(dict.fromkeys(p for r in latest.values() if (p := processor_text(r.versions)))),
        sandboxes=sandbox_modes(latest),
        presets=list(dict.fromkeys(str(r.preset) for r in latest.values() if r.preset)),
        reproduce_s=float(total) if _is_num(total) else None, plan=plan,
    )


def run_card(run: RunInfo) -> Card:
    """The card of one run (``klear run`` prints it): its claims, primary and secondary, its time."""
    latest = {run.notebook: run}
    return make_card(latest, gather_claims(latest), every_claim=True)


@dataclasses.dataclass
class Page:
    """Everything ``report.html`` shows, in the order it shows it."""

    root: Path
    latest: dict[str, RunInfo]  # notebook -> its newest run (or a placeholder), in name order
    older: dict[str, list[RunInfo]]  # notebook -> its other runs, newest first
    seconds: dict[str, Any]  # notebook -> the wall time shown for its newest run
    log: dict | None  # reproduce.json
    log_rows: list[dict]  # its rows (the report's own left out)
    claims: Claims
    card: Card
    commits: dict[str, list[str]]  # short commit -> the notebooks run at it
    unknown: list[Path]  # folders not named like a run


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


def gather(output_root: str | os.PathLike) -> Page:
    """The page's data. One entry per notebook: its newest run, older runs listed. A notebook that reproduce.json
    reports as failed without a run directory appears as failed with the log's message (as its newest run, unless
    a run directory is newer than the log). The 00_report notebook's own runs are left out."""
    root = Path(output_root)
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

    seconds: dict[str, Any] = {nb: run.seconds for nb, run in latest.items() if run.seconds is not None}
    for row in rows:
        held = latest.get(str(row["notebook"]))
        if held is not None and (_row_key(row) == (held.notebook, held.stamp) or not held.stamp):
            seconds[held.notebook] = row.get("seconds")
    commits: dict[str, list[str]] = {}
    for run in latest.values():
        if run.git:
            commits.setdefault(commit_text(run.git, short=True), []).append(run.notebook)
    older = {nb: sorted((r for r in by_nb.get(nb, []) if r is not run), key=lambda r: _stamp_key(r.stamp),
                        reverse=True) for nb, run in latest.items()}
    claims_ = gather_claims(latest)
    return Page(root=root, latest=latest, older=older, seconds=seconds, log=log, log_rows=rows, claims=claims_,
                card=make_card(latest, claims_, seconds=seconds, log=log, plan=plan_rows(root)), commits=commits,
                unknown=unknown_folders(root))
