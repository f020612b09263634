"""Plots and tables that read only a run directory's ``metrics.jsonl`` (the run-directory contract)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from klear_lib.glossary import title as metric_title
from klear_lib.runs import read_metrics


def _finish(fig, axes, used: int, *, legend: bool, title: str | None, out: str | Path | None):
    """Blank the unused panels, add the legend and title, lay out, save to ``out`` if given."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    if legend:
        axes.flat[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
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
    """One panel per metric (per metric and ``facet`` value when given), one line per ``by`` value: the mean over
    seeds against ``x`` with a ±1 std band. A ``by`` value has the same colour in every panel; one legend for the
    figure. Panel titles come from ``klear_lib.glossary``."""
    metrics = [m for m in metrics if m in df.columns]
    facets = list(dict.fromkeys(df[facet].dropna())) if facet else [None]
    panels = [(m, f) for m in metrics for f in facets]
    colors = {name: f"C{i % 10}" for i, name in enumerate(dict.fromkeys(df[by].dropna()))}
    ncols = min(ncols, max(1, len(panels)))
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.2 * nrows), squeeze=False)
    handles = {}
    for ax, (metric, value) in zip(axes.flat, panels):
        sub = df if value is None else df[df[facet] == value]
        c = curves(sub, metric, by=by, x=x)
        for name, g in c.groupby(by, sort=False):
            (line,) = ax.plot(g[x], g["mean"], marker="o" if metric.startswith("eval/") else None, ms=3,
                              color=colors.get(name), label=str(name))
            ax.fill_between(g[x], g["mean"] - g["std"], g["mean"] + g["std"], alpha=0.2, color=colors.get(name))
            handles.setdefault(str(name), line)
        where = "" if value is None else f" ({facet} {value:g})" if isinstance(value, float) else f" ({facet} {value})"
        ax.set_title(metric_title(metric) + where, fontsize=10)
        ax.set_xlabel(metric_title(x))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="upper right", fontsize=8, ncol=min(4, len(handles)))
    if title:
        fig.suptitle(title, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93 if handles or title else 1))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    return fig


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
        "final_std": last.groupby(level=0).std().fillna(0.0),
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
    Rows keep the order in which ``by`` values first appear in ``df``."""
    keys = [by] if isinstance(by, str) else list(by)
    sub = df.dropna(subset=[metric])
    g = sub.groupby(keys, sort=False)[metric]
    out = g.agg(["mean", "std", "min", "max"])
    out["std"] = out["std"].fillna(0.0)
    out["seeds"] = sub.groupby(keys, sort=False)[seed].nunique()
    return out


def plot_points(df: pd.DataFrame, x: str, metrics: list[str], *, hue: str | None = None, seed: str = "seed",
                out: str | Path | None = None, title: str | None = None, ncols: int = 3, xlabel: str | None = None):
    """For a sweep (``x`` categorical or numeric): each seed's value as a dot, the mean over seeds as a line,
    one panel per metric, one line per ``hue`` value."""
    metrics = [m for m in metrics if m in df.columns]
    ncols = min(ncols, max(1, len(metrics)))
    nrows = max(1, math.ceil(len(metrics) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False)
    order = list(dict.fromkeys(df[x]))
    pos = {v: i for i, v in enumerate(order)}
    for ax, metric in zip(axes.flat, metrics):
        sub = df.dropna(subset=[metric])
        groups = sub.groupby(hue, sort=False) if hue else [(None, sub)]
        for name, g in groups:
            xs = g[x].map(pos)
            line = ax.plot(*zip(*sorted(g.groupby(xs)[metric].mean().items())), marker="o",
                           label=None if name is None else str(name))[0]
            ax.scatter(xs, g[metric], s=12, alpha=0.5, color=line.get_color())
        ax.set_xticks(range(len(order)), [str(v) for v in order])
        ax.set_title(metric_title(metric), fontsize=10)
        ax.set_xlabel(xlabel or x)
        ax.grid(alpha=0.3)
    return _finish(fig, axes, len(metrics), legend=bool(hue and metrics), title=title, out=out)
