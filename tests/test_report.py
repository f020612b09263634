"""klear_lib.report: run statuses read from synthetic run directories, and the self-contained HTML page."""

import base64
import json
import math
import os
import re
from html import escape as html_escape

import nbformat
import pytest
from matplotlib.figure import Figure

from klear_lib import report, runs

ANSI_EVALUE = "\x1b[0;31m'erc/ratio_p95'\x1b[0m"  # how IPython colours a KeyError's value


def tiny_png(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1], [1, 0])
    fig.savefig(path, format="png", dpi=20)
    return path


def executed_notebook(path, error=None):
    """A notebook as papermill leaves it: a parameters cell, a cell that ran, and (if `error`) a failing cell."""
    nb = nbformat.v4.new_notebook()
    ok = nbformat.v4.new_code_cell("x = 1", execution_count=1)
    ok.outputs = [nbformat.v4.new_output("stream", name="stdout", text="fine\n")]
    nb.cells = [nbformat.v4.new_markdown_cell("# title"), nbformat.v4.new_code_cell("seed = 0", execution_count=None),
                ok]
    if error:
        ename, evalue = error
        bad = nbformat.v4.new_code_cell("summary['erc/ratio_p95']", execution_count=3)
        bad.outputs = [nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=["..."])]
        nb.cells += [bad, nbformat.v4.new_code_cell("later()", execution_count=None)]
    nbformat.write(nb, str(path))


def make_run(root, notebook, stamp, *, params=None, config=None, summary=None, figure=True, error=None,
             preset="tiny"):
    """A run directory as `klear run` leaves it; summary=None leaves summary.json out (an interrupted run)."""
    d = runs.create_run_dir(root, notebook, stamp=stamp)
    record = {"notebook": notebook, "preset": preset, "params": params or {}, "run_dir": str(d)}
    (d / runs.PARAMS_FILE).write_text(runs.to_json_text(record, indent=2))
    runs.write_run_metadata(d, config or {"seed": 0, "lr": 1e-3})
    with runs.MetricsWriter(d / runs.METRICS_FILE) as log:
        log.write({"step": 1, "loss": 0.5})
    executed_notebook(d / runs.NOTEBOOK_FILE, error)
    if figure:
        tiny_png(d / "figures" / "curve.png")
    if summary is not None:
        runs.write_summary(d, summary)
    return d


BESIDE = {
    "caption": "Table 3 <GPPO> & co",
    "columns": ["variant", "paper", "ours"],
    "rows": [["ppo_clip", 0.512, 0.3], ["gppo", 0.55, None]],
    "note": "ours: tiny preset, 3 seeds",
}


@pytest.fixture
def outputs(tmp_path):
    """Four notebooks: 01 with two ok runs, 02 failed, 03 interrupted, 00_report (the report's own runs)."""
    root = tmp_path / "outputs"
    make_run(root, "01_sft", "20250101-090000", summary={"score": 0.1}, params={"seeds": "0"})
    make_run(root, "01_sft", "20250102-090000", params={"seeds": "0,1,2"},
             summary={"score": 0.123456, "missing": None, "per_seed": {"s0": 12345.678}, "n": 2000,
                      "beside_paper": BESIDE, "figures": ["figures/curve.png"]})
    make_run(root, "02_rl", "20250102-100000", summary=None, error=("KeyError", ANSI_EVALUE))
    make_run(root, "03_erc", "20250102-110000", summary=None)
    make_run(root, "00_report", "20250102-120000", summary={"report": "made"})
    (root / "README.md").write_text("not a run")
    return root


def by_nb(runs_list):
    return {(r.notebook, r.stamp): r for r in runs_list}


