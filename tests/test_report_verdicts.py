"""What the report says beside a verdict (klear_lib.report_verdicts), on hand-built claims: why an inconclusive claim
whose interval excludes 0 is inconclusive (the sign-flip test, a tie, Holm), a reproduced primary whose declared
control came out reversed, the split-half check (split-half z) and its flag, and the A/A pair's label in the claims
table and the forest plot, on the primary's standardised axis."""

import pytest
from test_report import make_run
from test_report_card import claims_part, md_rows

from klear_lib import claims, plots, report, report_data, report_verdicts

SIGN_FLIP_DISAGREES = [1.0, 1.1, 0.9, 1.2, 1.05, -0.1]  # t p 0.007; 4 of 64 sign patterns as far out: p 0.0625
TIED = [1.0, 1.1, 0.9, 1.2, 1.05, 0.0]  # a zero difference: 5 signs to flip, the smallest p 2^-4 = 0.0625
ALL_UP = [1.0, 1.1, 0.9, 1.2, 1.05, 0.95]  # every sign positive: p = max(p_t, 2^-5) = 0.03125
NULL = [0.1, -0.1, 0.05, -0.05, 0.02, 0.0]  # the interval includes 0
UP8 = ALL_UP + [1.02, 0.98]  # 8 seeds: p 2^-7, and 2 x that under Holm: two secondaries can be decided
HALVES_APART = [1.0, 1.01, 0.99, 2.0, 2.01, 1.99]  # the second half twice the first: block z -5.6


def claim(id, diffs, claim_text=None, **kw):
    """A paired claim whose per-seed differences are ``diffs`` (arm a = 0.5 + d, arm b = 0.5)."""
    return claims.paired_claim(id, claim_text or f"the claim {id}", "a paper", "auc",
                               {s: 0.5 + d for s, d in enumerate(diffs)}, {s: 0.5 for s in range(len(diffs))}, **kw)


def row(cid, html):
    part = html[html.index(f'<span class="meta">{cid}</span>'):]
    return part[:part.index("</tr>")]


def test_why_an_interval_that_excludes_0_is_still_inconclusive():
    flip, tied, null = claim("flip", SIGN_FLIP_DISAGREES), claim("tied", TIED), claim("null", NULL)
    main = claim("main", ALL_UP)
    two = claims.finalize([main, claim("s1", ALL_UP, role="secondary"), claim("s2", ALL_UP, role="secondary")])
    for c in (flip, tied, two[1]):
        assert c["verdict"] == "inconclusive" and c["ci_low"] > 0  # the shown interval excludes 0
    assert two[0]["verdict"] == "reproduced" and two[1]["p_value"] == pytest.approx(1 / 32)
    assert report_verdicts.undecided_because(flip) == {
        "short": "sign-flip p = 0.062",
        "text": "the interval excludes 0, but the sign-flip test does not agree (p = 0.062 > 0.05)"}
    # the tie named for what it is: both arms gave the same read-out (0.5 + 0 and 0.5), recorded in tied_at
    assert tied["tied_at"] == {"5": 0.5}
    assert report_verdicts.undecided_because(tied) == {
        "short": "a tie (1 of 6 seeds equal, both arms at 0.5)",
        "text": "the interval excludes 0, but a tie (1 of 6 seeds equal, both arms at 0.5) leaves the sign-flip test "
                "5 signs to flip: its p cannot go below 0.062 (p = 0.062 > 0.05)"}
    old = {k: v for k, v in tied.items() if k != "tied_at"}  # a run written before claims recorded the tied value
    assert report_verdicts.undecided_because(old)["short"] == "a tie (1 of 6 seeds equal in both arms)"
    assert report_verdicts.undecided_because(two[1]) == {
        "short": "Holm p = 0.062",
        "text": "the interval excludes 0 (p = 0.031), but Holm's adjustment over the notebook's secondary claims "
                "gives p = 0.062 > 0.05"}
    # the usual inconclusive (the interval includes 0) and a decided claim: nothing to explain
    assert null["verdict"] == "inconclusive" and null["ci_low"] < 0 < null["ci_high"]
    assert report_verdicts.undecided_because(null) is None and report_verdicts.undecided_because(main) is None
    # below 3 seeds the rule never decides, whatever the interval
    two_seeds = claim("two", [1.0, 1.1])
    assert report_verdicts.undecided_because(two_seeds)["short"] == "2 seeds"
    # two ties at 8 seeds leave 6 signs: the floor 2^-5 is below 0.05, so a disagreeing test is the test, not the ties
    assert report_verdicts.tied_seeds({"a": 0.0, "b": 1e-15, "c": 1.0}) == 2
    eight = claim("eight", SIGN_FLIP_DISAGREES + [0.0, 0.0])
    assert eight["verdict"] == "inconclusive" and eight["ci_low"] > 0 and eight["p_sign"] == pytest.approx(1 / 16)
    assert report_verdicts.undecided_because(eight)["short"] == "sign-flip p = 0.062"


