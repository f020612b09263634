"""The report's verdict cells say exactly what holds (issue 47): the seeds in the paper's direction beside every paired
effect, the chance that a rerun repeats a decided verdict (the MDE for an inconclusive one), the split-half check
named and its power stated, the chance of a verdict by chance among the card's primaries, a control that leaves the
paper's explanation open, a tie named as a tie, a failed check that guards verdicts, claims without spread, and the
paper's claims a notebook declares it does not test."""

from html import escape

import pytest
from test_report import make_run
from test_report_card import claims_part, md_rows
from test_report_verdicts import ALL_UP, UP8, claim, row

from klear_lib import claims, report, report_data, report_verdicts


def test_every_paired_effect_says_how_many_seeds_went_the_papers_way(tmp_path):
    """k of n seeds with the paper's sign (``direction``), tied seeds apart; a reversed claim counts the seeds that
    went the paper's way too (few); a plain check has no count."""
    mixed = claim("mixed", [1.0, 1.1, -0.2, 1.2, 0.0, 0.95])  # 4 up, 1 down, 1 tied
    down = claim("down", [-d for d in ALL_UP], role="secondary")  # every seed against the paper
    paper_down = claim("paper_down", [-d for d in ALL_UP], role="secondary", direction=-1)  # the paper says a < b
    plain = claims.check("ok", "a check", "s", "m", True, 0.0, criterion="x")
    assert report_verdicts.sign_count(mixed) == {"with": 4, "against": 1, "tied": 1, "n": 6}
    assert report_verdicts.sign_count(down) == {"with": 0, "against": 6, "tied": 0, "n": 6}
    assert report_verdicts.sign_count(paper_down)["with"] == 6 and report_verdicts.sign_count(plain) is None
    text = report_verdicts.sign_text
    assert text(report_verdicts.sign_count(mixed)) == "4 of 6 seeds in the paper's direction (1 tied)"
    assert text({"with": 1, "against": 0, "tied": 0, "n": 1}) == "1 of 1 seed in the paper's direction"
    listed = claims.finalize([mixed, down, paper_down, plain])
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": listed})
    part = claims_part(report.render_report(tmp_path).read_text())
    assert "4 of 6 seeds in the paper&#x27;s direction (1 tied)" in row("mixed", part)
    assert "0 of 6 seeds in the paper&#x27;s direction" in row("down", part)
    assert "6 of 6 seeds in the paper&#x27;s direction" in row("paper_down", part)
    assert "seeds in the paper" not in row("ok", part)
    text = report.card_markdown(report_data.gather(tmp_path).card)
    assert md_rows(text)[1][4] == "4 of 6 seeds in the paper's direction (1 tied)"


def test_a_secondary_repeats_at_bonferronis_level_and_the_page_says_how_the_chance_is_made(tmp_path):
    """Two secondaries at 8 seeds: each is held to 0.05 / 2 for its repeat chance (Holm decides every claim
    Bonferroni does: a lower bound), the primary to 0.05."""
    spread = [0.2, 1.5, 0.6, 1.2, 0.1, 1.8, 0.9, 1.1]  # every seed up, about 1.5 paired sds
    listed = claims.finalize([claim("main", spread), claim("s1", spread, role="secondary"),
                              claim("s2", spread, role="secondary")])
    assert [c["verdict"] for c in listed] == ["reproduced"] * 3
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": listed})
    rows = {r["id"]: r for r in report_data.gather(tmp_path).claims.tested}
    delta = rows["main"]["effect"] / rows["main"]["sd"]
    assert rows["main"]["repeat_level"] == 0.05 and rows["s1"]["repeat_level"] == 0.025
    assert rows["main"]["repeat"] == pytest.approx(claims.repeat_probability(delta, 8))
    assert rows["s1"]["repeat"] == pytest.approx(claims.repeat_probability(delta, 8, alpha=0.025))
    assert rows["s1"]["repeat"] < rows["main"]["repeat"]
    part = claims_part(report.render_report(tmp_path).read_text())
    assert "Bonferroni's level 0.05 / m over the notebook's m secondaries" in part
    assert "a decided effect tends to be measured larger than it is" in part