def test_statuses_errors_and_missing_files(outputs):
    found = report.collect_runs(outputs)
    assert [(r.notebook, r.stamp) for r in found] == [
        ("00_report", "20250102-120000"), ("01_sft", "20250101-090000"), ("01_sft", "20250102-090000"),
        ("02_rl", "20250102-100000"), ("03_erc", "20250102-110000")]
    got = by_nb(found)
    ok = got["01_sft", "20250102-090000"]
    assert (ok.status, ok.error, ok.missing, ok.preset) == ("ran", None, [], "tiny")
    assert ok.figures == [outputs / "01_sft" / "20250102-090000" / "figures" / "curve.png"]
    assert ok.config == {"lr": 1e-3, "seed": 0} and ok.git["commit"] and "python" in ok.versions
    failed = got["02_rl", "20250102-100000"]
    assert failed.status == "failed"
    assert failed.error == "KeyError: 'erc/ratio_p95' (cell [3])"  # ANSI colour stripped, execution count
    assert failed.missing == ["summary.json"]
    assert failed.figures == [outputs / "02_rl" / "20250102-100000" / "figures" / "curve.png"]  # globbed
    interrupted = got["03_erc", "20250102-110000"]
    assert (interrupted.status, interrupted.error, interrupted.missing) == ("incomplete", None, ["summary.json"])


def test_error_in_a_raises_exception_cell_does_not_fail_the_run(tmp_path):
    d = make_run(tmp_path, "01_sft", "20250101-090000", summary={"x": 1}, error=("ValueError", "on purpose"))
    nb = nbformat.read(str(d / runs.NOTEBOOK_FILE), as_version=4)
    nb.cells[3].metadata["tags"] = ["raises-exception"]
    nbformat.write(nb, str(d / runs.NOTEBOOK_FILE))
    assert report.collect_runs(tmp_path)[0].status == "ran"


def test_long_error_value_is_shortened(tmp_path):
    make_run(tmp_path, "02_rl", "20250101-090000", error=("RuntimeError", "x" * 2000 + "\nsecond line"))
    error = report.collect_runs(tmp_path)[0].error
    assert error.startswith("RuntimeError: xxx") and error.endswith("… (cell [3])")
    assert len(error) <= report.MAX_ERROR_CHARS


