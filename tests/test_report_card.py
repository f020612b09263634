"""The report's card and its words: the card's rows and counts read from hand-made run directories as plain data
(klear_lib.report_data), the same card as Markdown (report.md, the terminal), counts and capitals agreed in one
place, every value the page template prints HTML-escaped, and the CPU time `klear run` records."""

import json
import math
import re
import subprocess
import sys

import pytest
from test_report import make_run

from klear_lib import claims, cli, report, report_data, runner, runs

SEEDS = range(6)
GIT = {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": True, "branch": "main"}
CPU = {"cpu": "Test CPU 9000", "cpu_id": "25/17/1", "cpu_capability": "AVX2", "python": "3.11"}


def rising(base=0.5, step=0.01):
    return {s: base + step * s for s in SEEDS}


def flat(value=0.5):
    return {s: value for s in SEEDS}


def stamp_run(d, *, seconds=None, cpu_seconds=None, git=GIT, versions=CPU):
    """What `klear run` adds to a run directory after the fact: its times in params.json, and a fixed commit and
    processor (so that the card's lines can be asserted whole)."""
    record = json.loads((d / runs.PARAMS_FILE).read_text())
    record.update({k: v for k, v in (("seconds", seconds), ("cpu_seconds", cpu_seconds)) if v is not None})
    (d / runs.PARAMS_FILE).write_text(json.dumps(record))
    (d / runs.GIT_FILE).write_text(json.dumps(git))
    (d / runs.VERSIONS_FILE).write_text(json.dumps(versions))
    return d


@pytest.fixture
def three(tmp_path):
    """03_rl: a reproduced primary with a start per seed, a secondary, a passing check (100 s wall, 150 s CPU);
    04_erc: a reversed primary, an A/A check that passes and a check that fails (50 s, CPU not recorded: a run from
    before klear recorded it); 05_code: failed, no claims."""
    up = claims.paired_claim("gppo_vs_dapo", "GPPO learns faster than DAPO's clip-higher (PPO-clip)", "Fig. 3",
                             "auc", rising(0.6), flat())
    side = claims.paired_claim("side", "Top-1 beats Top-2 when the two sources follow the same procedure", "Fig. 3",
                               "auc", {s: 0.5 + 0.01 * (s % 2) for s in SEEDS}, flat(), role="secondary")
    ctl = claims.check("control", "the control holds", "reference", "spread", True, 0.0, criterion="spread 0")
    down = claims.paired_claim("erc", "ERC stabilises RL (it keeps what the model knows)", "ERC paper", "cv",
                               flat(0.1), rising(0.3), direction=1)
    aa = claims.paired_claim("aa", "A/A", "this project", "auc", rising(),
                             {s: 0.5 + 0.01 * ((s * 5) % 6) for s in SEEDS}, role="check", expect="inconclusive")
    bad = claims.check("bad", "a check that fails", "this project", "x", False, 1.0, criterion="x < 1")
    root = tmp_path / "outputs"
    stamp_run(make_run(root, "03_rl", "20250101-120000", summary={"claims": claims.finalize([up, side, ctl]),
                                                                 "start_per_seed": True}),
              seconds=100.0, cpu_seconds=150.0)
    stamp_run(make_run(root, "04_erc", "20250101-120000", summary={"claims": [down, aa, bad]}), seconds=50.0)
    stamp_run(make_run(root, "05_code", "20250101-120000", summary=None, error=("RuntimeError", "boom")))
    return root


def test_the_card_is_plain_data_read_from_the_run_directories(three):
    page = report_data.gather(three)
    card = page.card
    assert [(r["notebook"], r["short"], r["verdict"], r["seeds"], r["start_per_seed"]) for r in card.rows] == [
        ("03_rl", "GPPO learns faster than DAPO's clip-higher", "reproduced", 6, True),
        ("04_erc", "ERC stabilises RL", "reversed", 6, False)]  # primary claims only, in notebook order
    c = card.claims
    assert c.counts == {"reproduced": 1, "reversed": 1, "inconclusive": 1}
    assert c.primary == {"reproduced": 1, "reversed": 1, "inconclusive": 0}
    assert c.check_counts == {"pass": 2, "fail": 1} and c.own_starts == ["03_rl"]
    assert (card.runs, card.statuses) == (3, {"ran": 2, "failed": 1})
    assert (card.wall_seconds, card.cpu_seconds, card.cpu_runs) == (150.0, 150.0, 1)
    assert card.commits == ["0123456789ab (dirty)"]
    assert card.processors == ["Test CPU 9000 (cpu_id 25/17/1, AVX2)"] and card.presets == ["tiny"]
    # one run's card: every claim it tested, the secondary too, and that run's time only
    one = report_data.run_card(page.latest["03_rl"])
    assert [r["id"] for r in one.rows] == ["gppo_vs_dapo", "side"]
    assert (one.runs, one.wall_seconds, one.cpu_seconds) == (1, 100.0, 150.0)


def test_reproduce_log_times_count_for_a_notebook_without_a_run_directory(three):
    row = {"notebook": "07_eval", "status": "FAILED", "seconds": 7.0, "run_dir": None, "message": "no preset"}
    log = {"preset": "tiny", "started": "2025-01-02T00:00:00", "total_s": 400.0, "rows": [row]}
    (three / "reproduce.json").write_text(json.dumps(log))
    card = report_data.gather(three).card
    assert (card.runs, card.statuses, card.wall_seconds, card.reproduce_s) == (4, {"ran": 2, "failed": 2}, 157.0, 400.0)


@pytest.mark.parametrize("text, short", [
    ("A few high-quality sources beat many diverse ones at the same budget (Top-1 beats Top-7)", "Top-1 beats Top-7"),
    ("GPPO learns faster than DAPO's clip-higher (PPO-clip)", "GPPO learns faster than DAPO's clip-higher"),
    ("ERC stabilises RL", "ERC stabilises RL"),
    ("ERC's entropy criterion, not the number or place of stopped tokens, stabilises",
     "ERC's entropy criterion, not the number or place of stopped…"),
])
def test_a_claim_in_a_few_words(text, short):
    assert report_data.short_claim(text) == short
    assert len(report_data.short_claim(text)) <= report_data.SHORT_CLAIM_CHARS


def test_counts_and_capitals_are_agreed_in_one_place():
    assert [report.counted(n, "claim") for n in (0, 1, 2)] == ["0 claims", "1 claim", "2 claims"]
    assert [report.plural(n, "is", "are") for n in (1, 3)] == ["is", "are"]
    assert report.counted(1, "declared claim") == "1 declared claim"
    assert report.sentence("the SFT start") == "The SFT start"  # the rest untouched (Jinja's capitalize lowers it)
    assert report.sentence("In 03") == "In 03" and report.sentence("") == ""
    assert [report.listing(x) for x in (["a"], ["a", "b"], ["a", "b", "c"])] == ["a", "a and b", "a, b and c"]
    assert [report.duration(s) for s in (None, 48, 725, 3790)] == ["not recorded", "48 s", "12 min 05 s",
                                                                    "1 h 03 min"]
    assert [report.signed(x) for x in (0.0, 0.336, -0.03221)] == ["0", "+0.336", "-0.0322"]


def claims_part(html):
    return html[html.index("<h2>Claims</h2>"):html.index("<h2>Overview</h2>")]


def test_one_claim_one_check_and_no_start_per_seed_read_as_sentences(tmp_path):
    """The words the page used to get wrong: "1 claims tested", "1 checks", and a sentence starting in lower case
    when no notebook trains a start per seed."""
    up = claims.paired_claim("up", "a beats b", "Fig. 1", "auc", rising(0.6), flat())
    ctl = claims.check("control", "the control holds", "reference", "spread", True, 0.0, criterion="spread 0")
    make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": [up, ctl]})
    html = report.render_report(tmp_path).read_text()
    part = claims_part(html)
    assert "1 claim tested against the papers (1 primary" in part and "1 claims" not in html
    assert "1 check (positive controls, pipeline checks, A/A pairs) is listed apart" in part
    assert "1 checks" not in html
    assert re.search(r"scale\.\s+The seeds vary training from one trained starting model", part)
    assert not re.search(r"[.:;] the seeds vary", part)
    card = html[html.index('class="card"'):html.index("<h2>Claims</h2>")]
    assert "1 claim tested: 1 reproduced, 0 reversed, 0 inconclusive" in card and "1 check: 1 pass, 0 fail" in card


def test_the_card_opens_the_page_and_the_table_puts_the_verdict_before_the_numbers(three):
    html = report.render_report(three).read_text()
    assert html.index("<h1>") < html.index('class="card"') < html.index("<h2>Claims</h2>")
    card = html[html.index('class="card"'):html.index("<h2>Claims</h2>")]
    row = card[card.index('<a href="#03_rl">03</a>'):]
    row = row[:row.index("</tr>")]
    assert row.index("GPPO learns faster than DAPO&#x27;s clip-higher") < row.index(
        '<span class="badge reproduced">reproduced</span>') < row.index("+0.125 [") < row.index("a start each")
    assert ("<dt>Time</dt><dd>2 min 30 s wall-clock over 3 runs, 2 min 30 s CPU (150 CPU-s) (recorded by 1 of them)"
            "</dd>") in card
    assert "<code>0123456789ab (dirty)</code>" in card and "Test CPU 9000 (cpu_id 25/17/1, AVX2)" in card
    table = claims_part(html)[claims_part(html).index("<table>"):]
    first = table[table.index("gppo_vs_dapo"):table.index("</tr>", table.index("gppo_vs_dapo"))]
    assert first.index('<span class="badge reproduced">') < first.index("+0.125")  # verdict, then the effect
    folded = table[table.index('<tr class="more">'):]
    assert folded.index("<details><summary>source, metric") < folded.index("Fig. 3") < folded.index("</details>")


def test_every_value_the_template_prints_is_escaped(tmp_path):
    hostile = "<script>alert(1)</script> & 'x' \"y\""
    up = claims.paired_claim("<b>id</b>", hostile, "<i>src</i>", "<u>m</u>", rising(0.6), flat(), scope="<em>s</em>")
    d = make_run(tmp_path, "03_rl", "20250101-120000", summary={"claims": [up], "<k>": "<v>"})
    stamp_run(d, versions={"cpu": "<cpu>", "cpu_id": "1"})
    html = report.render_report(tmp_path).read_text()
    assert "<script" not in html and "<b>id" not in html and "<i>src" not in html and "<em>s" not in html
    assert "<cpu>" not in html and "<k>" not in html and "<v>" not in html
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &#x27;x&#x27; &quot;y&quot;"
    assert html.count(escaped) >= 2  # the card's title attribute and the claims table
    assert "&lt;b&gt;id&lt;/b&gt;" in html and "&lt;em&gt;s&lt;/em&gt;" in html and "&lt;cpu&gt;" in html


def md_rows(text):
    """The cells of the Markdown card's table: header first, separator left out."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert set(lines[1]) <= {"|", "-"}
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines[:1] + lines[2:]]


def test_report_md_is_the_card_as_a_markdown_table(three):
    path = report.write_card(three)
    assert path == three / "report.md" and not (three / "report.html").exists()  # the page is render_report's
    text = path.read_text()
    assert text.startswith("# Klear report card\n")
    # differences 0.10-0.15 and -0.20 to -0.25 over 6 seeds: mean ± t(0.975, 5) · sd / √6 = ± 0.0196; sd 0.0187, so
    # 6.7 paired sds: a rerun repeats either verdict with a chance above 99%; the halves (0.10-0.12 against
    # 0.13-0.15) differ by 0.03 over a within-half sd of 0.01: t -3.67 on 4 df, z -2.30. 03's every seed goes the
    # paper's way, 04's none (reversed)
    sd = math.sqrt(sum((0.1 + 0.01 * s - 0.125) ** 2 for s in SEEDS) / 5)
    assert claims.repeat_probability(0.125 / sd, 6) > 0.99
    assert md_rows(text) == [
        ["nb", "primary claim", "verdict", "effect [95% interval]", "seeds in the paper's direction", "split-half z",
         "seeds", "starts"],
        ["03", "GPPO learns faster than DAPO's clip-higher", "reproduced (repeats >99%)", "+0.125 [+0.105, +0.145]",
         "6 of 6 seeds in the paper's direction", "-2.3", "6", "a start each"],
        ["04", "ERC stabilises RL", "reversed (repeats >99%)", "-0.225 [-0.245, -0.205]",
         "0 of 6 seeds in the paper's direction", "+2.3", "6", "one start"]]
    # two primaries held to 5% each: 1 - 0.95² = 9.75% by chance where neither has an effect
    assert ("- By chance: with 2 primary claims each held to 5%, at least one would come out reproduced or reversed "
            "~10% of the time if none had an effect (1 − (1 − 0.05)^2, for independent claims under the null).") in text
    assert "- Split-half z: a consistency check inside the run, never the verdict and not a replication" in text
    assert f"{report.percent(claims.split_half_power(6))} of the time at 6 seeds" in text
    assert len({len(line) for line in text.splitlines() if line.startswith("|")}) == 1  # padded: a table on a terminal
    assert ("- Verdicts: 3 claims tested: 1 reproduced, 1 reversed, 1 inconclusive (primary: 1 reproduced, 1 reversed, "
            "0 inconclusive); 3 checks: 2 pass, 1 fail") in text
    assert "- Runs: 3 notebooks: 2 ran, 1 failed (preset tiny)" in text
    assert "- Time: 2 min 30 s wall-clock over 3 runs, 2 min 30 s CPU (150 CPU-s) (recorded by 1 of them)" in text
    assert "- Code: 0123456789ab (dirty)" in text and "- Processor: Test CPU 9000 (cpu_id 25/17/1, AVX2)" in text
    assert f"Full report: {three / 'report.html'}" in text and "Smoke" not in text


def test_a_pipe_in_a_claim_stays_in_its_cell_and_smoke_runs_are_marked(tmp_path):
    up = claims.paired_claim("p", "a | b beats c", "Fig. 1", "auc", rising(0.6), flat())
    make_run(tmp_path, "01_sft", "20250101-120000", summary={"claims": [up]}, preset="smoke")
    text = report.card_markdown(report_data.gather(tmp_path).card)
    assert md_rows(text)[1][:3] == ["01 (smoke)", "a \\| b beats c", "reproduced (repeats >99%)"]
    assert "their numbers and verdicts mean nothing" in text


def test_a_real_model_run_is_labelled_a_pipeline_check_on_the_card(tmp_path):
    check = claims.check("stops_at_turn_end", "Generation stops", "loader", "greedy", True, 1.0, criterion="ends")
    make_run(tmp_path, "08_real_model", "20250101-120000", summary={"claims": [check]}, preset="small-real")
    gathered = report_data.gather(tmp_path)
    text = report.card_markdown(gathered.card)
    assert "No claims in these runs." in text and "4 checks" not in text and "1 check: 1 pass" in text, text
    assert "small-real runs: pipeline checks of a real pretrained model" in text
    assert "they reproduce no claim of the papers" in report.page_html(gathered)


def test_the_terminal_gets_the_card(three, capsys):
    cli._print_card(output_root=three, report_path=three / "report.html")  # klear reproduce: on stdout
    out = capsys.readouterr().out
    assert "| 03 | GPPO learns faster than DAPO's clip-higher |" in out and "- Time: " in out
    cli._print_card(run_dir=three / "03_rl" / "20250101-120000")  # klear run: on stderr, that run's claims only
    captured = capsys.readouterr()
    assert captured.out == "" and "# 03_rl 20250101-120000" in captured.err
    assert [row[1] for row in md_rows(captured.err)] == [
        "claim", "GPPO learns faster than DAPO's clip-higher",
        "Top-1 beats Top-2 when the two sources follow the same procedure"]
    assert "ERC stabilises RL" not in captured.err


def test_klear_run_records_cpu_seconds_counting_its_children(tmp_path):
    """``cpu_seconds`` in params.json counts the children that ended (the kernel and the workers it waited for):
    a child that burns CPU for 0.3 s shows in it. A resumed run whose first part predates the field gets none."""
    d = tmp_path / "run"
    d.mkdir()
    (d / runs.PARAMS_FILE).write_text(json.dumps({"notebook": "x"}))
    clock, cpu = runner.time.monotonic(), runner._cpu_seconds()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    runner._finish_record(d, clock, cpu)
    record = json.loads((d / runs.PARAMS_FILE).read_text())
    assert record["cpu_seconds"] >= 0.3 and record["seconds"] > 0
    assert report_data.read_run(d).cpu_seconds == record["cpu_seconds"]
    (d / runs.PARAMS_FILE).write_text(json.dumps({"notebook": "x", "seconds_before": 5.0, "cpu_seconds_before": None}))
    runner._finish_record(d, clock, cpu)
    record = json.loads((d / runs.PARAMS_FILE).read_text())
    assert record["seconds"] >= 5.0 and "cpu_seconds" not in record


def test_a_run_counts_the_cpu_of_the_workers_its_notebook_starts(tmp_path):
    """The units of work run in a forkserver's workers (klear_lib.experiment); the forkserver outlives the kernel by
    a moment, and its workers' CPU time used to be lost with it (a 30-minute run recorded 9 s). Two workers that
    each burn 1 s of CPU must show in ``cpu_seconds``."""
    import nbformat

    (tmp_path / "burnmod.py").write_text("import time\n\ndef burn(s):\n    t = time.process_time()\n"
                                         "    while time.process_time() - t < s:\n        pass\n    return s\n")
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell('run_dir = ""', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(
                    "import concurrent.futures as cf, multiprocessing as mp, sys\n"
                    f"sys.path.insert(0, {str(tmp_path)!r})\nfrom burnmod import burn\n"
                    "with cf.ProcessPoolExecutor(2, mp_context=mp.get_context('forkserver')) as pool:\n"
                    "    assert list(pool.map(burn, [1.0, 1.0])) == [1.0, 1.0]")]
    (tmp_path / "nb").mkdir()
    nbformat.write(nb, str(tmp_path / "nb" / "95_burn.ipynb"))
    (tmp_path / "params" / "95_burn").mkdir(parents=True)
    (tmp_path / "params" / "95_burn" / "smoke.yaml").write_text("{}\n")
    layout = runner.Layout(repo_root=tmp_path, notebooks_dir=tmp_path / "nb", params_dir=tmp_path / "params",
                           output_root=tmp_path / "out")
    run_dir = runner.run_notebook("95_burn", "smoke", layout=layout, progress_bar=False)
    record = json.loads((run_dir / runs.PARAMS_FILE).read_text())
    assert record["cpu_seconds"] >= 2.0, record


def test_the_card_says_how_the_code_sandbox_bounded_the_runs(three):
    """versions.json's ``sandbox`` (written by the runs that train on the code reward) appears on the card, each mode
    with its notebooks; a card whose runs recorded none has no such line."""
    assert "Sandbox" not in report.write_card(three).read_text()
    for nb, mode in (("03_rl", "cgroup v1"), ("04_erc", "none")):
        [d] = (three / nb).iterdir()
        stamp_run(d, versions={**CPU, "sandbox": mode})
    text = report.write_card(three).read_text()
    assert "- Sandbox: cgroup v1 (03_rl); none (04_erc)" in text
    html = report.render_report(three).read_text()
    assert "<dt>Sandbox</dt><dd>cgroup v1 (03_rl); none (04_erc)</dd>" in html
