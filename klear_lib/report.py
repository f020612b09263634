"""`outputs/report.html` and `outputs/report.md`: every run directory (see klear_lib.runs) on one page, and its card.

The page is the first thing to open after ``make reproduce``. What it shows is plain data, read and counted by
``klear_lib.report_data`` (runs, claims, the card); how it reads (the words, the layout, the CSS) lives in the
Jinja2 templates of ``klear_lib/templates/``; this module holds what joins them: the one place where numbers,
plurals, capitals and durations become text (``fmt``, ``counted``, ``plural``, ``sentence``, ``duration``, the
templates' filters), the figures, and the writers.

    render_report(root)  writes ``<root>/report.html``: the card (the primary claims with verdict, the chance a
                         rerun repeats it, effect, interval, the seeds in the paper's direction; the counts; the
                         chance of a verdict by chance among the primaries; the time; the commit and the
                         processor), then the claims (short paragraphs on how a verdict is reached, the forest
                         plot, the claims table with the long fields folded, the checks apart, the declared claims
                         not made at this preset, retired, or not tested at all), an overview, a wall-time chart and
                         one section per notebook (its newest run; older runs listed). Smoke and custom runs are
                         marked.
    write_card(root)     writes ``<root>/report.md``: the card in Markdown, what ``klear reproduce`` prints at its end
    card_markdown(card)  the same text for any card (``klear run`` prints its run's, ``report_data.run_card``)
    comparison_markdown(cmp)  ``klear compare``'s table (``klear_lib.compare``); ``render_report`` and ``write_card``
                         add it, as a "Compared with" section, given ``comparison=``

Figures are embedded as base64 data URIs and the CSS is inline, so the file can be mailed or archived alone.
Every value a template prints is HTML-escaped (``html.escape``, as before the templates); only the caller's
``intro_html`` is inserted as is.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from klear_lib import report_data, report_verdicts
from klear_lib.report_data import (  # noqa: F401  (the report's reading API, as callers have always found it)
    _IMAGE_TYPES,
    MARKED_PRESETS,
    MAX_ERROR_CHARS,
    MAX_SUMMARY_ROWS,
    REPORT_FILE,
    REPORT_NOTEBOOK,
    REPRODUCE_FILE,
    RUN_STAMP,
    VERDICT_TEXT,
    Card,
    Page,
    RunInfo,
    _is_num,
    _notebook_error,
    below_mde,
    beside_paper,
    cell_number,
    claim_rows,
    collect_runs,
    gather,
    latest_runs,
    not_tested_rows,
    read_reproduce_log,
    read_run,
    retired_rows,
    run_card,
    short_claim,
    unknown_folders,
    untested_rows,
)

MD_FILE = "report.md"
TEMPLATES = Path(__file__).with_name("templates")


# ----------------------------------------------------------------------------------------------------------
# Numbers, plurals and capitals: the one place they become text (the templates' filters).


def fmt(value: Any) -> str:
    """A cell's text: numbers to 4 significant digits, NaN and null as "–", ints and text as they are, a short
    list joined with ", "."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value)
    try:
        import pandas as pd

        if pd.isna(value):  # numpy NaN, pd.NA, NaT
            return "–"
    except (TypeError, ValueError):
        pass
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars
        return fmt(value.item())
    return str(value)


def signed(value: Any) -> str:
    """An effect or interval end: signed, 3 significant digits (``+0.336``, ``-0.0322``); an exact zero as ``0``
    (a smoke run's one seed), never ``+0`` or ``-0`` (``report_verdicts.signed``, which the verdict words use)."""
    if not _is_num(value):
        return fmt(value)
    return report_verdicts.signed(value)


def percent(p: Any) -> str:
    """A chance as a reader says it: ``~84%``; ``>99%`` and ``<1%`` at the ends (a rounded 100% or 0% would claim a
    certainty the estimate does not have); ``–`` for none."""
    if not _is_num(p):
        return "–"
    if p > 0.99:
        return ">99%"
    if p < 0.01:
        return "<1%"
    return f"~{round(100 * float(p))}%"


def num(x: Any, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}g}"


def plural(n: int, one: str, many: str | None = None) -> str:
    """``one`` for exactly 1, else ``many`` (default ``one + "s"``): ``plural(n, "is", "are")``."""
    return one if n == 1 else (many if many is not None else one + "s")


