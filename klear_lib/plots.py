"""Plots and tables that read only a run directory's ``metrics.jsonl`` (the run-directory contract)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator

from klear_lib.glossary import title as metric_title
from klear_lib.runs import read_metrics

# Line styles by series, widest first: when two runs give the same curve (the on-policy control, a one-seed smoke
# run), the later, thinner dashed line is drawn over the earlier one and both stay visible.
_STYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _series_style(i: int) -> dict:
    return {"linestyle": _STYLES[i % len(_STYLES)], "linewidth": max(2.6 - 0.45 * i, 1.0),
            "zorder": 3 + 0.01 * i}


def _figure(npanels: int, ncols: int, panel_size: tuple[float, float]):
    """A grid of panels laid out by matplotlib's constrained layout, which keeps the title, the panel titles and a
    legend placed outside the panels from covering one another."""
    ncols = min(ncols, max(1, npanels))
    nrows = max(1, math.ceil(npanels / ncols))
    return plt.subplots(nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows), squeeze=False,
                        layout="constrained")


def _integer_axis(ax, values) -> None:
    """Integer ticks on an axis whose values are whole numbers (rollouts, steps): never 2.5 rollouts."""
    vals = pd.to_numeric(pd.Series(list(values)), errors="coerce").dropna()
    if len(vals) and (vals == vals.round()).all():
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _finish(fig, axes, used: int, *, handles: dict | None, title: str | None, out: str | Path | None):
    """Blank the unused panels; one legend for the figure below the panels (never over the title); the title
    wrapped to the figure's width (never cut); save to ``out`` if given."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    if handles:
        fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", fontsize=8,
                   ncol=min(6, len(handles)), frameon=False)
    if title:
        width = fig.get_size_inches()[0]
        fig.suptitle(textwrap.fill(title, width=max(40, int(width * 10))), fontsize=11)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    return fig


def metrics_frame(run_dir: str | Path) -> pd.DataFrame:
    """All records of ``run_dir/metrics.jsonl`` as one DataFrame (one row per record)."""
    return pd.DataFrame(read_metrics(Path(run_dir) / "metrics.jsonl"))


def curves(df: pd.DataFrame, metric: str, *, by: str = "variant", seed: str = "seed",
           x: str = "rollout") -> pd.DataFrame:
    """Per ``by`` and ``x``: mean, std and count of ``metric`` over seeds (each seed's records at one x averaged
    first; rows lacking the metric ignored)."""
    keys = [by] if isinstance(by, str) else list(by)
    sub = df.dropna(subset=[metric])[[*keys, seed, x, metric]]
    per_seed = sub.groupby([*keys, seed, x], as_index=False)[metric].mean()
    out = per_seed.groupby([*keys, x])[metric].agg(["mean", "std", "count"]).reset_index()
    out["std"] = out["std"].fillna(0.0)
    return out


def plot_curves(df: pd.DataFrame, metrics: list[str], *, by: str = "variant", x: str = "rollout",
                facet: str | None = None, out: str | Path | None = None, ncols: int = 3, title: str | None = None):
    """One panel per metric (per metric and ``facet`` value when given: ``ncols`` is then meant as one column per
    facet value), one line per ``by`` value: the mean over seeds against ``x`` with a ±1 std band. A ``by`` value
    has the same colour and line style in every panel; one legend for the figure. Panel titles come from
    ``klear_lib.glossary``.

    A facet with one value (one learning rate) is no facet: its value goes into the panel titles and the metrics
    fill up to three columns, instead of one narrow column."""
    metrics = [m for m in metrics if m in df.columns]
    facets = list(dict.fromkeys(df[facet].dropna())) if facet else [None]
    if len(facets) == 1 and facet is not None:
        ncols = max(ncols, 3)
    panels = [(m, f) for m in metrics for f in facets]
    names = list(dict.fromkeys(df[by].dropna()))
    order = {name: i for i, name in enumerate(names)}
    fig, axes = _figure(len(panels), ncols, (4.6, 3.2))
    handles = {}
    for ax, (metric, value) in zip(axes.flat, panels):
        sub = df if value is None else df[df[facet] == value]
        c = curves(sub, metric, by=by, x=x)
        for name, g in c.groupby(by, sort=False):
            i = order.get(name, 0)
            (line,) = ax.plot(g[x], g["mean"], marker=_MARKERS[i % len(_MARKERS)] if metric.startswith("eval/")
                              else None, ms=4, color=f"C{i % 10}", label=str(name), **_series_style(i))
            ax.fill_between(g[x], g["mean"] - g["std"], g["mean"] + g["std"], alpha=0.15, color=f"C{i % 10}",
                            linewidth=0)
            handles.setdefault(str(name), line)
        where = "" if value is None else f" ({facet} {value:g})" if isinstance(value, float) else f" ({facet} {value})"
        ax.set_title(metric_title(metric) + where, fontsize=10)
        ax.set_xlabel(metric_title(x))
        _integer_axis(ax, sub[x] if x in sub else [])
        ax.grid(alpha=0.3)
    return _finish(fig, axes, len(panels), handles={k: handles[k] for k in map(str, names) if k in handles},
                   title=title, out=out)