def test_truncated_and_missing_json_make_a_run_incomplete_not_a_crash(tmp_path):
    d = make_run(tmp_path, "01_sft", "20250101-090000", summary={"score": 0.5})
    text = (d / "summary.json").read_text()
    (d / "summary.json").write_text(text[: len(text) // 2])
    (d / "params.json").write_text('{"preset": "ti')
    (d / "versions.json").unlink()
    (run,) = report.collect_runs(tmp_path)
    assert run.status == "incomplete"
    assert run.missing == ["versions.json", "summary.json", "params.json"]
    assert (run.summary, run.versions, run.preset) == ({}, {}, None)
    out = report.render_report(tmp_path)  # and the page still renders
    assert "summary.json" in out.read_text()


def test_latest_runs_picks_the_newest_stamp(tmp_path):
    for stamp in ("20250101-120000", "20250101-120000-2", "20250101-120000-10", "20241231-235959"):
        make_run(tmp_path, "01_sft", stamp, summary={}, figure=False)
    make_run(tmp_path, "02_rl", "20240101-000000", summary={}, figure=False)
    found = report.collect_runs(tmp_path)
    assert [r.stamp for r in found if r.notebook == "01_sft"] == [
        "20241231-235959", "20250101-120000", "20250101-120000-2", "20250101-120000-10"]
    latest = report.latest_runs(reversed(found))
    assert list(latest) == ["01_sft", "02_rl"]
    assert latest["01_sft"].stamp == "20250101-120000-10"


@pytest.mark.parametrize(
    "params, config, seeds",
    [
        ({"seeds": "0,1,2"}, {}, [0, 1, 2]),
        ({}, {"seeds": [3, 4]}, [3, 4]),  # a list in the resolved config
        ({"seed": 5}, {"seeds": [9]}, [5]),  # the notebook parameters win
        ({}, {"seed": 7, "lr": 0.1}, [7]),
        ({"lr": 0.1}, {"lr": 0.1}, []),
    ],
)
def test_seeds_from_params_or_config(tmp_path, params, config, seeds):
    make_run(tmp_path, "01_sft", "20250101-090000", params=params, config=config, summary={}, figure=False)
    assert report.collect_runs(tmp_path)[0].seeds == seeds


def test_beside_paper_round_trip_and_row_length_error():
    df = report.beside_paper({"beside_paper": BESIDE})
    assert list(df.columns) == BESIDE["columns"]
    assert df.iloc[0].tolist() == ["ppo_clip", 0.512, 0.3]
    assert df.iloc[1, :2].tolist() == ["gppo", 0.55] and math.isnan(df.iloc[1, 2])  # null in a number column
    assert df.attrs == {"caption": BESIDE["caption"], "note": BESIDE["note"]}
    assert report.beside_paper({"score": 1.0}) is None
    bad = dict(BESIDE, rows=[["ppo_clip", 0.5, 0.3], ["gppo", 0.55]])
    with pytest.raises(ValueError, match=r"beside_paper\.rows\[1\] has 2 values.*has 3"):
        report.beside_paper({"beside_paper": bad})


def test_report_page(outputs):
    out = report.render_report(outputs, intro_html="<p id='intro'>hello</p>")
    assert out == outputs / "report.html"
    page = out.read_text(encoding="utf-8")
    assert "<p id='intro'>hello</p>" in page
    # the beside-paper table, escaped, caption above the table body and the note below it
    assert "Table 3 &lt;GPPO&gt; &amp; co" in page and "<GPPO>" not in page
    assert page.index("Table 3 &lt;GPPO&gt;") < page.index("ppo_clip") < page.index("ours: tiny preset")
    # numbers to 4 significant digits, null as a dash, ints as they are, nested keys flattened with "/"
    assert ">0.1235<" in page and ">1.235e+04<" in page and ">2000<" in page and ">0.512<" in page
    assert re.search(r"<td>missing</td><td>–</td>", page) and "per_seed/s0" in page
    # the figure, embedded byte for byte
    png = (outputs / "01_sft" / "20250102-090000" / "figures" / "curve.png").read_bytes()
    uris = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert png in [base64.b64decode(u) for u in uris]
    # the failed run's error, escaped, and the interrupted run's missing file
    assert "KeyError: &#x27;erc/ratio_p95&#x27; (cell [3])" in page
    assert 'class="row-failed"' in page and "missing summary.json" in page
    # sections in notebook order, the older run listed, the report's own runs nowhere
    assert page.index('id="01_sft"') < page.index('id="02_rl"') < page.index('id="03_erc"')
    assert "20250101-090000" in page[page.index("Older runs"):]
    assert "00_report" not in page and "made" not in page
    assert "http://" not in page and "https://" not in page and "<script" not in page
    # written atomically: no temp file left beside it
    assert sorted(p.name for p in outputs.iterdir() if p.is_file()) == ["README.md", "report.html"]


def test_reproduce_log_rows(outputs):
    ok_dir = outputs / "01_sft" / "20250102-090000"
    log = {
        "preset": "tiny", "started": "2025-01-03T08:00:00+0000", "total_s": 99.0,
        "rows": [
            {"notebook": "01_sft", "status": "ok", "seconds": 12.5, "run_dir": str(ok_dir), "message": ""},
            {"notebook": "03_erc", "status": "FAILED", "seconds": 3.0,
             "run_dir": str(outputs / "03_erc" / "20250102-110000"), "message": "kernel died"},
            {"notebook": "05_code", "status": "ERROR", "seconds": 0.1, "run_dir": None,
             "message": "no preset 'tiny' for 05_code <x>"},
        ],
    }
    (outputs / "reproduce.json").write_text(json.dumps(log))
    assert report.read_reproduce_log(outputs) == log
    got = by_nb(report.collect_runs(outputs))
    assert got["01_sft", "20250102-090000"].status == "ran"
    assert (got["03_erc", "20250102-110000"].status, got["03_erc", "20250102-110000"].error) == (
        "failed", "kernel died")  # the notebook holds no error output, but reproduce.json says it failed
    page = report.render_report(outputs).read_text(encoding="utf-8")
    assert 'id="05_code"' in page and "no preset &#x27;tiny&#x27; for 05_code &lt;x&gt;" in page
    row_05 = re.search(r'<tr class="row-(\w+)"><td><a href="#05_code">', page)
    assert row_05 and row_05[1] == "failed"
    assert '<td class="num">12.5</td>' in page  # the seconds of 01_sft's latest run
    assert 'alt="wall time per notebook"' in page


def test_no_reproduce_log_and_unreadable_one(outputs):
    assert report.read_reproduce_log(outputs) is None
    (outputs / "reproduce.json").write_text('{"rows": [')
    with pytest.warns(UserWarning, match="reproduce.json"):
        assert report.read_reproduce_log(outputs) is None


def test_failed_write_leaves_the_old_report_and_no_temp_file(outputs, monkeypatch):
    out = report.render_report(outputs, outputs / "sub" / "r.html")
    before = out.read_text(encoding="utf-8")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        report.render_report(outputs, out, title="second")
    assert out.read_text(encoding="utf-8") == before
    assert [p.name for p in out.parent.iterdir()] == ["r.html"]


def test_section_of_a_failed_run_shows_the_error_in_a_box(outputs):
    got = by_nb(report.collect_runs(outputs))
    html = report.run_section_html(got["02_rl", "20250102-100000"])
    assert html.startswith('<section id="02_rl">') and html.endswith("</section>")
    assert '<div class="error">KeyError: &#x27;erc/ratio_p95&#x27; (cell [3])</div>' in html
    assert '<span class="badge failed">failed</span>' in html


def test_the_report_opens_with_every_claim_and_its_verdict_and_marks_smoke_runs(tmp_path):
    from klear_lib import claims

    seeds = range(6)
    up = claims.paired_claim("gppo_vs_dapo", "GPPO beats DAPO", "Fig. 3", "auc", {s: 0.6 + 0.01 * s for s in seeds},
                             {s: 0.5 for s in seeds}, scope="a stand-in of <four> facts")
    down = claims.paired_claim("erc", "ERC <stabilises>", "ERC paper", "cv", {s: 0.1 for s in seeds},
                               {s: 0.3 + 0.01 * s for s in seeds}, direction=1)
    side = claims.paired_claim("side", "a secondary", "Fig. 3", "auc", {s: 0.5 + 0.01 * (s % 2) for s in seeds},
                               {s: 0.5 for s in seeds}, role="secondary")
    ctl = claims.check("control", "the control holds", "reference §1", "spread", True, 0.0, criterion="spread 0")
    aa = claims.paired_claim("aa", "A/A", "this project", "auc", {s: 0.5 + 0.01 * s for s in seeds},
                             {s: 0.5 + 0.01 * ((s * 5) % 6) for s in seeds}, role="check", expect="inconclusive")
    assert up["verdict"] == "reproduced" and down["verdict"] == "reversed" and aa["verdict"] == "pass"
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": claims.finalize([up, side, ctl]),
                                                            "start_per_seed": True})
    make_run(tmp_path, "04_erc", "20250101-120000", summary={"claims": [down, aa]}, preset="smoke")
    make_run(tmp_path, "05_code", "20250101-120000", summary={"claims": [{**up, "verdict": "reversed"}]})  # invalid
    with pytest.warns(UserWarning, match="05_code.*does not follow from"):
        html = report.render_report(tmp_path).read_text()
    assert html.index("<h2>Claims</h2>") < html.index("<h2>Overview</h2>")
    claims_part = html[html.index("<h2>Claims</h2>"):html.index("<h2>Overview</h2>")]
    # the tally counts the primary and secondary claims only; checks are apart
    assert "3 claims tested against the papers (2 primary" in claims_part
    assert "1 reproduced, 1 reversed, 1 inconclusive (primary: 1 reproduced, 1 reversed, 0 inconclusive)" in claims_part
    assert "2 checks" in claims_part and "<h3>Checks (pass/fail, not counted)</h3>" in claims_part
    # what an interval covers, from the runs: 03_rl's seeds trained their own starts, 04_erc's did not
    assert "In 03_rl each seed trains its own SFT start" in claims_part and "04_erc each seed" not in claims_part
    checks_part = claims_part[claims_part.index("<h3>Checks"):]
    assert "the control holds" in checks_part and "A/A" in checks_part and "GPPO beats DAPO" not in checks_part
    # primaries first, every verdict phrased for the stand-in, the scope column, escaped text
    table = claims_part[claims_part.index("<table>"):claims_part.index("<h3>Checks")]
    assert table.index("GPPO beats DAPO") < table.index("ERC &lt;stabilises&gt;") < table.index("a secondary")
    assert "the stand-in shows the opposite direction" in table and "the stand-in shows the paper&#x27;s" in table
    assert "a stand-in of &lt;four&gt; facts" in table and "(Holm)" in table
    assert '<img src="data:image/png;base64,' in claims_part and "forest plot" in claims_part
    assert "04_erc</a> (smoke)" in claims_part and "verdicts mean nothing" in claims_part
    assert '<span class="badge smoke">smoke</span>' in html
    assert '<span class="badge ran">ran</span>' in html and '<span class="badge ok">' not in html