def counted(n: int, one: str, many: str | None = None) -> str:
    """``1 claim``, ``0 claims``, ``3 checks``: a count and its noun, agreed."""
    return f"{n} {plural(n, one, many)}"


def sentence(text: str) -> str:
    """``text`` with its first letter upper-case and the rest untouched (Jinja's ``capitalize`` lowers the rest,
    which would turn ``SFT`` into ``sft``): a sentence put together from parts starts like a sentence."""
    text = str(text)
    stripped = text.lstrip()
    at = len(text) - len(stripped)
    return text[:at] + stripped[:1].upper() + stripped[1:]


def listing(items: Sequence[Any]) -> str:
    """``a``, ``a and b``, ``a, b and c``: a list in a sentence."""
    items = [str(i) for i in items]
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + " and " + items[-1]


def tally(counts: Mapping[str, int], against: int = 0, open: int = 0) -> str:
    """``1 reproduced, 0 reversed, 2 inconclusive``: every key, zeros included (a zero is news in a tally). With
    ``against`` (``Claims.against``), the reproduced ones that have a control against the paper's explanation are
    counted apart: ``2 reproduced, of which 1 with a control against the paper's explanation, 0 reversed, ...``;
    with ``open`` (``Claims.open``), those whose control leaves the explanation open, likewise."""
    apart = [f"{n} with {words}" for n, words in ((against, report_verdicts.AGAINST), (open, report_verdicts.OPEN))
             if n]
    parts = [f"{n} {k}" + (f", of which {' and '.join(apart)}" if k == "reproduced" and apart else "")
             for k, n in counts.items()]
    return ", ".join(parts) or "none"