def test_the_verdict_cell_says_why_in_the_page_and_the_card(tmp_path):
    main = claim("main", SIGN_FLIP_DISAGREES, "a beats b at six seeds")
    listed = claims.finalize([main, claim("s1", ALL_UP, role="secondary"), claim("s2", ALL_UP, role="secondary"),
                              claim("null", NULL, role="secondary")])
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": listed})
    html = report.render_report(tmp_path).read_text()
    table = claims_part(html)
    assert "the interval excludes 0, but the sign-flip test does not agree (p = 0.062 &gt; 0.05)" in row("main", table)
    assert "Holm&#x27;s adjustment over the notebook&#x27;s secondary claims gives p = 0.094 &gt; 0.05" in row("s1",
                                                                                                        table)
    assert "excludes 0" not in row("null", table)
    assert report_verdicts.VERDICT_TEXT["inconclusive"] in row("null", table)
    card = html[html.index('class="card"'):html.index("<h2>Claims</h2>")]
    assert "interval excludes 0; sign-flip p = 0.062" in card
    text = report.card_markdown(report_data.gather(tmp_path).card)
    # an inconclusive row shows its MDE; three secondaries at 6 seeds: Holm's first level 0.05 / 3 is below the
    # sign-flip test's floor 2^-5, so none is detectable
    mde = {c["id"]: "∞: none detectable at these seeds" if c.get("undetectable") else report.num(c["mde"])
           for c in listed}
    assert [c["id"] for c in listed if c.get("undetectable")] == ["s1", "s2", "null"]
    assert md_rows(text)[1][2] == f"inconclusive (MDE {mde['main']}; interval excludes 0; sign-flip p = 0.062)"
    one = report.card_markdown(report_data.run_card(report_data.gather(tmp_path).latest["03_rl"]), single=True)
    assert [r[2] for r in md_rows(one)[1:]] == [
        f"inconclusive (MDE {mde['main']}; interval excludes 0; sign-flip p = 0.062)",
        f"inconclusive (MDE {mde['s1']}; interval excludes 0; Holm p = 0.094)",
        f"inconclusive (MDE {mde['s2']}; interval excludes 0; Holm p = 0.094)", f"inconclusive (MDE {mde['null']})"]


def controlled(control_of=True):
    """03_rl's claims: a reproduced primary, its declared control reversed, another secondary reproduced."""
    main = claim("main", UP8, "GPPO learns faster than PPO-clip")
    ctl = claim("ctl", [-d for d in UP8], "GPPO learns faster than PPO-clip at twice the learning rate",
                role="secondary")
    other = claim("other", UP8, role="secondary")
    if control_of:
        ctl["control_of"] = "main"
    return claims.finalize([main, ctl, other])


AGAINST_WORDS = ("the stand-in shows the paper&#x27;s direction on this comparison; its control (GPPO learns faster "
                 "than PPO-clip at twice the learning rate) does not support the paper&#x27;s explanation")