def test_a_decided_verdict_shows_its_repeat_chance_an_inconclusive_one_its_mde_and_the_seeds_say_whose_starts(
        tmp_path):
    from klear_lib import claims

    seeds = range(6)
    # paired differences 0.02 x5 and 0.06: mean 0.16 / 6 = 0.02667, sd sqrt((5 · 0.00667² + 0.03333²) / 5) = 0.01633,
    # 1.63 sd: above the t-test's 1.05 sd at 6 seeds (reproduced: every sign positive, p 0.031) and below the rule's
    # MDE, 1.80 sd, so a rerun repeats it with a chance under 80%
    near = claims.paired_claim("near", "a claim at the edge", "Fig. 1", "auc",
                               {s: 0.5 + (0.06 if s == 5 else 0.02) for s in seeds}, {s: 0.5 for s in seeds})
    clear = claims.paired_claim("clear", "a clear claim", "Fig. 2", "auc", {s: 0.6 + 0.01 * s for s in seeds},
                                {s: 0.5 for s in seeds}, role="secondary")
    flat = claims.paired_claim("flat", "a null claim", "Fig. 3", "auc", {s: 0.5 + 0.01 * (s % 2) for s in seeds},
                               {s: 0.5 + 0.01 * ((s + 1) % 2) for s in seeds})
    assert near["sd"] == pytest.approx(0.016330, abs=1e-6)
    assert near["effect"] / near["sd"] == pytest.approx(1.633, abs=1e-3)
    assert near["verdict"] == "reproduced" and abs(near["effect"]) < near["mde"]
    assert clear["verdict"] == "reproduced" and clear["effect"] > clear["mde"]
    assert flat["verdict"] == "inconclusive"
    assert [report.below_mde(c) for c in (near, clear, flat)] == [True, False, False]
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": [near], "start_per_seed": True})
    make_run(tmp_path, "06_alpha", "20250101-120000", summary={"claims": claims.finalize([flat, clear])})
    rows = {r["id"]: r for r in report.gather(tmp_path).claims.tested}
    # one secondary in 06: its level is 0.05 / 1; the chance is the rule's at the measured effect / sd and seeds
    expected = {cid: claims.repeat_probability(rows[cid]["effect"] / rows[cid]["sd"], 6) for cid in ("near", "clear")}
    assert rows["near"]["repeat"] == pytest.approx(expected["near"]) and expected["near"] < 0.8
    assert rows["clear"]["repeat"] == pytest.approx(expected["clear"]) and expected["clear"] > 0.8
    assert rows["flat"]["repeat"] is None
    html = report.render_report(tmp_path).read_text()
    part = html[html.index("<h2>Claims</h2>"):html.index("<h2>Overview</h2>")]
    assert "1 of the 2 decided verdicts repeats with a chance under 80%" in part
    assert "quote it with the interval" in part
    cells = {cid: part[part.index(f'<span class="meta">{cid}</span>'):] for cid in ("near", "clear", "flat")}
    cells = {cid: row[:row.index("</tr>")] for cid, row in cells.items()}
    assert f"repeats {html_escape(report.percent(expected['near']))}" in cells["near"]
    assert f"repeats {html_escape(report.percent(expected['clear']))}" in cells["clear"]
    assert "repeats" not in cells["flat"] and f'<td class="num">{report.num(flat["mde"])}</td>' in cells["flat"]
    assert "below the MDE" not in part  # the chance replaced the mark
    assert "a start each" in cells["near"] and "one start" in cells["clear"] and "one start" in cells["flat"]
    card = html[html.index('class="card"'):html.index("<h2>Claims</h2>")]
    assert f"repeats {html_escape(report.percent(expected['near']))}" in card
    # no decided verdict under 80%: no such sentence
    make_run(tmp_path, "03_rl", "20250102-120000", summary={"claims": [clear | {"role": "primary"}]})
    make_run(tmp_path, "06_alpha", "20250102-120000", summary={"claims": [flat]})
    part = report.render_report(tmp_path).read_text()
    assert "with a chance under" not in part


