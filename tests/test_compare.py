"""`klear compare A B` (klear_lib.compare): two sets of runs side by side, claim by claim, from hand-made run
directories: the z of each pair worked by hand, flipped verdicts, claims on one side, unfinished runs, each side's
processor and commit, the errors a user meets (exit 2), the README's command as written, and the report's
"Compared with" section (`klear report --compare`)."""

import json
import math
import pathlib
import shlex

import pytest
from test_report import make_run
from test_report_card import CPU, stamp_run

from klear_lib import claims, cli, compare

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = pathlib.Path(__file__).parent / "fixtures"
DIRS = ["--notebooks-dir", str(FIXTURES / "nb"), "--params-dir", str(FIXTURES / "params")]  # no report notebook
OTHER_GIT = {"commit": "fedcba9876543210fedcba9876543210fedcba98", "dirty": False, "branch": "main"}
OTHER_CPU = {"cpu": "Other CPU 7", "cpu_id": "6/143/8", "cpu_capability": "AVX512", "python": "3.11"}
README_COMMAND = ".venv/bin/klear compare outputs OTHER/outputs"


def paired(id, diffs, role="primary", claim="GPPO learns faster than DAPO (PPO-clip)"):
    """A claim whose per-seed differences are `diffs` (arm a = 0.5 + d, arm b = 0.5)."""
    seeds = range(len(diffs))
    return claims.paired_claim(id, claim, "Fig. 3", "auc", {s: 0.5 + d for s, d in zip(seeds, diffs)},
                               {s: 0.5 for s in seeds}, role=role)


A_DIFFS = [0.1, 0.2, 0.3, 0.4]  # mean 0.25: reproduced (t interval [+0.0446, +0.455])
B_DIFFS = [0.0, 0.1, -0.1, 0.2]  # mean 0.05: inconclusive
# z by hand. A: deviations from 0.25 are -0.15, -0.05, +0.05, +0.15; squares 0.0225 + 0.0025 + 0.0025 + 0.0225 = 0.05;
# sd² = 0.05 / 3 = 1/60; se_A² = sd² / 4 = 1/240. B: deviations from 0.05 are -0.05, +0.05, -0.15, +0.15: the same
# squares, se_B² = 1/240. z = (0.25 - 0.05) / sqrt(1/240 + 1/240) = 0.2 / sqrt(1/120) = 0.2 * sqrt(120) = 2.19089...
Z_GPPO = 0.2 * math.sqrt(120)
SE_EACH = math.sqrt(1 / 240)  # 0.0645497...


@pytest.fixture
def trees(tmp_path):
    """<tmp>/outputs (A) and <tmp>/OTHER/outputs (B), as two machines leave them.
    03_rl: gppo on both (reproduced on A, inconclusive on B: flipped), a plain check that passes on A and fails on B
    (flipped; no z: no per-seed differences), a secondary only on B. 04_erc: on both, the same differences (z 0, not
    flipped). 05_code: failed on A (no summary), ran on B with one claim. 06_sft only on A."""
    a, b = tmp_path / "outputs", tmp_path / "OTHER" / "outputs"
    ctl_pass = claims.check("ctl", "the control holds", "reference", "spread", True, 0.0, criterion="spread 0")
    ctl_fail = claims.check("ctl", "the control holds", "reference", "spread", False, 0.2, criterion="spread 0")
    same = [0.3, 0.1, 0.2, 0.25, 0.15]
    erc = paired("erc", same, claim="ERC stabilises RL")
    stamp_run(make_run(a, "03_rl", "20250101-120000", summary={"claims": [paired("gppo", A_DIFFS), ctl_pass]},
                       figure=False))
    stamp_run(make_run(a, "04_erc", "20250101-120000", summary={"claims": [erc]}, figure=False))
    stamp_run(make_run(a, "05_code", "20250101-120000", summary=None, error=("RuntimeError", "boom"), figure=False))
    stamp_run(make_run(a, "06_sft", "20250101-120000", summary={"claims": [paired("alpha", A_DIFFS)]}, figure=False))
    other = {"git": OTHER_GIT, "versions": OTHER_CPU}
    side = paired("side", [0.1, 0.1, 0.2, 0.1], role="secondary", claim="A secondary only B tests")
    make_run(b, "03_rl", "20250101-090000", summary={"claims": [paired("gppo", A_DIFFS)]}, figure=False)  # older
    stamp_run(make_run(b, "03_rl", "20250102-120000", summary={"claims": claims.finalize(
        [paired("gppo", B_DIFFS), side, ctl_fail])}, figure=False), **other)
    stamp_run(make_run(b, "04_erc", "20250102-120000", summary={"claims": [erc]}, figure=False), **other)
    stamp_run(make_run(b, "05_code", "20250102-120000", summary={"claims": [paired("code", B_DIFFS)]},
                       figure=False), **other)
    return a, b


