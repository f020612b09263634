"""Figures and tables people can read with one learning rate or one seed (klear_lib.plots): a single facet value
fills a grid instead of one narrow column; the legend never covers the title or a panel; a long title is wrapped,
not cut; two identical curves both stay visible; rollout axes have integer ticks; a censored read-out is not shown
as a measurement; one seed shows no std (neither NaN nor a made-up 0)."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from klear_lib import plots  # noqa: E402


def frame(lrs=(1e-4,), seeds=(0,), variants=("ppo_clip", "gppo"), rollouts=2, same=True):
    rows = []
    for lr in lrs:
        for v in variants:
            for s in seeds:
                for r in range(rollouts + 1):
                    acc = 0.1 * r + (0 if same else 0.05 * variants.index(v)) + 0.01 * s
                    rows.append({"variant": v, "lr": lr, "seed": s, "rollout": r, "eval/avg_at_n": acc,
                                 "reward": acc, "entropy": 1 - acc})
    return pd.DataFrame(rows)


LONG = "Where the losses differ: the fork tokens (mean ± std over seeds), with a title long enough to be cut"


def boxes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return renderer, fig.bbox


def test_one_learning_rate_fills_a_grid_not_a_narrow_column(tmp_path):
    fig = plots.plot_curves(frame(), ["eval/avg_at_n", "reward", "entropy"], facet="lr", ncols=1, title=LONG,
                            out=tmp_path / "f.png")
    shown = [ax for ax in fig.axes if ax.lines]
    assert len(shown) == 3
    assert len({round(ax.get_position().y0, 3) for ax in shown}) == 1  # one row of three panels, side by side
    assert "(lr 0.0001)" in shown[0].get_title()
    # two learning rates keep one column per learning rate
    two = plots.plot_curves(frame(lrs=(5e-5, 1e-4)), ["eval/avg_at_n", "reward"], facet="lr", ncols=2)
    assert len({round(ax.get_position().x0, 3) for ax in two.axes if ax.lines}) == 2


def test_the_legend_covers_neither_title_nor_panels_and_the_title_is_not_cut():
    fig = plots.plot_curves(frame(), ["eval/avg_at_n", "reward"], facet="lr", ncols=1, title=LONG)
    renderer, figbox = boxes(fig)
    legend = fig.legends[0].get_window_extent(renderer)
    title = fig._suptitle.get_window_extent(renderer)
    assert not legend.overlaps(title)
    for ax in fig.axes:
        if ax.lines:
            assert not legend.overlaps(ax.get_window_extent(renderer)), "legend over a panel"
            assert not title.overlaps(ax.get_tightbbox(renderer)), "title over a panel"
    assert figbox.x0 <= title.x0 and title.x1 <= figbox.x1 and title.y1 <= figbox.y1, "title cut off"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["ppo_clip", "gppo"]


def test_two_identical_curves_are_both_visible():
    fig = plots.plot_curves(frame(same=True), ["eval/avg_at_n"])
    a, b = sorted(fig.axes[0].lines, key=lambda line: line.get_zorder())  # drawn first, drawn over it
    assert list(a.get_ydata()) == list(b.get_ydata())  # the same curve ...
    assert a.get_linestyle() != b.get_linestyle() and a.get_linewidth() > b.get_linewidth()  # ... drawn so both show
    assert b.get_zorder() > a.get_zorder()  # the thinner dashed one on top


def test_rollout_axes_have_integer_ticks():
    fig = plots.plot_curves(frame(rollouts=2), ["eval/avg_at_n"])
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_plot_points_legend_below_and_styles_per_hue():
    df = pd.DataFrame([{"k": k, "mode": m, "seed": 0, "acc": 0.5} for k in ("1", "2") for m in ("a", "b")])
    fig = plots.plot_points(df, "k", ["acc"], hue="mode", title=LONG)
    renderer, _ = boxes(fig)
    assert not fig.legends[0].get_window_extent(renderer).overlaps(fig._suptitle.get_window_extent(renderer))
    a, b = fig.axes[0].lines
    assert a.get_linestyle() != b.get_linestyle()


def test_censored_readouts_say_so():
    assert plots.censored_text([2, 4], censored=8) == "3"
    assert plots.censored_text([4, 8], censored=8) == "≥ 6 (1 of 2 censored at 8)"
    assert plots.censored_text([8], censored=8) == "not reached (censored at 8)"
    assert plots.censored_text([float("nan")], censored=8) == "–"


def test_seed_table_shows_no_std_for_one_seed_and_mean_pm_std_for_several():
    one = pd.DataFrame([{"variant": "a", "seed": 0, "auc": 0.25, "t": 8.0}, {"variant": "b", "seed": 0, "auc": 0.5,
                                                                             "t": 2.0}])
    table = plots.seed_table(one, ["auc", "t"], censored={"t": 8.0})
    assert table.to_dict(orient="index") == {"a": {"auc": "0.25", "t": "not reached (censored at 8)", "seeds": 1},
                                             "b": {"auc": "0.5", "t": "2", "seeds": 1}}
    two = pd.DataFrame([{"variant": "a", "seed": s, "auc": v} for s, v in ((0, 0.2), (1, 0.4))])
    # std over seeds 0.2, 0.4: sqrt(0.02) = 0.1414
    assert plots.seed_table(two, ["auc"]).loc["a", "auc"] == "0.3 ± 0.14"
    assert not any("nan" in str(v).lower() for v in table.to_numpy().ravel())


def test_seed_summary_and_final_table_give_no_made_up_std_for_one_seed():
    last = frame(seeds=(0,)).query("rollout == 2")  # one record per seed, as the SFT notebooks write
    summary = plots.seed_summary(last, "eval/avg_at_n")
    assert summary["std"].isna().all() and (summary["seeds"] == 1).all()
    assert math.isnan(plots.final_table(frame(seeds=(0,))).loc["gppo", "final_std"])
    two = frame(seeds=(0, 1)).query("rollout == 2")  # 0.2 and 0.21: std sqrt(0.5) * 0.01
    assert plots.seed_summary(two, "eval/avg_at_n")["std"].iloc[0] == pytest.approx(math.sqrt(0.5) * 0.01)


def forest_rows():
    """Claims of three kinds of metric, as the report reads them: a large reproduced effect (an area, sd 0.02), a
    reversed one on another scale (a CV, sd 0.2), an inconclusive secondary, and a smoke run's one seed (effect 0,
    no sd)."""
    from klear_lib import claims, report_data

    seeds = range(6)
    big = claims.paired_claim("styles.top1_vs_top7", "Many sources lose to a few (Top-1 beats Top-7)", "p", "auc",
                              {s: 0.6 + 0.01 * s for s in seeds}, {s: 0.5 for s in seeds})
    cv = claims.paired_claim("erc.cv", "ERC stabilises the gradient norm", "p", "cv", {s: 0.1 for s in seeds},
                             {s: 0.6 + 0.1 * s for s in seeds})
    side = claims.paired_claim("side", "A secondary that is long enough to need a second line in the plot", "p",
                               "auc", {s: 0.5 + 0.01 * (s % 2) for s in seeds}, {s: 0.5 for s in seeds},
                               role="secondary")
    one = claims.paired_claim("smoke.one", "One seed", "p", "auc", {0: 0.5}, {0: 0.5})
    rows = [dict(c, notebook=nb, preset=preset, short=report_data.short_claim(c["claim"]))
            for c, nb, preset in ((big, "01_sft", "tiny"), (cv, "04_erc", "tiny"), (one, "06_alpha", "smoke"),
                                  (side, "01_sft", "tiny"))]
    return rows


def test_the_forest_plot_puts_every_claim_on_one_standardised_axis_with_readable_labels_and_a_legend():
    rows = forest_rows()
    fig = plots.forest_figure(rows)
    ax, raw = fig.axes  # one shared x axis; the raw effects as the right-hand labels
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "01  Top-1 beats Top-7" and labels[1] == "04  ERC stabilises the gradient norm"
    assert labels[2] == "06  One seed (smoke)" and "\n" in labels[3] and labels[3].startswith("01  A secondary")
    assert not any(" pri " in t or "styles." in t for t in labels)
    # each effect at effect / paired sd on the one axis: the two metrics' rows compare by eye
    diamonds = [line for line in ax.lines if line.get_marker() == "D"]
    for line, r in zip(diamonds, [rows[0], rows[1], rows[3]]):
        assert line.get_xdata()[0] == pytest.approx(r["effect"] / r["sd"])
    low, high = ax.get_xlim()
    assert low <= min(r["ci_low"] / r["sd"] for r in rows if r["sd"]) and high >= rows[0]["ci_high"] / rows[0]["sd"]
    # the raw effect and interval beside each row, coloured like the row
    raw_labels = [t.get_text() for t in raw.get_yticklabels()]
    assert raw_labels[0] == f"+{rows[0]['effect']:.3g} [+{rows[0]['ci_low']:.3g}, +{rows[0]['ci_high']:.3g}]"
    assert raw_labels[2] == "0 [0, 0]"  # the one-seed row: a zero effect, not a ×1e-12 axis
    assert raw.get_yticklabels()[1].get_color() == plots.VERDICT_COLORS["reversed"]
    # no scientific notation or offset on the shared axis
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks and not any("e" in t or "×" in t for t in ticks) and ax.xaxis.get_offset_text().get_text() == ""
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:3] == ["reproduced", "reversed", "inconclusive"] and "under 80% power (MDE)" in legend


def test_a_forest_plot_of_one_seed_claims_only_is_drawn_on_a_plain_axis():
    rows = [r for r in forest_rows() if r["seeds"] == 1]
    fig = plots.forest_figure(rows)
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_xlim() == pytest.approx((-2.8, 2.8)) and ax.xaxis.get_offset_text().get_text() == ""
    assert any("no sd to scale by" in t.get_text() for t in ax.texts)
    assert plots.forest_figure([{k: v for k, v in r.items() if k != "per_seed"} for r in rows]) is None
