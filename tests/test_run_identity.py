"""Runs know what they are: every run directory records which preset its parameters are (``preset.json``, written
by klear_lib.notebook.start_run from the notebook's own values), or ``custom`` with what differs, whoever launched it
(``klear run``, papermill, JupyterLab); the report marks smoke and custom runs wherever their numbers appear."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from klear_lib import cli, notebook, report, runs
from klear_lib import presets as presets_mod

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "identity"
DIRS = ["--notebooks-dir", str(FIXTURES / "nb"), "--params-dir", str(FIXTURES / "params")]


def presets(tmp_path):
    folder = tmp_path / "params" / "nb"
    folder.mkdir(parents=True)
    (folder / "smoke.yaml").write_text('seeds: "0"\nlr: 4.0e-3\nrollouts: 2\nworkers: 2\n')
    (folder / "tiny.yaml").write_text('seeds: "0,1,2,3"\nlr: 5.0e-5\nrollouts: 6\nworkers: 2\n')
    return tmp_path / "params"


def test_a_run_is_the_preset_whose_every_value_it_has(tmp_path):
    params = presets(tmp_path)
    smoke = {"seeds": "0", "lr": 0.004, "rollouts": 2, "workers": 2, "run_dir": "", "np": object()}
    assert notebook.identify_preset("nb", smoke, params) == {
        "preset": "smoke", "nearest": "smoke", "differs": {}, "params": {"seeds": "0", "lr": 0.004, "rollouts": 2,
                                                                          "workers": 2}}
    # how a run runs (workers, the tracker) does not change what it is; an int for a float is the same number
    assert notebook.identify_preset("nb", {**smoke, "workers": 1, "lr": 0.004, "rollouts": 2.0}, params)["preset"] \
        == "smoke"
    got = notebook.identify_preset("nb", {**smoke, "seeds": "0,1"}, params)
    assert (got["preset"], got["nearest"], got["differs"]) == ("custom", "smoke",
                                                              {"seeds": {"run": "0,1", "preset": "0"}})
    got = notebook.identify_preset("nb", {"seeds": "0,1,2,3", "lr": 5e-5, "rollouts": 3, "workers": 2}, params)
    assert (got["preset"], got["nearest"], got["differs"]) == ("custom", "tiny", {"rollouts": {"run": 3, "preset": 6}})
    assert notebook.identify_preset("other", smoke, params)["preset"] is None  # no presets to compare with


def test_the_shipped_presets_identify_themselves():
    """(The report notebook's smoke and tiny presets are the same: its runs are not in the report.)"""
    root = pathlib.Path(__file__).resolve().parent.parent
    for folder in sorted(p for p in (root / "params").iterdir() if not p.name.startswith("00_")):
        for preset in presets_mod.list_presets(folder.name, root / "params"):
            values = presets_mod.load_params(folder.name, preset, params_dir=root / "params")
            assert notebook.identify_preset(folder.name, values)["preset"] == preset, (folder.name, preset)


@pytest.mark.parametrize("override,preset,differs", [
    ((), "smoke", {}), (("-p", "workers=1"), "smoke", {}),
    (("-p", "x=5"), "custom", {"x": {"run": 5, "preset": 3}})])
def test_klear_run_records_the_preset_of_its_resolved_parameters(tmp_path, override, preset, differs):
    out = tmp_path / "outputs"
    assert cli.main(["run", "95", "--preset", "smoke", *override, "--output-root", str(out), *DIRS]) == 0
    [run_dir] = sorted((out / "95_preset").iterdir())
    record = json.loads((run_dir / runs.PRESET_FILE).read_text())
    assert (record["preset"], record["differs"], record["launcher"]) == (preset, differs, "klear run")
    run = report.read_run(run_dir)
    assert run.preset == preset and run.launcher == "klear run"  # preset.json wins over params.json's "smoke"


def test_papermill_alone_records_the_preset_and_the_report_marks_custom_runs(tmp_path, monkeypatch):
    import papermill

    monkeypatch.setenv(notebook.PARAMS_DIR_ENV, str(FIXTURES / "params"))  # the checkout has no 95_preset presets
    monkeypatch.delenv(notebook.LAUNCHER_ENV, raising=False)
    out = tmp_path / "outputs"
    done = {}
    for label, values in (("smoke", {"x": 3, "seeds": "0"}), ("custom", {"x": 4, "seeds": "0"})):
        run_dir = runs.create_run_dir(out, "95_preset", stamp=f"2025010{len(done) + 1}-120000")
        papermill.execute_notebook(str(FIXTURES / "nb" / "95_preset.ipynb"), str(run_dir / "notebook.ipynb"),
                                   parameters={**values, "run_dir": str(run_dir)}, kernel_name="python3",
                                   progress_bar=False, cwd=str(tmp_path))
        done[label] = run_dir
    smoke = json.loads((done["smoke"] / runs.PRESET_FILE).read_text())
    assert (smoke["preset"], smoke["launcher"], smoke["params"]) == ("smoke", "kernel",
                                                                     {"x": 3, "seeds": "0", "workers": 2})
    assert not (done["smoke"] / runs.PARAMS_FILE).exists()  # no klear run: the preset comes from preset.json alone
    runs_ = {r.stamp: r for r in report.collect_runs(out)}
    assert [r.preset for r in runs_.values()] == ["smoke", "custom"]
    assert runs_["20250101-120000"].seeds == [0]  # parameters read from preset.json when there is no params.json
    html = report.render_report(out).read_text()
    assert '<span class="badge custom">custom</span>' in html
    assert "It differs from <code>smoke</code> in: x 4 (smoke: 3)." in html
    assert os.environ.get(notebook.LAUNCHER_ENV) is None


def test_the_report_marks_smoke_and_custom_claims(tmp_path):
    from klear_lib import claims

    claim = claims.paired_claim("c", "a beats b", "paper", "m", {0: 0.6}, {0: 0.5})  # one seed: inconclusive
    for nb, preset in (("01_a", "smoke"), ("02_b", "custom"), ("03_c", "tiny")):
        d = runs.create_run_dir(tmp_path, nb, stamp="20250101-120000")
        runs.write_run_metadata(d, {"seed": 0})
        runs.MetricsWriter(d / runs.METRICS_FILE).close()
        runs.write_summary(d, {"claims": [claim]})
        runs.write_preset_record(d, {"preset": preset, "nearest": "tiny", "differs": {"seeds": {"run": "0",
                                                                                                "preset": "0,1"}}})
    rows = report.claim_rows(report.latest_runs(report.collect_runs(tmp_path)))
    assert [(r["notebook"], r["preset"]) for r in rows] == [("01_a", "smoke"), ("02_b", "custom"), ("03_c", "tiny")]
    html = report.render_report(tmp_path).read_text()
    assert "01_a</a> (smoke)" in html and "02_b</a> (custom)" in html and "03_c</a> (tiny)" not in html
    assert "Some claims come from <code>custom</code> runs" in html