def final_table(df: pd.DataFrame, *, by: str = "variant", seed: str = "seed", x: str = "rollout") -> pd.DataFrame:
    """Per ``by``: held-out avg@n at the start (``x`` = 0) and at the end, the change, their spread over seeds,
    and the mean clip statistics over all optimizer steps."""
    ev = df.dropna(subset=["eval/avg_at_n"])
    first = ev.sort_values(x).groupby([by, seed])["eval/avg_at_n"].first()
    last = ev.sort_values(x).groupby([by, seed])["eval/avg_at_n"].last()
    delta = last - first
    table = pd.DataFrame({
        "start": first.groupby(level=0).mean(),
        "final": last.groupby(level=0).mean(),
        "final_std": last.groupby(level=0).std(),  # NaN with one seed (no spread), not 0
        "delta": delta.groupby(level=0).mean(),
        "delta_min": delta.groupby(level=0).min(),
        "seeds": last.groupby(level=0).count(),
    })
    steps = df.dropna(subset=["actor/pg_loss"]) if "actor/pg_loss" in df else df.iloc[0:0]
    for col in ("actor/pg_clipfrac_low", "actor/pg_clipfrac_high", "actor/gppo_preserved_frac", "entropy",
                "grad_norm"):
        if col in steps:
            table[col.split("/")[-1]] = steps.groupby(by)[col].mean()
    return table.reindex(list(dict.fromkeys(df[by])))


def seed_summary(df: pd.DataFrame, metric: str, *, by: str | list[str] = "variant", seed: str = "seed") -> pd.DataFrame:
    """Per ``by`` (one column or several): mean, std, min and max of ``metric`` over seeds, and the seed count.
    Rows keep the order in which ``by`` values first appear in ``df``. A group of one seed has no std (NaN, not a
    measured 0: display it with ``na_rep``, or use ``seed_table``)."""
    keys = [by] if isinstance(by, str) else list(by)
    sub = df.dropna(subset=[metric])
    g = sub.groupby(keys, sort=False)[metric]
    out = g.agg(["mean", "std", "min", "max"])  # std is NaN for a group of one seed: it has no spread to show
    out["seeds"] = sub.groupby(keys, sort=False)[seed].nunique()
    return out


def plot_points(df: pd.DataFrame, x: str, metrics: list[str], *, hue: str | None = None, seed: str = "seed",
                out: str | Path | None = None, title: str | None = None, ncols: int = 3, xlabel: str | None = None):
    """For a sweep (``x`` categorical or numeric): each seed's value as a dot, the mean over seeds as a line,
    one panel per metric, one line per ``hue`` value (the same style in every panel; one legend)."""
    metrics = [m for m in metrics if m in df.columns]
    fig, axes = _figure(len(metrics), ncols, (4.6, 3.4))
    order = list(dict.fromkeys(df[x]))
    pos = {v: i for i, v in enumerate(order)}
    hues = list(dict.fromkeys(df[hue].dropna())) if hue else [None]
    handles = {}
    for ax, metric in zip(axes.flat, metrics):
        sub = df.dropna(subset=[metric])
        groups = sub.groupby(hue, sort=False) if hue else [(None, sub)]
        for name, g in groups:
            i = hues.index(name) if name in hues else 0
            xs = g[x].map(pos)
            line = ax.plot(*zip(*sorted(g.groupby(xs)[metric].mean().items())), marker=_MARKERS[i % len(_MARKERS)],
                           color=f"C{i % 10}", label=None if name is None else str(name), **_series_style(i))[0]
            ax.scatter(xs, g[metric], s=12, alpha=0.5, color=line.get_color(), zorder=2)
            if name is not None:
                handles.setdefault(str(name), line)
        ax.set_xticks(range(len(order)), [str(v) for v in order])
        ax.set_title(metric_title(metric), fontsize=10)
        ax.set_xlabel(xlabel or x)
        ax.grid(alpha=0.3)
    return _finish(fig, axes, len(metrics), handles=handles, title=title, out=out)