def test_the_split_half_check_is_named_for_what_it_is_and_its_power_stated(tmp_path):
    """Not a replication check: a consistency check inside the run, whose power the page states for the seed counts
    it shows (about 7% at 14 seeds for a true 1-sd shift between the halves), computed."""
    fourteen = claim("main", [1.0 + 0.01 * ((s * 7) % 14) for s in range(14)])
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": [fourteen]})
    make_run(tmp_path, "04_erc", "20250101-120000", summary={"claims": [claim("up", ALL_UP)]})
    html = report.render_report(tmp_path).read_text()
    part = claims_part(html)
    power14, power6 = claims.split_half_power(14), claims.split_half_power(6)
    assert 0.05 < power14 < 0.09
    assert (f"the check flags a true shift of one paired sd between the halves {escape(report.percent(power14))} of "
            f"the time at 14 seeds, {escape(report.percent(power6))} of the time at 6 seeds") in part
    assert "split-half z" in html and "halves z" not in html and "replication check" not in html


def test_the_card_states_the_chance_of_a_verdict_by_chance_among_its_primaries(tmp_path):
    for i in range(6):
        make_run(tmp_path, f"0{i + 1}_nb", "20250101-120000", summary={"claims": [claim(f"p{i}", ALL_UP)]})
    card = report_data.gather(tmp_path).card
    assert card.familywise == {"k": 6, "alpha": 0.05, "rate": pytest.approx(1 - 0.95 ** 6)}
    html = report.render_report(tmp_path).read_text()
    assert (f"with 6 primary claims each held to 5%, at least one would come out reproduced or reversed "
            f"{report.percent(1 - 0.95 ** 6)} of the time if none had an effect") in html
    assert "for independent claims under the null" in html and report.percent(1 - 0.95 ** 6) == "~26%"
    one = report_data.run_card(report_data.gather(tmp_path).latest["01_nb"])
    assert one.familywise is None and "By chance" not in report.card_markdown(one, single=True)


def controlled_open(control_diffs):
    """03_rl: a reproduced primary (UP8, +1.0) and its declared control with the given differences."""
    main = claim("main", UP8, "GPPO learns faster than PPO-clip")
    ctl = claim("ctl", control_diffs, "GPPO learns faster than PPO-clip at twice the learning rate", role="secondary")
    ctl["control_of"] = "main"
    return claims.finalize([main, ctl])