def _declare(folder, nb, entries):
    lines = []
    for cid, role, requires in entries:
        lines += [f"- id: {cid}", f"  role: {role}", f"  claim: the claim {cid}", "  source: a paper",
                  "  metric: auc", "  direction: 1", "  scope: what the stand-in shows"]
        if role == "check":
            lines.append("  expect: inconclusive")
        if requires:
            lines.append(f"  requires: {requires}")
    (folder / nb).mkdir(parents=True)
    (folder / nb / "claims.yaml").write_text("\n".join(lines) + "\n")


def test_declared_claims_a_run_did_not_test_are_listed_with_what_they_need(tmp_path, monkeypatch):
    """A claim whose ``requires`` the run's parameters do not meet is listed apart, naming the parameter, what the
    claim needs and what the run had; one without ``requires`` that the run did not make says the notebook
    decided from what ran; one whose requirement the run meets says it was declared after the run. None counts."""
    from klear_lib import claims

    seeds = range(6)
    folder = tmp_path / "params"
    _declare(folder, "04_erc", [("primary", "primary", None), ("mask", "secondary", "{arms: mask}"),
                                ("half", "secondary", "{arms: [mask, half]}"), ("grad", "secondary", "{grad: true}"),
                                ("late", "secondary", "{arms: dapo}"), ("made_if_ran", "check", None)])
    primary = claims.paired_claim("primary", "the claim primary", "a paper", "auc", {s: 0.6 + 0.01 * s for s in seeds},
                                  {s: 0.5 for s in seeds}, scope="what the stand-in shows")
    mask = claims.paired_claim("mask", "the claim mask", "a paper", "auc", {s: 0.6 + 0.01 * s for s in seeds},
                               {s: 0.5 for s in seeds}, role="secondary", scope="what the stand-in shows")
    out = tmp_path / "outputs"
    make_run(out, "04_erc", "20250101-120000", params={"arms": "dapo,erc,mask", "grad": False, "seeds": "0,1"},
             summary={"claims": claims.finalize([primary, mask])})
    latest = report.latest_runs(report.collect_runs(out))
    rows = {r["id"]: r for r in report.untested_rows(latest, folder)}
    assert sorted(rows) == ["grad", "half", "late", "made_if_ran"]
    assert rows["half"]["needs"] == "arms: mask, half (this run: dapo,erc,mask)"
    assert rows["grad"]["needs"] == "grad: set (this run: False)"
    assert rows["late"]["needs"].startswith("declared after this run")
    assert rows["made_if_ran"]["needs"].startswith("what it compares did not run")
    assert [r["role"] for r in report.untested_rows(latest, folder)] == ["secondary"] * 3 + ["check"]
    monkeypatch.setenv("KLEAR_PARAMS_DIR", str(folder))
    html = report.render_report(out).read_text()
    part = html[html.index("<h2>Claims</h2>"):html.index("<h2>Overview</h2>")]
    assert "2 claims tested against the papers (1 primary" in part  # the untested ones are not counted
    assert "4 declared claims were not made at these runs' presets, each listed below with why" in part
    untested = part[part.index("<h3>Not made at this preset"):]
    assert "the claim half" in untested and "arms: mask, half (this run: dapo,erc,mask)" in untested
    assert "the claim mask" not in untested and "the claim primary" not in untested
    monkeypatch.setenv("KLEAR_PARAMS_DIR", str(tmp_path / "nowhere"))  # no declarations to read: no such list
    assert "Not made at this preset" not in report.render_report(out).read_text()