def duration(seconds: float | None) -> str:
    """``48 s``, ``12 min 05 s``, ``1 h 03 min``: a wall-clock or CPU time as a reader says it."""
    if seconds is None:
        return "not recorded"
    s = round(float(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


OVERLAP_FACTOR = 1.05  # the runs' walls summed past this many times reproduce's own: they overlapped


def time_text(card: Card) -> str:
    """The card's time line: the runs' wall-clock and CPU time summed, and reproduce's own total."""
    if card.wall_seconds is None:
        return "not recorded"
    out = f"{duration(card.wall_seconds)} wall-clock over {counted(card.runs, 'run')}"
    if card.reproduce_s is not None and card.wall_seconds > OVERLAP_FACTOR * card.reproduce_s:
        # klear reproduce runs the notebooks side by side: their walls add up to more than the time that passed
        out += ", summed (they ran side by side in one schedule)"
    if card.cpu_seconds is not None:
        # the CPU-seconds too: the wall-clock on N cores is about them / N (the tiny runs keep every core busy)
        out += f", {duration(card.cpu_seconds)} CPU ({round(card.cpu_seconds):,} CPU-s)"
        if card.cpu_runs != card.runs:
            out += f" (recorded by {card.cpu_runs} of them)"
    else:
        out += "; CPU time not recorded (runs before klear recorded it)"
    if card.reproduce_s is not None:
        out += f"; klear reproduce {duration(card.reproduce_s)} in all"
    if card.plan:
        cores = " / ".join(str(r["cores"]) for r in card.plan)
        times = " / ".join(duration(r["predicted_s"]) for r in card.plan)
        out += (f"; predicted on {cores} cores from the recorded units (list scheduling, klear_lib.schedule; "
                f"predictions, not measurements): {times}")
    return out


REAL_MODEL_PRESET = "small-real"  # a real model on the CPU: a pipeline check, labelled so on the card


def preset_warning(preset: str, claims: bool = False) -> str | Markup:
    """What a marked preset means for the numbers: the page's notes and the card say it alike."""
    if preset == REAL_MODEL_PRESET:
        return (f"{REAL_MODEL_PRESET} runs: pipeline checks of a real pretrained model through every path (notebook "
                f"08; 07's evaluation of it); they reproduce no claim of the papers.")
    if preset == "smoke":
        return Markup("Some claims come from <code>smoke</code> runs: those check the code path on a few steps, and "
                      "their verdicts mean nothing.") if claims else \
            "Smoke runs: they check the code path on a few steps; their numbers and verdicts mean nothing."
    return Markup("Some claims come from <code>custom</code> runs: their parameters match no committed preset (each "
                  "run's section says what differs).")


def md_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A Markdown table padded to its columns, so that it reads as a table on a terminal too; a ``|`` in a cell
    is escaped and line breaks are folded."""
    cells = [[" ".join(str(v).split()).replace("|", "\\|") for v in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    return "\n".join([line[0], "|" + "|".join("-" * (w + 2) for w in widths) + "|", *line[1:]])


def overview_error(run: RunInfo) -> str:
    err = run.error or (f"missing {', '.join(run.missing)}" if run.status == "incomplete" else "")
    return err if len(err) <= MAX_ERROR_CHARS else err[:MAX_ERROR_CHARS] + "…"


def differs_text(run: RunInfo, limit: int = 6) -> str:
    """``key run-value (preset: preset-value), ...`` of a custom run."""
    items = [f"{k} {fmt(v.get('run'))} ({run.preset_nearest}: {fmt(v.get('preset'))})"
             for k, v in run.preset_differs.items() if isinstance(v, Mapping)]
    more = f", and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _escape(value: Any) -> Markup | str:
    """Every value a page template prints goes through here: markup (a macro's, ``intro_html``) as it is,
    anything else HTML-escaped by ``html.escape`` (``'`` as ``&#x27;``, as the page always wrote it)."""
    if value is None:
        return ""
    return value if hasattr(value, "__html__") else Markup(html.escape(str(value)))


@functools.lru_cache(maxsize=2)
def environment(page: bool = True) -> jinja2.Environment:
    """The templates' environment: for the page (``page=True``) every printed value is HTML-escaped; for the
    Markdown card nothing is (a terminal shows ``&lt;`` as it is)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=page, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True,
                             extensions=["jinja2.ext.do"], finalize=_escape if page else None)
    env.filters.update(fmt=fmt, signed=signed, num=num, percent=percent, plural=plural, counted=counted,
                       sentence=sentence,
                       listing=listing, tally=tally, duration=duration, time_text=time_text,
                       preset_warning=preset_warning, md_table=md_table, overview_error=overview_error,
                       number=report_data.notebook_number)
    env.tests["num"] = _is_num
    env.globals.update(marked_presets=MARKED_PRESETS, verdict_text=VERDICT_TEXT, against_text=report_verdicts.AGAINST,
                       open_text=report_verdicts.OPEN, halves_limit=report_verdicts.HALVES_LIMIT,
                       repeat_good=report_verdicts.REPEAT_GOOD)
    return env


# ----------------------------------------------------------------------------------------------------------
# Figures.


def _png_uri(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def forest_uri(rows: Sequence[Mapping]) -> str:
    """The forest plot (``plots.forest_figure``) as a data URI; "" without a paired claim."""
    from klear_lib import plots

    fig = plots.forest_figure(rows)
    return _png_uri(fig) if fig is not None else ""


def _figure(path: Path, base: Path) -> dict:
    try:
        shown = str(path.relative_to(base))
    except ValueError:
        shown = str(path)
    mime = _IMAGE_TYPES.get(path.suffix.lower())
    if not path.is_file():
        return {"shown": shown, "missing": True}
    if mime is None:
        return {"shown": shown}
    return {"shown": shown, "name": path.name, "uri": _data_uri(path, mime)}


# ----------------------------------------------------------------------------------------------------------
# The page.


def _section_context(run: RunInfo, older: Sequence[RunInfo]) -> dict:
    """What a notebook's section shows, ready for ``section.html.j2``."""
    beside, beside_error = None, None
    try:
        df = beside_paper(run.summary)
    except ValueError as err:
        beside_error = str(err)
    else:
        if df is not None:
            beside = {"columns": [str(c) for c in df.columns], "rows": list(df.itertuples(index=False, name=None)),
                      "caption": df.attrs.get("caption", ""), "note": df.attrs.get("note", "")}
    facts = [("preset", run.preset), ("launched by", run.launcher), ("seeds", ", ".join(map(str, run.seeds)) or None),
             ("commit", report_data.commit_text(run.git) if run.git else None), ("branch", run.git.get("branch")),
             ("run directory", str(run.run_dir))]
    return {"run": run, "older": list(older), "beside": beside, "beside_error": beside_error,
            "figures": [_figure(f, run.run_dir) for f in run.figures],
            "numbers": list(report_data.flatten(run.summary)),
            "max_rows": MAX_SUMMARY_ROWS, "facts": facts, "differs": differs_text(run),
            "config_text": json.dumps(run.config, indent=2, sort_keys=True, default=str) if run.config else ""}


def run_section_html(run: RunInfo, older: Sequence[RunInfo] = ()) -> str:
    """One ``<section>`` for a notebook: its newest `run` in full, the `older` runs as a list."""
    return environment().get_template("section.html.j2").render(_section_context(run, older)).strip()


def page_html(page: Page, *, title: str = "Klear reproduction report", intro_html: str = "",
              comparison: Mapping | None = None) -> str:
    """The whole page of ``page`` as HTML text; with ``comparison`` (``klear_lib.compare``'s data, this tree as A),
    its "Compared with" section before the overview."""
    import datetime as _dt

    from klear_lib import plots

    paired = page.claims.tested + page.claims.checks
    wall = plots.wall_time_figure(page.log_rows)
    return environment().get_template("report.html.j2").render(
        page=page, card=page.card, title=title, intro_html=Markup(intro_html),
        generated=_dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z"),
        forest_uri=forest_uri(paired), wall_uri=_png_uri(wall) if wall is not None else "", comparison=comparison,
        sections=[Markup(run_section_html(run, page.older.get(nb, ()))) for nb, run in page.latest.items()],
    )


def render_report(
    output_root: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    title: str = "Klear reproduction report",
    intro_html: str = "",
    comparison: Mapping | None = None,
) -> Path:
    """Write the report (default ``<output_root>/report.html``, atomically) and return its path.

    Sections follow notebook-name order, one per notebook: its newest run, older runs listed. A notebook that
    reproduce.json reports as failed without a run directory appears as failed with the log's message (as
    its newest run, unless a run directory is newer than the log). The 00_report notebook's own runs are left
    out of the page (``report_data.gather``). ``comparison`` (``klear_lib.compare.compare(root, OTHER)``) adds the
    "Compared with" section.
    """
    root = Path(output_root)
    out = Path(out) if out is not None else root / REPORT_FILE
    _write_atomic(out, page_html(gather(root), title=title, intro_html=intro_html, comparison=comparison))
    return out


def card_markdown(card: Card, *, title: str = "Klear report card", report: str | os.PathLike | None = None,
                  single: bool = False) -> str:
    """The card as Markdown (``card.md.j2``): the claims table, the counts, the time, the code and the processor;
    ``report`` names the full page at the end; ``single``: the card of one run."""
    text = environment(page=False).get_template("card.md.j2").render(card=card, title=title, single=single,
                                                                     report=str(report) if report else "")
    return "\n".join(line.rstrip() for line in text.strip().splitlines()) + "\n"


def write_card(output_root: str | os.PathLike, out: str | os.PathLike | None = None, *,
               comparison: Mapping | None = None) -> Path:
    """Write ``<output_root>/report.md`` (atomically): the card of every notebook's newest run, in Markdown; with
    ``comparison``, its short table below (``comparison_markdown``)."""
    root = Path(output_root)
    out = Path(out) if out is not None else root / MD_FILE
    text = card_markdown(gather(root).card, report=root / REPORT_FILE)
    if comparison:
        text += "\n" + comparison_markdown(comparison, heading=f"## Compared with {comparison['b']['path']}",
                                           full=False)
    _write_atomic(out, text)
    return out


def comparison_markdown(comparison: Mapping, *, heading: str = "# klear compare", full: bool = True) -> str:
    """``klear_lib.compare``'s data as Markdown (``compare.md.j2``): each side's processors, commits and presets,
    then one row per claim on both sides (``full``: each side's effect, interval, seeds and verdict, z, flipped; else
    the short table of ``report.md``), the claims on one side only and the runs that did not finish."""
    text = environment(page=False).get_template("compare.md.j2").render(cmp=comparison, heading=heading, full=full)
    return "\n".join(line.rstrip() for line in text.strip().splitlines()) + "\n"


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