def censored_text(values, censored: float, digits: int = 3) -> str:
    """The mean of a read-out that is censored at ``censored`` (e.g. rollouts-to-threshold of a run that never
    reached it, ``claims.first_crossing``), as text that says so: ``"4.5"`` when no value is censored,
    ``"≥ 6.5 (1 of 2 censored at 8)"`` when some are (the mean is then a lower bound), ``"not reached (censored at
    8)"`` when all are."""
    vals = [float(v) for v in values if v == v]
    if not vals:
        return "–"
    hit = sum(v >= censored for v in vals)
    mean = sum(vals) / len(vals)
    if hit == 0:
        return f"{mean:.{digits}g}"
    if hit == len(vals):
        return f"not reached (censored at {censored:g})"
    return f"≥ {mean:.{digits}g} ({hit} of {len(vals)} censored at {censored:g})"


def seed_table(df: pd.DataFrame, columns: list[str], *, by: str | list[str] = "variant", seed: str = "seed",
               censored: dict[str, float] | None = None, digits: int = 3) -> pd.DataFrame:
    """A table to read, one row per ``by`` group (in order of appearance): each column's mean over seeds as text,
    ``mean ± std`` when the group has more than one seed and the mean alone when it has one (one seed has no spread:
    no NaN or 0 std is printed), and the seed count. ``censored`` maps a column to its censoring value
    (``censored_text``): a run that never reached a threshold is not shown as a measurement."""
    keys = [by] if isinstance(by, str) else list(by)
    censored = censored or {}
    rows = []
    for key, g in df.groupby(keys, sort=False):
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        for col in columns:
            vals = g[col].dropna()
            if col in censored:
                row[col] = censored_text(vals, censored[col], digits)
            elif not len(vals):
                row[col] = "–"
            elif len(vals) == 1:
                row[col] = f"{vals.iloc[0]:.{digits}g}"
            else:
                row[col] = f"{vals.mean():.{digits}g} ± {vals.std():.{max(digits - 1, 1)}g}"
        row["seeds"] = g[seed].nunique()
        rows.append(row)
    return pd.DataFrame(rows).set_index(keys)


# -- the report's figures (klear_lib.report): a matplotlib Figure without pyplot, so that rendering the report
# leaves the caller's backend and open figures alone.

VERDICT_COLORS = {"reproduced": "#2e7d32", "reversed": "#c62828", "inconclusive": "#7a7a7a"}
_ROLE_TITLES = {"primary": "primary claims", "secondary": "secondary claims", "check": "paired checks"}


def _standardised(r) -> float | None:
    """The paired sd a claim's row is divided by, or None when its seeds have no spread to scale by (one seed,
    or every seed the same difference)."""
    sd = r.get("sd")
    return float(sd) if isinstance(sd, (int, float)) and math.isfinite(sd) and sd > 0 else None


def _raw(value: float) -> str:
    """A raw effect or interval end beside its row: signed, 3 significant digits, an exact 0 as ``0``."""
    return "0" if value == 0 else f"{value:+.3g}"


def forest_label(r, width: int = 40) -> str:
    """A forest row's name: the notebook's number and the claim in a few words (``report_data.short_claim``; an
    A/A pair as what it is, ``report_verdicts.AA_LABEL``), wrapped to two lines at most; a smoke or custom run's
    preset after it."""
    from klear_lib.report_data import MARKED_PRESETS, notebook_number, short_claim
    from klear_lib.report_verdicts import AA_LABEL, is_aa

    mark = f" ({r['preset']})" if r.get("preset") in MARKED_PRESETS else ""
    name = AA_LABEL if is_aa(r) else r.get("short") or short_claim(r["claim"])
    lines = textwrap.wrap(name, width, break_on_hyphens=False) or [""]
    if len(lines) > 2:
        lines = [lines[0], textwrap.shorten(" ".join(lines[1:]), width, placeholder="…")]
    return f"{notebook_number(str(r['notebook']))}  " + "\n      ".join(lines) + mark