def test_damaged_metrics_are_named_and_marked(tmp_path):
    d = make_run(tmp_path, "03_rl", "20250101-120000", summary={"x": 1})
    with open(d / runs.METRICS_FILE, "a") as f:
        f.write("not json\n" + '{"step": 2}\n')
    run = report.collect_runs(tmp_path)[0]
    assert run.status == "damaged" and f"{d / runs.METRICS_FILE}:2" in run.error
    garbage = make_run(tmp_path, "04_erc", "20250101-120000", summary={"x": 1})
    (garbage / runs.METRICS_FILE).write_bytes(b'{"step": 1}\n{"step": 2')  # a truncated last line
    assert report.read_run(garbage).status == "damaged"


def test_status_json_gives_the_cause_and_only_run_named_folders_are_runs(tmp_path):
    d = make_run(tmp_path, "03_rl", "20250101-120000", summary=None)
    (d / "status.json").write_text(json.dumps({"status": "failed", "cause": "the kernel died: out of memory",
                                               "error": "DeadKernelError: Kernel died", "cell": 7,
                                               "cell_source": "results = experiment.run_jobs(jobs, ...)"}))
    i = make_run(tmp_path, "04_erc", "20250101-120000", summary=None)
    (i / "status.json").write_text(json.dumps({"status": "interrupted", "cause": "Ctrl-C (SIGINT)"}))
    (tmp_path / "03_rl" / "backup").mkdir()
    got = {r.notebook: r for r in report.collect_runs(tmp_path)}
    failed = got["03_rl"]
    assert failed.status == "failed" and "out of memory" in failed.error and "last cell [7]" in failed.error
    assert got["04_erc"].status == "interrupted"
    assert [f.name for f in report.unknown_folders(tmp_path)] == ["backup"]
    html = report.render_report(tmp_path).read_text()
    assert "03_rl/backup" in html and "not read as runs" in html
    assert oct((tmp_path / "report.html").stat().st_mode & 0o777) == "0o644"