def test_a_reproduced_primary_with_a_reversed_control_is_phrased_and_counted_apart(tmp_path):
    listed = controlled()
    assert [c["verdict"] for c in listed] == ["reproduced", "reversed", "reproduced"]
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": listed})
    make_run(tmp_path, "04_erc", "20250101-120000", summary={"claims": [claim("up", ALL_UP)]})
    page = report_data.gather(tmp_path)
    assert page.claims.against == 1
    rows = {r["id"]: r for r in page.claims.tested}
    assert rows["main"]["controls_against"] == ["GPPO learns faster than PPO-clip at twice the learning rate"]
    assert rows["up"]["controls_against"] == [] and rows["ctl"]["control_of"] == "main"
    html = report.render_report(tmp_path).read_text()
    part = claims_part(html)
    assert AGAINST_WORDS in row("main", part)
    assert "control of main" in row("ctl", part) and "control of" not in row("other", part)
    assert AGAINST_WORDS not in row("up", part)
    assert ("(primary: 2 reproduced, of which 1 with a control against the paper&#x27;s explanation, 0 reversed, "
            "0 inconclusive)") in part
    assert "1 reproduced primary claim has a declared control that came out reversed" in part
    card = html[html.index('class="card"'):html.index("<h2>Claims</h2>")]
    assert "(primary: 2 reproduced, of which 1 with a control against the paper&#x27;s explanation" in card
    text = report.card_markdown(page.card)
    assert md_rows(text)[1][2] == ("reproduced (repeats >99%; a control against the paper's explanation: GPPO learns "
                                   "faster than PPO-clip at twice the learning rate)")
    assert "(primary: 2 reproduced, of which 1 with a control against the paper's explanation, 0 reversed" in text
    # a control that is not reversed but inconclusive: the explanation is left open (test_an_inconclusive_control_...)
    listed[1].update(verdict="inconclusive", p_adjusted=1.0)
    make_run(tmp_path, "03_rl", "20250102-120000", summary={"claims": [listed[0], listed[1]]})
    again = report_data.gather(tmp_path)
    assert again.claims.against == 0 and again.claims.open == 1
    assert "with a control against" not in report.render_report(tmp_path).read_text()
    # a reproduced control, or a primary that is not reproduced: the usual words, nothing counted apart
    listed[1].update(verdict="reproduced", p_adjusted=listed[1]["p_value"], effect=-listed[1]["effect"],
                     ci_low=-listed[1]["ci_high"], ci_high=-listed[1]["ci_low"],
                     per_seed={k: -v for k, v in listed[1]["per_seed"].items()})
    make_run(tmp_path, "03_rl", "20250103-120000", summary={"claims": [listed[0], listed[1]]})
    again = report_data.gather(tmp_path)
    assert again.claims.against == again.claims.open == 0
    assert "of which" not in report.render_report(tmp_path).read_text()


def test_a_run_written_before_claims_carried_control_of_reads_it_from_the_declarations(tmp_path, monkeypatch):
    folder = tmp_path / "params"
    (folder / "03_rl").mkdir(parents=True)
    (folder / "03_rl" / "claims.yaml").write_text(
        "- {id: main, role: primary, claim: c, source: s, metric: m, direction: 1, scope: x}\n"
        "- {id: ctl, role: secondary, claim: c, source: s, metric: m, direction: 1, scope: x, control_of: main}\n"
        "- {id: other, role: secondary, claim: c, source: s, metric: m, direction: 1, scope: x}\n")
    out = tmp_path / "outputs"
    make_run(out, "03_rl", "20250101-120000", summary={"claims": controlled(control_of=False)})
    monkeypatch.setenv("KLEAR_PARAMS_DIR", str(folder))
    page = report_data.gather(out)
    assert page.claims.against == 1 and AGAINST_WORDS in report.render_report(out).read_text()