def test_an_inconclusive_control_leaves_the_papers_explanation_open(tmp_path):
    """A reproduced primary whose control came out inconclusive: the direction holds, and the control (its id,
    effect, interval and verdict, and whether its interval holds 0 and the primary's effect) leaves the explanation
    open; counted apart in the tally. A reproduced control leaves nothing to say."""
    wide = [1.5, -0.9, 1.2, -0.3, 0.8, -1.1, 0.6, 0.4]  # mean 0.275: a wide interval that holds 0
    listed = controlled_open(wide)
    main, ctl = listed
    assert main["verdict"] == "reproduced" and ctl["verdict"] == "inconclusive"
    holds_primary = ctl["ci_low"] <= main["effect"] <= ctl["ci_high"]
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": listed})
    page = report_data.gather(tmp_path)
    assert page.claims.open == 1 and page.claims.against == 0
    words = (f"the direction holds; its control (ctl: effect {report.signed(ctl['effect'])} "
             f"[{report.signed(ctl['ci_low'])}, {report.signed(ctl['ci_high'])}], verdict inconclusive; its interval "
             + (f"holds 0 and the primary's {report.signed(main['effect'])}" if holds_primary else
                f"holds 0, not the primary's {report.signed(main['effect'])}")
             + ") leaves the paper's explanation open")
    assert page.claims.tested[0]["verdict_words"] == words
    html = report.render_report(tmp_path).read_text()
    assert escape(words) in row("main", claims_part(html))
    assert "(primary: 1 reproduced, of which 1 with its explanation left open by a control, 0 reversed" in html
    assert "1 reproduced primary claim has a declared control that came out inconclusive" in html
    text = report.card_markdown(page.card)
    assert "the direction holds; the explanation is left open by its control ctl" in md_rows(text)[1][2]
    # a control whose interval sits below the primary's effect, holding 0: the explanation open, and it says so
    low = controlled_open([0.1, -0.2, 0.15, -0.05, 0.0, 0.2, -0.1, 0.05])
    assert low[1]["verdict"] == "inconclusive" and low[1]["ci_high"] < low[0]["effect"]
    make_run(tmp_path, "03_rl", "20250102-120000", summary={"claims": low})
    row_ = report_data.gather(tmp_path).claims.tested[0]
    assert f"holds 0, not the primary's {report.signed(low[0]['effect'])}) leaves the paper's explanation open" in \
        row_["verdict_words"]
    # a reproduced control: the paper's words
    make_run(tmp_path, "03_rl", "20250103-120000", summary={"claims": controlled_open(UP8)})
    again = report_data.gather(tmp_path)
    assert again.claims.open == 0 and again.claims.tested[0]["verdict_words"] == report_verdicts.VERDICT_TEXT[
        "reproduced"]


def test_a_tie_is_named_as_a_tie_not_blamed_on_holm_or_the_rule(tmp_path):
    """Every seed tied (both arms at the ceiling): "a tie (3 of 3 seeds equal, both arms at 1.0)"; a secondary
    whose one tie puts the sign-flip floor above what Holm needs: the tie named, with Holm's number."""
    ceiling = claims.paired_claim("ceiling", "a beats b", "T", "m", dict.fromkeys(range(3), 1.0),
                                  dict.fromkeys(range(3), 1.0))
    assert ceiling["verdict"] == "inconclusive" and ceiling["tied_at"] == {"0": 1.0, "1": 1.0, "2": 1.0}
    why = report_verdicts.undecided_because(ceiling)
    assert why["short"] == "a tie (3 of 3 seeds equal, both arms at 1.0)"
    assert why["text"].endswith("the two arms gave the same read-out on every seed, so this read-out cannot tell "
                                "them apart")
    # 7 seeds, one tied (both arms 0.5): the sign-flip floor is 2^-5 = 0.031; beside a null secondary Holm doubles
    # it, 0.062 > 0.05: not passable because of the tie (without it, 2 · 2^-6 = 0.031 would pass)
    tied7 = claim("tied7", UP8[:6] + [0.0], role="secondary")
    other = claim("other", [0.1, -0.1, 0.05, -0.05, 0.02, -0.03, 0.03], role="secondary")
    listed = claims.finalize([claim("main", UP8[:7]), tied7, other])
    t = listed[1]
    assert t["verdict"] == "inconclusive" and t["p_sign"] == pytest.approx(1 / 32) and t["ci_low"] > 0
    why = report_verdicts.undecided_because(t)
    assert why["short"] == "a tie (1 of 7 seeds equal, both arms at 0.5)"
    assert why["text"] == ("the interval excludes 0, but a tie (1 of 7 seeds equal, both arms at 0.5) leaves the "
                           "sign-flip test 6 signs to flip: its p cannot go below 0.031, and Holm's adjustment over "
                           f"the notebook's secondary claims gives p = {t['p_adjusted']:.2g} > 0.05")
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": [ceiling]})
    text = report.card_markdown(report_data.gather(tmp_path).card)
    assert md_rows(text)[1][2] == "inconclusive (MDE –: no spread; a tie (3 of 3 seeds equal, both arms at 1.0))"