def test_the_z_of_two_runs_is_their_difference_over_its_standard_error(trees):
    data = compare.compare(*trees)
    rows = {(r["notebook"], r["id"]): r for r in data["rows"]}
    assert list(rows) == [("03_rl", "gppo"), ("03_rl", "ctl"), ("04_erc", "erc")]  # notebook order, checks last
    gppo = rows["03_rl", "gppo"]
    assert gppo["a"]["se"] == pytest.approx(SE_EACH, rel=1e-12) and gppo["b"]["se"] == pytest.approx(SE_EACH, rel=1e-12)
    assert gppo["a"]["se_from"] == "per-seed differences"
    assert gppo["difference"] == pytest.approx(0.2, rel=1e-12)
    assert gppo["z"] == pytest.approx(Z_GPPO, rel=1e-12) and round(gppo["z"], 4) == 2.1909
    assert (gppo["a"]["effect"], gppo["a"]["seeds"], gppo["a"]["stamp"]) == (pytest.approx(0.25), 4, "20250101-120000")
    assert gppo["b"]["stamp"] == "20250102-120000"  # B's newest run of 03, not its older one
    assert rows["04_erc", "erc"]["z"] == 0.0 and not rows["04_erc", "erc"]["flipped"]
    ctl = rows["03_rl", "ctl"]
    assert (ctl["z"], ctl["z_note"]) == (None, "a pass/fail check, no per-seed differences")
    json.dumps(data)  # plain data


def test_the_standard_error_from_the_interval_or_the_sd_is_the_same_one():
    c = paired("gppo", A_DIFFS)
    # the interval's half-width is t_{0.975, 3} · se = 3.182446 · 0.0645497 = 0.205426; over t it gives se back
    assert (c["ci_high"] - c["ci_low"]) / 2 == pytest.approx(3.182446305 * SE_EACH, rel=1e-8)
    without_seeds = {k: v for k, v in c.items() if k != "per_seed"}
    assert compare.standard_error(without_seeds) == (pytest.approx(SE_EACH, rel=1e-12), "sd")
    only_interval = {**without_seeds, "sd": None}
    assert compare.standard_error(only_interval) == (pytest.approx(SE_EACH, rel=1e-9), "interval")
    assert compare.standard_error(paired("one", [0.3])) == (None, "1 seed")
    assert compare.z_of(0.25, 0.0, 0.25, 0.0) == 0.0 and compare.z_of(0.3, 0.0, 0.25, 0.0) is None
    assert compare.z_of(0.25, SE_EACH, 0.05, SE_EACH) == pytest.approx(Z_GPPO, rel=1e-12)


def test_flipped_verdicts_one_sided_claims_and_unfinished_runs_are_listed(trees):
    data = compare.compare(*trees)
    flips = {r["id"]: r["change"] for r in data["rows"] if r["flipped"]}
    assert flips == {"gppo": "reproduced → inconclusive", "ctl": "pass → fail"} and data["flipped"] == 2
    assert data["common"] == ["03_rl", "04_erc", "05_code"]
    assert [(r["notebook"], r["id"], r["why"]) for r in data["only_a"]] == [
        ("06_sft", "alpha", "no run of 06_sft in B")]
    assert [(r["notebook"], r["id"], r["role"]) for r in data["only_b"]] == [
        ("03_rl", "side", "secondary"), ("05_code", "code", "primary")]
    why = [r["why"] for r in data["only_b"]]
    assert why[0] == "A's run of 03_rl (20250101-120000, preset tiny) did not make this claim"
    assert why[1] == "A's run of 05_code (20250101-120000) failed: RuntimeError: boom (cell [3])"
    assert data["not_ran"] == [{"side": "A", "notebook": "05_code", "stamp": "20250101-120000", "status": "failed",
                                "error": "RuntimeError: boom (cell [3])"}]