def test_the_split_half_check_is_a_column_flagged_at_three_and_old_runs_show_a_dash(tmp_path):
    apart, even = claim("apart", HALVES_APART), claim("even", ALL_UP, role="secondary")
    assert apart["verdict"] == "reproduced" and apart["block_z"] < -3 < 3 > abs(even["block_z"])
    old = {k: v for k, v in claim("old", ALL_UP, role="secondary").items() if k != "block_z"}  # before block_z
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": claims.finalize([apart, even, old])})
    html = report.render_report(tmp_path).read_text()
    part = claims_part(html)
    assert "<th>split-half z</th>" in part and "a consistency check inside the run, never the verdict" in part
    assert "halves z" not in html and "replication check" not in html
    assert "|z| ≥ 3: the halves disagree" in row("apart", part) and '<td class="num flag">-5.56' in row("apart", part)
    assert "the halves disagree" not in row("even", part)
    assert f'<td class="num">{report.signed(even["block_z"])}</td>' in row("even", part)
    assert '<td class="num">–</td>' in row("old", part)  # no block_z recorded: the page still renders
    one = report.card_markdown(report_data.run_card(report_data.gather(tmp_path).latest["03_rl"]), single=True)
    table = md_rows(one)
    assert table[0][5] == "split-half z" and table[1][5] == "-5.56 (beyond ±3)" and table[3][5] == "–"
    assert "- Split-half z: a consistency check inside the run, never the verdict and not a replication" in one


def aa_rows():
    """06's primary and its A/A check (one arm under two seed streams), as the report reads them."""
    main = claim("alpha_0.1_vs_0.probe_auc", ALL_UP, "The SFT term helps RL (α = 0.1 beats α = 0)")
    aa = claim("aa_noise_floor.probe_auc", [0.01 * ((s * 5) % 6) - 0.02 for s in range(6)],
               "Two runs of one arm under independent seed streams do not differ (the stand-in's noise floor)",
               role="check", expect="inconclusive")
    return main, aa


def test_the_a_a_pair_is_labelled_for_what_it_is_in_the_table_and_the_forest_plot(tmp_path):
    main, aa = aa_rows()
    assert aa["verdict"] == "pass"
    make_run(tmp_path, "06_alpha", "20250101-120000", summary={"claims": claims.finalize([main, aa])})
    page = report_data.gather(tmp_path)
    (check,) = page.claims.checks
    assert check["aa"] and check["short"] == report_verdicts.AA_LABEL
    html = report.render_report(tmp_path).read_text()
    checks = claims_part(html)[claims_part(html).index("<h3>Checks"):]
    assert "<b>A/A (a second seed stream: noise the primary&#x27;s pairing removes)</b>" in checks
    assert "the A/A row is the stand-in's noise floor" not in html and "pipeline checks, the noise floor" not in html
    assert not report_verdicts.is_aa(main) and not report_verdicts.is_aa(
        claim("ctl", ALL_UP, role="check", expect="reproduced"))  # a positive control is no A/A pair


def test_the_forest_plot_draws_the_a_a_row_on_the_primarys_standardised_axis():
    main, aa = aa_rows()
    rows = [dict(c, notebook="06_sft_loss_alpha", preset="tiny", short=report_data.short_claim(c["claim"]))
            for c in (main, aa)]  # rows as a caller that never annotated them has them
    fig = plots.forest_figure(rows)
    ax = fig.axes[0]
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[1].replace("\n      ", " ") == "06  " + report_verdicts.AA_LABEL
    # one axis, each row at its effect over its own paired sd (Cohen's d_z): the A/A's spread is read in the same
    # units as the primary's
    diamonds = [line for line in ax.lines if line.get_marker() == "D"]
    assert len(diamonds) == 2 and all(line.axes is ax for line in diamonds)
    for line, r in zip(diamonds, rows):
        assert line.get_xdata()[0] == pytest.approx(r["effect"] / r["sd"])
    intervals = [line for line in ax.lines if line.get_marker() in ("None", "") and len(line.get_xdata()) == 2
                 and line.get_ydata()[0] == line.get_ydata()[1]]
    assert [tuple(line.get_xdata()) for line in intervals] == [
        pytest.approx((r["ci_low"] / r["sd"], r["ci_high"] / r["sd"])) for r in rows]