def test_claims_without_spread_say_so_and_one_seed_is_one_seed(tmp_path):
    """Every seed the same difference at 4 seeds: inconclusive, and the cell says why (no spread, the sign-flip p's
    floor); a claim of one seed says "1 seed", never "1 seeds"."""
    same = claims.paired_claim("same", "a beats b", "T", "m", dict.fromkeys(range(4), 0.75),
                               dict.fromkeys(range(4), 0.5))
    why = report_verdicts.undecided_because(same)
    assert why["short"] == "every seed +0.25"
    assert "cannot go below 2^-3 = 0.12 at 4 seeds (p = 0.12 > 0.05)" in why["text"]
    assert why["text"].startswith("every seed gave the same difference (+0.25): with no spread the t-test has no noise")
    one = claims.paired_claim("one", "a beats b", "T", "m", {0: 0.75}, {0: 0.5})
    assert report_verdicts.undecided_because(one)["short"] == "1 seed"
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": [one]})
    html = report.render_report(tmp_path).read_text()
    text = report.card_markdown(report_data.gather(tmp_path).card)
    assert "1 seeds" not in html and "1 seeds" not in text and "interval excludes 0; 1 seed" in text
    assert md_rows(text)[1][4] == "1 of 1 seed in the paper's direction"


GUARDS_YAML = (
    "- {id: main, role: primary, claim: the claim main, source: s, metric: m, direction: 1, scope: x}\n"
    "- {id: side, role: secondary, claim: the claim side, source: s, metric: m, direction: 1, scope: x}\n"
    "- {id: free, role: secondary, claim: the claim free, source: s, metric: m, direction: 1, scope: x}\n"
    "- {id: learned, role: check, claim: every base learned, source: s, metric: m, direction: 1, scope: x,\n"
    "   guards: [main, side]}\n")


def guarded_run(folder, *, recorded=True, passed=False):
    (folder / "02_sft").mkdir(parents=True, exist_ok=True)
    (folder / "02_sft" / "claims.yaml").write_text(GUARDS_YAML)
    declared = claims.load_declared(folder / "02_sft" / "claims.yaml")
    a, b = {s: 0.5 + d for s, d in enumerate(UP8)}, dict.fromkeys(range(8), 0.5)
    got = [claims.declared_claim(declared, cid, a, b) for cid in ("main", "side", "free")]
    check = claims.declared_check(declared, "learned", passed, 0.41, criterion="every base >= 0.5")
    if not recorded:
        del check["guards"]
    return claims.finalize(got + [check], declared if recorded else None)


@pytest.mark.parametrize("recorded", [True, False])
def test_a_failed_check_marks_every_verdict_it_guards(tmp_path, monkeypatch, recorded):
    """A check that failed, declared with ``guards``: each guarded claim's cell says the check failed, its value and
    criterion, and that the verdict is not to be trusted; a claim it does not guard says nothing of it. A run
    written before checks carried ``guards`` reads them from the declarations; a check that passed marks nothing."""
    folder, out = tmp_path / "params", tmp_path / "outputs"
    make_run(out, "02_sft", "20250101-120000", summary={"claims": guarded_run(folder, recorded=recorded)})
    monkeypatch.setenv("KLEAR_PARAMS_DIR", str(folder))
    page = report_data.gather(out)
    rows = {r["id"]: r for r in page.claims.tested}
    warning = ("its check learned failed (0.41 against every base >= 0.5): this verdict is not to be trusted")
    assert rows["main"]["guard_failures"] == rows["side"]["guard_failures"] == [warning]
    assert rows["free"]["guard_failures"] == [] and len(page.claims.guarded) == 2
    html = report.render_report(out).read_text()
    part = claims_part(html)
    assert escape(warning) in row("main", part) and escape(warning) in row("side", part)
    assert "not to be trusted" not in row("free", part)
    assert "2 verdicts are guarded by a check that failed" in part and "guards main, side" in row("learned", part)
    card = html[html.index('class="card"'):html.index("<h2>Claims</h2>")]
    assert escape(warning) in card
    assert warning in md_rows(report.card_markdown(page.card))[1][2]
    make_run(out, "02_sft", "20250102-120000", summary={"claims": guarded_run(folder, recorded=recorded, passed=True)})
    assert "not to be trusted" not in report.render_report(out).read_text()