def test_each_side_shows_its_processors_commits_and_presets(trees):
    data = compare.compare(*trees)
    assert data["a"]["processors"] == [{"text": "Test CPU 9000 (cpu_id 25/17/1, AVX2)", "cpu": CPU["cpu"],
                                        "cpu_id": "25/17/1", "capability": "AVX2",
                                        "notebooks": ["03_rl", "04_erc", "05_code", "06_sft"]}]
    assert data["a"]["commits"] == [{"commit": "0123456789ab (dirty)",
                                     "notebooks": ["03_rl", "04_erc", "05_code", "06_sft"]}]
    assert [(p["cpu_id"], p["cpu"]) for p in data["b"]["processors"]] == [("6/143/8", "Other CPU 7")]
    assert data["b"]["commits"] == [{"commit": "fedcba987654", "notebooks": ["03_rl", "04_erc", "05_code"]}]
    assert data["b"]["presets"] == [{"preset": "tiny", "notebooks": ["03_rl", "04_erc", "05_code"]}]
    assert (data["a"]["kind"], data["b"]["kind"]) == ("outputs tree", "outputs tree")


def test_the_terminal_table(trees, capsys):
    a, b = trees
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "# klear compare"
    assert lines[2] == (f"- A: {a} (outputs tree, 4 notebooks): processor Test CPU 9000 (cpu_id 25/17/1, AVX2); "
                        "code 0123456789ab (dirty); preset tiny")
    assert lines[3] == (f"- B: {b} (outputs tree, 3 notebooks): processor Other CPU 7 (cpu_id 6/143/8, AVX512); "
                        "code fedcba987654; preset tiny")
    table = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")]
    assert table[0] == ["nb", "claim", "role", "A: effect [95% interval]", "A seeds", "A verdict",
                        "B: effect [95% interval]", "B seeds", "B verdict", "z", "flipped"]
    assert table[1] == ["03", "gppo", "primary", "+0.25 [+0.0446, +0.455]", "4", "reproduced",
                        "+0.05 [-0.155, +0.255]", "4", "inconclusive", "+2.19", "yes: reproduced → inconclusive"]
    assert table[2][-2:] == ["– (a pass/fail check, no per-seed differences)", "yes: pass → fail"]
    assert table[3][0:2] == ["04", "erc"] and table[3][-2:] == ["0", "no"]
    assert "- Flipped: 2 of 3 claims (03 gppo: reproduced → inconclusive; 03 ctl: pass → fail)." in lines
    assert "- Only in A: 06 alpha (primary, reproduced; no run of 06_sft in B)." in lines
    assert ("- Did not finish (no claims to compare): A 05_code 20250101-120000 failed: RuntimeError: boom "
            "(cell [3]).") in lines
    assert cli.main(["compare", str(a), str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["flipped"] == 2


def test_two_run_directories_and_a_failed_one(trees, capsys):
    a, b = trees
    data = compare.compare(a / "03_rl" / "20250101-120000", b / "03_rl" / "20250102-120000")
    assert (data["a"]["kind"], data["common"]) == ("run directory", ["03_rl"])
    assert [r["id"] for r in data["rows"]] == ["gppo", "ctl"] and data["rows"][0]["z"] == pytest.approx(Z_GPPO)
    # a run directory with no summary.json (the run failed): listed as such, nothing to compare, not an error
    assert cli.main(["compare", str(a / "05_code" / "20250101-120000"), str(b / "05_code" / "20250102-120000")]) == 0
    out = capsys.readouterr().out
    assert "No claim on both sides." in out and "A 05_code 20250101-120000 failed: RuntimeError: boom" in out
    assert "- Only in B: 05 code (primary, inconclusive; A's run of 05_code (20250101-120000) failed" in out


@pytest.mark.parametrize("which, message", [
    (lambda a, b: (a.parent / "nothere", b), "A: {0} does not exist; expected an outputs tree (<notebook>/<stamp>/ "
     "run directories under it, as `klear run` writes them) or one run directory (config.json, versions.json, "
     "git.json, ... in it)"),
    (lambda a, b: (a, b / "03_rl" / "20250102-120000" / "summary.json"), "B: {1} is a file; expected an outputs tree"),
    (lambda a, b: (a / "03_rl", b), "A: {0} holds run directories (20250101-120000, ...) but is not one: give one of "
     "them, or the outputs tree above it ({0.parent}); expected"),
    (lambda a, b: (a, b.parent), "B: {1} is neither an outputs tree nor a run directory (no <notebook>/<stamp>/ "
     "folder under it); expected an outputs tree"),
    (lambda a, b: (a / "06_sft" / "20250101-120000", b), "no notebook in common: A ({0}) has 06_sft; B ({1}) has "
     "03_rl, 04_erc, 05_code"),
])
def test_a_user_error_is_one_line_naming_the_path_and_exit_2(trees, capsys, which, message):
    a, b = which(*trees)
    with pytest.raises(cli.KlearError) as err:
        compare.compare(a, b)
    assert message.format(a, b) in str(err.value)
    assert cli.main(["compare", str(a), str(b)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("klear: error: ") and len(captured.err.splitlines()) == 1


def test_a_folder_that_holds_an_outputs_tree_is_named(trees):
    a, b = trees
    with pytest.raises(cli.KlearError, match=r"Did you mean .*OTHER/outputs\?$"):
        compare.compare(a, b.parent)


def test_the_readmes_compare_command_runs_as_written(trees, capsys, monkeypatch):
    assert README_COMMAND in (ROOT / "README.md").read_text(encoding="utf-8")
    monkeypatch.chdir(trees[0].parent)  # outputs/ and OTHER/outputs/ are there
    assert cli.main(shlex.split(README_COMMAND)[1:]) == 0
    assert "| 03 | gppo" in capsys.readouterr().out


def test_klear_report_compare_adds_the_section_to_the_page_and_the_card(trees, capsys):
    a, b = trees
    assert cli.main(["report", "--output-root", str(a), *DIRS]) == 0
    assert all("Compared with" not in (a / name).read_text() for name in ("report.html", "report.md"))
    capsys.readouterr()
    assert cli.main(["report", "--output-root", str(a), "--compare", str(b), *DIRS]) == 0
    assert capsys.readouterr().out.strip() == str(a / "report.html")
    html = (a / "report.html").read_text()
    section = html[html.index('<h2 id="compared">'):html.index("<h2>Overview</h2>")]
    assert f"Compared with <code>{b}</code>" in section
    assert "Other CPU 7 (cpu_id 6/143/8, AVX512)" in section and "<code>fedcba987654</code>" in section
    assert '<td class="num">+2.19</td><td><span class="flag">reproduced → inconclusive</span></td>' in section
    assert "no run of 06_sft in B" in section and "RuntimeError: boom" in section
    md = (a / "report.md").read_text()
    assert md.startswith("# Klear report card") and f"\n## Compared with {b}\n" in md
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.split("## Compared with")[1].splitlines()
            if line.startswith("| ")]
    assert rows[0] == ["nb", "claim", "A: verdict, effect [95% interval]", "B: verdict, effect [95% interval]", "z",
                       "flipped"]
    assert rows[1] == ["03", "GPPO learns faster than DAPO", "reproduced +0.25 [+0.0446, +0.455]",
                       "inconclusive +0.05 [-0.155, +0.255]", "+2.19", "yes"]
    # a wrong --compare is one line and exit 2, before the report is written again
    before = (a / "report.html").stat().st_mtime_ns
    assert cli.main(["report", "--output-root", str(a), "--compare", str(b.parent), *DIRS]) == 2
    assert (a / "report.html").stat().st_mtime_ns == before


def test_the_section_escapes_what_it_prints(trees):
    from klear_lib import report

    a, b = trees
    evil = paired("<i>d", B_DIFFS, claim="<script>x</script> & co")
    stamp_run(make_run(b, "03_rl", "20250103-120000", summary={"claims": [paired("gppo", B_DIFFS), evil]},
                       figure=False))
    html = report.page_html(report.gather(a), comparison=compare.compare(a, b))
    section = html[html.index('<h2 id="compared">'):html.index("<h2>Overview</h2>")]
    assert "<script>" not in html and "<i>d" not in html
    assert "&lt;script&gt;x&lt;/script&gt; &amp; co" in section and "&lt;i&gt;d" in section