def forest_figure(rows):
    """One row per paired claim (primary first, then secondary, then the paired checks such as the A/A pair: one arm
    under two seed streams), all on one x axis: the standardised effect, effect ÷ the paired sd of the seeds (Cohen's
    d_z: every row, the A/A row too, over its own paired sd), with its 95% interval, each seed's difference as a dot and
    the band of effects the run had under 80% power to detect (MDE ÷ sd). The claims' metrics differ (an area under a
    probe, an accuracy, a CV), so a raw axis per row would make rows incomparable and draw a zero effect on a ×1e-12
    scale; in sd units they compare by eye, and the raw effect and interval are printed at the right of each row. A row
    whose seeds have no spread (one seed, as in a smoke run) has no sd to divide by: it is drawn as a ring at 0 and says
    so. Coloured by verdict (a check by the rule's outcome); a legend below. None without a paired claim."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    rows = [r for r in rows if "per_seed" in r]
    if not rows:
        return None
    ys, y, previous = [], 0.0, None
    for r in rows:
        if previous is not None and r["role"] != previous:
            y += 0.7  # a gap between roles
        ys.append(y)
        y += 1.0
        previous = r["role"]
    low, high = -2.5, 2.5  # at least ±2.5 sd: a row of small effects is not blown up to fill the axis
    for r in rows:
        sd = _standardised(r)
        if sd is not None:
            values = [float(v) / sd for v in (r["ci_low"], r["ci_high"], *r["per_seed"].values())]
            band = (r.get("mde") or 0.0) / sd
            low, high = min(low, *values, -band), max(high, *values, band)
    pad = 0.06 * (high - low)
    low, high = low - pad, high + pad
    fig = Figure(figsize=(11, 0.42 * y + 1.7), layout="constrained")
    ax = fig.add_subplot()
    for yy, r in zip(ys, rows):
        sd = _standardised(r)
        color = VERDICT_COLORS[r.get("outcome", r["verdict"])]
        if sd is None:
            ax.plot([0], [yy], marker="o", mfc="white", mec=color, ms=7, zorder=4, ls="none")
            ax.text(0.25, yy, f"{r['seeds']} seed{'s' if r['seeds'] != 1 else ''}, no spread: no sd to scale by",
                    va="center", fontsize=7.5, color="#555", style="italic")
        else:
            band = (-r["mde"] / sd, r["mde"] / sd) if r.get("mde") else (low, high) if r.get("undetectable") else None
            if band:  # undetectable at these seeds: the whole axis
                ax.fill_betweenx([yy - 0.38, yy + 0.38], *band, color="#e3e3e3", lw=0, zorder=1)
            dots = [float(v) / sd for v in r["per_seed"].values()]
            ax.scatter(dots, [yy] * len(dots), s=10, color="#666", alpha=0.7, zorder=2, lw=0)
            ax.plot([r["ci_low"] / sd, r["ci_high"] / sd], [yy, yy], color=color, lw=2.6, zorder=3,
                    solid_capstyle="butt")
            ax.plot([r["effect"] / sd], [yy], marker="D", color=color, ms=6.5, zorder=4, ls="none")
    for role in dict.fromkeys(r["role"] for r in rows):
        first = ys[[r["role"] for r in rows].index(role)]
        ax.text(-0.005, first - 0.62, _ROLE_TITLES.get(role, role), transform=ax.get_yaxis_transform(), ha="right",
                va="bottom", fontsize=8, weight="bold", color="#333")
    ax.axvline(0, color="#444", lw=0.8, zorder=1.5)
    ax.set_yticks(ys, [forest_label(r) for r in rows], fontsize=8)
    ax.set_ylim(y - 0.4, -0.9)
    # The raw effects as the tick labels of a right-hand axis: the layout makes room for them as for any label.
    raw = ax.twinx()
    raw.set_ylim(ax.get_ylim())
    raw.set_yticks(ys, [f"{_raw(r['effect'])} [{_raw(r['ci_low'])}, {_raw(r['ci_high'])}]" for r in rows],
                   fontsize=8, family="monospace")
    for label, r in zip(raw.get_yticklabels(), rows):
        label.set_color(VERDICT_COLORS[r.get("outcome", r["verdict"])])
    raw.tick_params(axis="y", length=0)
    raw.set_ylabel("raw effect [95% interval]", fontsize=8.5, rotation=270, labelpad=12)
    for side in ("top", "right", "left"):
        raw.spines[side].set_visible(False)
    ax.set_xlim(low, high)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=9, steps=[1, 2, 2.5, 5, 10]))
    fmt = ScalarFormatter(useOffset=False)
    fmt.set_scientific(False)
    ax.xaxis.set_major_formatter(fmt)
    ax.tick_params(axis="x", labelsize=8)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", alpha=0.25)
    ax.set_xlabel("standardised effect: effect ÷ paired sd of the seeds (0 = no difference)", fontsize=8.5)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    handles = [Patch(color=c, label=v) for v, c in VERDICT_COLORS.items()] + [
        Line2D([], [], marker="D", color="#333", ls="none", label="effect"),
        Line2D([], [], color="#333", lw=2.6, label="95% interval"),
        Line2D([], [], marker="o", color="#666", ls="none", ms=4, label="one seed"),
        Patch(color="#e3e3e3", label="under 80% power (MDE)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    return fig


def wall_time_figure(rows):
    """A horizontal bar per ``reproduce.json`` row (seconds), coloured by status; None without timed rows."""
    from matplotlib.figure import Figure

    rows = [r for r in rows if isinstance(r.get("seconds"), (int, float))]
    if not rows:
        return None
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
    return fig