def test_the_papers_claims_a_notebook_does_not_test_are_listed_apart_and_not_counted(tmp_path, monkeypatch):
    """``params/<notebook>/not_tested.yaml``: each entry on the page (notebook, claim, source, reason) and in the
    Markdown card, under "Declared, not tested", beside the claims not made at this preset and the retired ones;
    never counted. A malformed file is named in a warning and the page still renders."""
    folder, out = tmp_path / "params", tmp_path / "outputs"
    (folder / "01_sft").mkdir(parents=True)
    (folder / "01_sft" / "not_tested.yaml").write_text(
        "- id: code.top2\n  claim: For code, Top-2 beats Top-1 <sources>\n  source: Klear-Reasoner §3\n"
        "  reason: the stand-in has no code sources\n")
    make_run(out, "01_sft", "20250101-120000", summary={"claims": [claim("main", ALL_UP)]})
    latest = report.latest_runs(report.collect_runs(out))
    assert report.not_tested_rows(latest, folder) == [{
        "notebook": "01_sft", "id": "code.top2", "claim": "For code, Top-2 beats Top-1 <sources>",
        "source": "Klear-Reasoner §3", "reason": "the stand-in has no code sources"}]
    monkeypatch.setenv("KLEAR_PARAMS_DIR", str(folder))
    page = report_data.gather(out)
    assert len(page.claims.not_tested) == 1 and len(page.claims.tested) == 1
    assert page.claims.counts == {"reproduced": 1, "reversed": 0, "inconclusive": 0}
    html = report.render_report(out).read_text()
    part = html[html.index("<h3>Declared, not tested"):html.index("<h2>Overview</h2>")]
    assert "For code, Top-2 beats Top-1 &lt;sources&gt;" in part and "Klear-Reasoner §3" in part
    assert "the stand-in has no code sources" in part and "code.top2" in part
    assert "1 claim tested against the papers (1 primary" in html and "1 declared, not tested" in html
    text = report.card_markdown(page.card)
    assert "## Declared, not tested" in text
    assert ["01", "For code, Top-2 beats Top-1 <sources> (code.top2)", "Klear-Reasoner §3",
            "the stand-in has no code sources"] in md_rows(text[text.index("## Declared, not tested"):])
    (folder / "01_sft" / "not_tested.yaml").write_text("- {id: a, claim: c, source: s}\n")
    with pytest.warns(UserWarning, match=r"not_tested.yaml entry 0 \(a\): missing key\(s\) \['reason'\]"):
        html = report.render_report(out).read_text()
    assert "Declared, not tested" not in html


def test_an_old_run_of_02_reads_its_bases_check_guards_from_the_checkout(tmp_path):
    """A run of 02 written before checks carried ``guards``: the checkout's claims.yaml says bases_learned guards
    the primary, so a failed bases check marks it."""
    nb = "02_sft_accuracy_filtering"
    primary = claims.paired_claim("hard.mixed_vs_only_true", "Mixed beats Only-True on hard problems", "s", "m",
                                  {s: 0.5 + d for s, d in enumerate(UP8)}, dict.fromkeys(range(8), 0.5))
    check = claims.check("bases_learned", "every base learned", "s", "m", False, 0.61, criterion="every base >= 0.8")
    assert "guards" not in check
    make_run(tmp_path, nb, "20250101-120000", summary={"claims": [primary, check]})
    row_ = report_data.gather(tmp_path).claims.tested[0]
    assert row_["guard_failures"] == ["its check bases_learned failed (0.61 against every base >= 0.8): this verdict "
                                      "is not to be trusted"]