def test_retired_claims_are_listed_with_their_last_result(tmp_path, monkeypatch):
    """A claim a notebook no longer tests stays on the page (retired.yaml): its id, when, its last result and the
    docs/results.md entry that holds it, apart from the counted claims; a notebook without one lists none."""
    from klear_lib import claims

    seeds = range(6)
    folder = tmp_path / "params"
    _declare(folder, "03_rl", [("primary", "primary", None)])
    (folder / "03_rl" / "retired.yaml").write_text(
        "- id: old.final_fork\n  retired: 2026-12-03 (abc1234)\n  why: a second read-out <of> the same runs\n"
        "  last_result: '-0.171 [-0.280, -0.062], p_adj 0.016: reversed'\n  results_entry: 2026-12-01 · a run\n")
    primary = claims.paired_claim("primary", "the claim primary", "a paper", "auc", {s: 0.6 + 0.01 * s for s in seeds},
                                  {s: 0.5 for s in seeds}, scope="what the stand-in shows")
    out = tmp_path / "outputs"
    make_run(out, "03_rl", "20250101-120000", summary={"claims": claims.finalize([primary])})
    latest = report.latest_runs(report.collect_runs(out))
    [row] = report.retired_rows(latest, folder)
    assert (row["notebook"], row["id"], row["retired"]) == ("03_rl", "old.final_fork", "2026-12-03 (abc1234)")
    monkeypatch.setenv("KLEAR_PARAMS_DIR", str(folder))
    html = report.render_report(out).read_text()
    part = html[html.index("<h3>Retired claims"):html.index("<h2>Overview</h2>")]
    assert "1 claim was declared once and no longer is tested" in part
    assert "-0.171 [-0.280, -0.062], p_adj 0.016: reversed" in part and "docs/results.md: 2026-12-01 · a run" in part
    assert "a second read-out &lt;of&gt; the same runs" in part  # escaped like every printed value
    assert "1 claim tested against the papers (1 primary" in html  # not counted among the claims
    (folder / "03_rl" / "retired.yaml").unlink()
    assert "Retired claims" not in report.render_report(out).read_text()
