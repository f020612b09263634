"""One schedule for `klear reproduce` (klear_lib.schedule): the dependency graph, the list scheduler on hand-computed
cases and invariants, the unit slots across processes, the plan from a recorded tree, and a real reproduce of fake
notebooks with units (tests/fixtures/units' 95_units under other names) on one slot."""

import dataclasses
import datetime
import json
import multiprocessing
import pathlib
import random
import shutil
import time

import pytest

from klear_lib import cli, experiment, presets, schedule
from klear_lib.schedule import Work

ROOT = pathlib.Path(__file__).parent.parent
FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def units(*seconds, workers=None, name="nb"):
    return Work(name, (("units", tuple(seconds)),), workers)


# ------------------------------------------------------------------------------------------ the graph


def test_the_dependency_graph_names_existing_notebooks_and_has_no_cycle():
    names = {nb.stem for nb in presets.list_notebooks(ROOT / "notebooks")}
    for nb, before in schedule.AFTER.items():
        assert nb in names and set(before) <= names, (nb, before)
    deps = schedule.dependencies(sorted(names))  # raises on a cycle
    assert deps["04_erc_bounds"] == {"03_rl_clip_variants"} and deps["06_sft_loss_alpha"] == {"03_rl_clip_variants"}
    assert deps["00_report"] == names - {"00_report"}  # the report after all
    order = schedule.topological(deps)
    assert order[-1] == "00_report" and order.index("03_rl_clip_variants") < order.index("04_erc_bounds")


def test_dependencies_keep_only_the_notebooks_given_and_refuse_a_cycle():
    assert schedule.dependencies(["a", "b"], {"b": ("a", "zz"), "c": ("a",)}) == {"a": set(), "b": {"a"}}
    with pytest.raises(ValueError, match="cycle"):
        schedule.dependencies(["a", "b"], {"a": ("b",), "b": ("a",)})


# ------------------------------------------------------------------------------------ the list scheduler


def test_units_5_3_3_1_on_two_cores_by_hand():
    # one notebook, units in their order on 2 slots: 5 and 3 at 0; the third 3 at 3 (to 6); the 1 at 5 (to 6)
    assert schedule.simulate({"a": units(5, 3, 3, 1)}, {}, 2).makespan == 6
    assert schedule.simulate({"a": units(5, 3, 3, 1)}, {}, 1).makespan == 12
    assert schedule.simulate({"a": units(5, 3, 3, 1, workers=1)}, {}, 2).makespan == 12  # its own workers: 1
    # two notebooks, b after a: a's 5 and 3 end at 5; b's 3 and 1 start at 5, end at 8
    works = {"a": units(5, 3, name="a"), "b": units(3, 1, name="b")}
    got = schedule.simulate(works, {"b": {"a"}}, 2)
    assert (got.makespan, got.start["b"], got.end["a"]) == (8, 5, 5)
    # no dependency: a first (it is longer); at 3 a's 3 ends and b's 3 takes the slot (to 6), at 5 b's 1 (to 6)
    got = schedule.simulate(works, {}, 2)
    assert (got.makespan, got.end["a"], got.end["b"]) == (6, 5, 6)
    assert sorted(got.units) == [("a", 0, 3), ("a", 0, 5), ("b", 3, 6), ("b", 5, 6)]
    # one notebook at a time: as with the dependency; one after another likewise
    assert schedule.simulate(works, {}, 2, max_notebooks=1).makespan == 8
    assert schedule.one_after_another(works, {}, 2) == 8
    assert schedule.critical_path(works, {"b": {"a"}}) == 8 and schedule.critical_path(works, {}) == 5


def test_serial_segments_take_time_but_no_slot():
    a = Work("a", (("serial", 2), ("units", (4, 4)), ("serial", 1)))
    b = Work("b", (("units", (3,)),))
    # 2 cores: a = 2 + 4 + 1 = 7, then b 7..10; 1 core: a = 2 + 8 + 1 = 11, then b 11..14
    assert schedule.simulate({"a": a, "b": b}, {"b": {"a"}}, 2).makespan == 10
    assert schedule.simulate({"a": a, "b": b}, {"b": {"a"}}, 1).makespan == 14
    # side by side on 1 core: b's unit takes the slot while a is in its first serial part (0..3), a's units 3..11
    got = schedule.simulate({"a": a, "b": b}, {}, 1)
    assert (got.end["b"], got.end["a"]) == (3, 12)


def test_the_scheduler_keeps_its_invariants_on_random_work():
    """Random notebooks and graphs: never more units at once than cores, no notebook before its prerequisites end,
    a notebook's units within its life, and the makespan at least the longest chain and the units' work / cores."""
    rng = random.Random(0)
    for trial in range(60):
        names = [f"n{i}" for i in range(rng.randint(1, 5))]
        works = {}
        for n in names:
            segs = []
            for _ in range(rng.randint(1, 3)):
                segs.append(("serial", rng.choice([0, 1, 2.5])))
                segs.append(("units", tuple(rng.choice([1, 2, 3, 5]) for _ in range(rng.randint(0, 6)))))
            works[n] = Work(n, tuple(segs), rng.choice([None, 1, 2]))
        deps = {n: {m for m in names[:i] if rng.random() < 0.4} for i, n in enumerate(names)}
        cores = rng.randint(1, 4)
        got = schedule.simulate(works, deps, cores, max_notebooks=rng.choice([None, 1, 2]))
        stamps = sorted({t for _, s, e in got.units for t in (s, e)})
        for t in stamps:
            assert sum(s <= t < e for _, s, e in got.units) <= cores, trial
        for n in names:
            assert all(got.start[n] >= got.end[d] for d in deps[n]), trial
            assert all(got.start[n] <= s and e <= got.end[n] for m, s, e in got.units if m == n), trial
        assert len(got.units) == sum(len(v) for w in works.values() for k, v in w.segments if k == "units")
        work = sum(w.unit_seconds for w in works.values())
        assert got.makespan >= max(schedule.critical_path(works, deps), work / cores) - 1e-9, trial


def test_notebooks_at_once_fit_the_free_memory():
    # (free - cores x 200 MB of running units) // (700 MB a notebook + its idle workers x 15 MB)
    assert schedule.default_max_notebooks(2, avail_mb=22000) == 21600 // 730 == 29
    assert schedule.default_max_notebooks(64, avail_mb=22000) == 9200 // 1660 == 5
    assert schedule.default_max_notebooks(64, 2, avail_mb=22000) == 9200 // 730
    assert schedule.default_max_notebooks(8, avail_mb=1000) == 1  # at least one
    assert schedule.default_max_notebooks(2) >= 1  # this machine's /proc/meminfo


# -------------------------------------------------------------------------------------------- unit slots


def _hold_slots(folder, log, n, hold_s):
    """In a process of its own: take a slot ``n`` times, holding it ``hold_s``; append (start, end) to ``log``."""
    for _ in range(n):
        with schedule.unit_slot(folder) as slot:
            start = time.time()
            time.sleep(hold_s)
            end = time.time()
        with open(log, "a") as f:
            f.write(json.dumps([slot, start, end]) + "\n")


@pytest.mark.parametrize("slots", [1, 2])
def test_unit_slots_hold_across_processes(tmp_path, slots):
    folder = schedule.make_slots(tmp_path / "slots", slots)
    log = tmp_path / "log.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hold_slots, args=(str(folder), str(log), 3, 0.1)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    held = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(held) == 9 and {h[0] for h in held} <= {f"slot-{i:03d}" for i in range(slots)}
    for t in sorted(h[1] for h in held):  # at most `slots` held at any start
        assert sum(s <= t < e for _, s, e in held) <= slots
    if slots == 1:
        held.sort(key=lambda h: h[1])
        assert all(a[2] <= b[1] for a, b in zip(held, held[1:]))
    else:  # two at once did happen (three processes, two slots)
        assert any(sum(s <= t < e for _, s, e in held) == 2 for t in (h[1] for h in held))


def test_without_the_variable_a_unit_takes_no_slot(monkeypatch):
    monkeypatch.delenv(schedule.SLOTS_ENV, raising=False)
    with schedule.unit_slot() as slot:
        assert slot is None


def test_a_unit_records_its_cpu_time_and_stamps(tmp_path, monkeypatch):
    """``experiment._call`` (in this process): ``cpu_seconds`` counts the unit's work, its children's included once
    reaped; a sleeping unit has wall time, not CPU time; the stamps frame the unit."""
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent))
    monkeypatch.setenv(schedule.SLOTS_ENV, str(schedule.make_slots(tmp_path / "slots", 1)))
    before = time.time()
    got = experiment._call("jobfns:slow_unit", {"n": 0, "steps": 2, "step_s": 0.3, "pad": 0, "children": False},
                           str(tmp_path / "u.jsonl"))
    assert got["seconds"] >= 0.5 and got["cpu_seconds"] < 0.3
    assert before - 0.001 <= got["started_at"] <= got["ended_at"] <= time.time() + 0.001  # to the millisecond
    assert got["ended_at"] - got["started_at"] == pytest.approx(got["seconds"], abs=0.1)
    busy = experiment._call("test_schedule:_burn", {"seconds": 0.3}, str(tmp_path / "b.jsonl"))
    assert busy["cpu_seconds"] >= 0.25  # the child's CPU, counted once it was reaped


def _burn(*, seconds: float, metrics_path: str) -> dict:
    """A unit whose CPU time is spent in a child process it waits for."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", f"import time\nt = time.process_time()\nwhile time.process_time() - t < "
                                          f"{seconds}: pass"], check=True)
    return {}


# ------------------------------------------------------------------------------------ the plan from records


T0 = 1_700_000_000  # a whole second: params.json's `started` is to the second


def _stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).astimezone().strftime("%Y-%m-%dT%H:%M:%S%z")


def fake_run(root, name, stamp, *, start, seconds, groups, workers="auto", preset="tiny", status=None, cpu=None):
    """A run directory as klear run leaves it: params.json, and units/*.json per group (folder: [(start offset,
    end offset, cpu seconds)]); the `cpu` None: an older result with `seconds` only, its file's time as its end."""
    run_dir = root / name / stamp
    run_dir.mkdir(parents=True)
    (run_dir / "params.json").write_text(json.dumps({"notebook": name, "preset": preset, "params": {"workers": workers},
                                                     "started": _stamp(start), "seconds": seconds,
                                                     **({"cpu_seconds": cpu} if cpu is not None else {})}))
    if status:
        (run_dir / "status.json").write_text(json.dumps({"status": status}))
    for folder, rows in groups.items():
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
        for i, (s, e, cpu) in enumerate(rows):
            path = run_dir / folder / f"u{i}.json"
            if cpu is None:
                path.write_text(json.dumps({"seconds": e - s}))
                import os

                os.utime(path, (start + e, start + e))
            else:
                path.write_text(json.dumps({"seconds": e - s, "cpu_seconds": cpu, "started_at": start + s,
                                            "ended_at": start + e}))
    return run_dir


def test_a_recorded_run_reads_as_segments_where_its_time_was(tmp_path):
    run_dir = fake_run(tmp_path, "03_a", "20260101-000000", start=T0, seconds=20,
                       groups={"starts/units": [(2, 8, 5.5), (2, 7, 4)], "units": [(10, 15, 5)]})
    rec = schedule.read_recorded(run_dir)
    # 2 s before the first unit, the two starts (in the order they started), 8..10 between, 15..20 after
    assert rec.work.segments == (("serial", 2), ("units", (5.5, 4)), ("serial", 2), ("units", (5,)), ("serial", 5))
    assert (rec.wall, rec.outside, rec.units, rec.unit_seconds, rec.source) == (20, 9, 3, 14.5, "cpu_seconds")
    # reproduce.json's row gives the whole child's start and end instead
    rec = schedule.read_recorded(run_dir, {"start": T0 - 1, "end": T0 + 21})
    assert rec.work.segments[0] == ("serial", 3) and rec.work.segments[-1] == ("serial", 6) and rec.wall == 22
    # an older result: `seconds`, the file's time as its end
    old = fake_run(tmp_path, "04_b", "20260101-000000", start=T0, seconds=10, groups={"units": [(1, 4, None)]})
    assert schedule.read_recorded(old).work.segments == (("serial", 1), ("units", (3,)), ("serial", 6))
    assert schedule.read_recorded(old).source == "seconds"


def test_a_run_beside_others_counts_its_own_cpu_outside_units(tmp_path):
    """19 CPU-s in all, 14.5 in units: 4.5 of its own outside them where the wall-clock says 9, so beside other
    notebooks its serial parts are halved; alone (or with no CPU time recorded) they stay as measured."""
    groups = {"starts/units": [(2, 8, 5.5), (2, 7, 4)], "units": [(10, 15, 5)]}
    run_dir = fake_run(tmp_path, "03_a", "20260101-000000", start=T0, seconds=20, groups=groups, cpu=19)
    rec = schedule.read_recorded(run_dir, beside_others=True)
    assert rec.work.segments == (("serial", 1), ("units", (5.5, 4)), ("serial", 1), ("units", (5,)), ("serial", 2.5))
    assert (rec.outside, rec.outside_wall) == (4.5, 9)
    assert schedule.read_recorded(run_dir).outside == 9
    # recorded_runs finds who ran beside whom: 04_b overlaps 03_a by 5 s, 05_c starts 1 s after 03_a ended
    # (each 2 s of wall before its unit, 1 CPU-s of its own)
    fake_run(tmp_path, "04_b", "20260101-000000", start=T0 + 15, seconds=10, groups={"units": [(2, 10, 1)]}, cpu=2)
    fake_run(tmp_path, "05_c", "20260101-000000", start=T0 + 26, seconds=10, groups={"units": [(2, 10, 1)]}, cpu=2)
    got = schedule.recorded_runs(tmp_path)
    assert (got["03_a"].outside, got["04_b"].outside, got["05_c"].outside) == (4.5, 1, 2)


def test_plan_on_a_recorded_tree(tmp_path, capsys, monkeypatch):
    """Three notebooks and the report: b after a (as 04 after 03). Hand-computed, b after a: a = 1 + units 4,4,2
    + 1; b = units 3,3; c = units 6; the report 2 s serial, after all."""
    monkeypatch.setattr(schedule, "AFTER", {"02_b": ("01_a",)})
    out = tmp_path / "outputs"
    fake_run(out, "01_a", "20260101-000000", start=T0, seconds=11, groups={"units": [(1, 5, 4), (1, 5, 4),
                                                                                      (5, 10, 2)]})
    fake_run(out, "01_a", "20250101-000000", start=T0, seconds=99, groups={})  # older: not read
    fake_run(out, "01_a", "20270101-000000", start=T0, seconds=99, groups={}, status="failed")  # failed: not read
    fake_run(out, "02_b", "20260101-000000", start=T0, seconds=3, groups={"units": [(0, 3, 3), (0, 3, 3)]})
    fake_run(out, "03_c", "20260101-000000", start=T0, seconds=6, groups={"units": [(0, 6, 6)]})
    fake_run(out, "00_report", "20260101-000000", start=T0, seconds=2, groups={})
    recorded = schedule.recorded_runs(out)
    assert recorded["01_a"].work.segments == (("serial", 1), ("units", (4, 4, 2)), ("serial", 1))
    data = schedule.plan(recorded, [1, 2, 4])
    by = {r["cores"]: r for r in data["rows"]}
    # one after another, 1 core: a 1+10+1 = 12, b 6, c 6, report 2 = 26; 2 cores: a 1+6+1 = 8, b 3, c 6, 2 = 19
    assert (by[1]["one_after_another_s"], by[2]["one_after_another_s"]) == (26, 19)
    # one pool, 1 core: a (rank 11 + b 3 + report 2) and c start at 0; c's 6 takes the slot while a is in its first
    # second; a's units 6..16, its tail 16..17, b 17..23, the report 23..25
    assert by[1]["one_pool_s"] == 25
    # 2 cores: c 0..6; a's first 4 at 1..5, its second 5..9 (first come: it waited since 1), its 2 at 6..8; a ends
    # 10, b 10..13, the report 13..15
    assert by[2]["one_pool_s"] == 15
    # 4 cores: a's three units at 1..5, a ends 6, b 6..9, the report 9..11: the longest chain (a, b, report)
    assert by[4]["one_pool_s"] == 11 == by[4]["critical_path_s"]
    assert data["after"] == {"02_b": ["01_a"], "00_report": ["01_a", "02_b", "03_c"]}
    assert data["notebooks"]["01_a"]["outside_units_s"] == 2  # 1 s before its units, 1 s after, of its 11 s

    monkeypatch.chdir(tmp_path)
    dirs = ["--output-root", str(out), "--notebooks-dir", str(tmp_path), "--params-dir", str(tmp_path)]
    assert cli.main(["reproduce", "--plan", "--cores", "1", "2", *dirs]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[0] == "cores"
    assert [line.split()[:3] for line in lines[2:4]] == [["1", "26s", "25s"], ["2", "19s", "15s"]]
    # all work / cores: (22 s of units + 1 + 1 + 2 outside them) / cores
    assert [line.split()[-1] for line in lines[2:4]] == ["26s", "13s"] and len(lines) == 5
    assert cli.main(["reproduce", "--plan", "--preset", "gpu", *dirs]) == 2
    assert "no finished run with the 'gpu' preset" in capsys.readouterr().err
    assert cli.main(["reproduce", "--plan", "--output-root", str(tmp_path / "empty"), *dirs[2:]]) == 2


# --------------------------------------------------------------------------------- a real reproduce


def fake_notebooks(tmp_path):
    """Notebooks 10_a, 20_b (after 10_a), 30_c with two units each (95_units: each unit writes 3 records 0.2 s
    apart), 15_fails (98_fails: raises), 40_d (95_units, after 15_fails) and 50_bad (96_checked with a value its
    config cell refuses); the smoke preset for each."""
    nbs, params = tmp_path / "nb", tmp_path / "params"
    nbs.mkdir()
    units_nb = FIXTURES / "units" / "nb" / "95_units.ipynb"
    for name in ("10_a", "20_b", "30_c", "40_d"):
        shutil.copy(units_nb, nbs / f"{name}.ipynb")
        (params / name).mkdir(parents=True)
        (params / name / "smoke.yaml").write_text("steps: 3\nstep_s: 0.2\nworkers: 2\n")
    shutil.copy(FIXTURES / "nb" / "98_fails.ipynb", nbs / "15_fails.ipynb")
    (params / "15_fails").mkdir()
    shutil.copy(FIXTURES / "params" / "98_fails" / "smoke.yaml", params / "15_fails" / "smoke.yaml")
    shutil.copy(FIXTURES / "nb" / "96_checked.ipynb", nbs / "50_bad.ipynb")  # its config cell refuses lr <= 0
    (params / "50_bad").mkdir()
    (params / "50_bad" / "smoke.yaml").write_text("lr: -1.0e-3\n")
    return ["--notebooks-dir", str(nbs), "--params-dir", str(params), "--output-root", str(tmp_path / "out")]


@pytest.mark.slow
def test_reproduce_on_one_slot_orders_by_the_graph_and_skips_after_a_failure(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(schedule, "AFTER", {"20_b": ("10_a",), "40_d": ("15_fails",)})
    dirs = fake_notebooks(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["reproduce", "--preset", "smoke", "--cores", "1", *dirs]) == 1
    captured = capsys.readouterr()
    log = json.loads((out / "reproduce.json").read_text())
    rows = {r["notebook"]: r for r in log["rows"]}
    assert {n: r["status"] for n, r in rows.items()} == {"10_a": "ran", "15_fails": "FAILED", "20_b": "ran",
                                                         "30_c": "ran", "40_d": "skipped", "50_bad": "ERROR"}
    assert "15_fails FAILED" in rows["40_d"]["message"] and log["cores"] == 1
    assert "lr must be > 0, got -0.001" in rows["50_bad"]["message"] and not (out / "50_bad").exists()
    assert rows["20_b"]["start"] >= rows["10_a"]["end"]  # after its prerequisite
    assert "2 of 6 notebooks failed: 15_fails, 50_bad" in captured.err
    assert "1 skipped after a failure: 40_d" in captured.err
    assert "[10_a] " in captured.err  # the children's lines, by notebook
    # the slot: no two units of any notebooks overlapped (their own stamps), though 10_a and 30_c ran side by side
    stamps = []
    for name in ("10_a", "20_b", "30_c"):
        for path in (pathlib.Path(rows[name]["run_dir"]) / "units").glob("*.json"):
            got = json.loads(path.read_text())
            stamps.append((got["started_at"], got["ended_at"], name))
            assert got["cpu_seconds"] < got["seconds"]  # the units sleep
    stamps.sort()
    assert len(stamps) == 6 and all(a[1] <= b[0] for a, b in zip(stamps, stamps[1:]))
    assert rows["30_c"]["start"] < rows["10_a"]["end"]  # the notebooks themselves did run at once
    # the table, then the card, then the plan (also in plan.json) from these runs
    table = captured.out.splitlines()
    assert [row.split()[:2] for row in table[1:8]] == [["10_a", "ran"], ["15_fails", "FAILED"], ["20_b", "ran"],
                                                       ["30_c", "ran"], ["40_d", "skipped"], ["50_bad", "ERROR"],
                                                       ["report", "ran"]]
    plan = json.loads((out / "plan.json").read_text())
    assert sorted(plan["notebooks"]) == ["10_a", "20_b", "30_c"] and plan["after"] == {"20_b": ["10_a"]}
    assert [r["cores"] for r in plan["rows"]] == [1, 2, 4, 8, 16, 64]
    assert all(plan["notebooks"][n]["units"] == 2 and plan["notebooks"][n]["unit_time"] == "cpu_seconds"
               for n in plan["notebooks"])
    assert "one after another" in captured.out and captured.out.index("one after another") > table.index(
        next(line for line in table if line.startswith("total: ")))
    # --plan reads the same tree; a second reproduce without the failure exits 0
    assert cli.main(["reproduce", "--plan", "--cores", "1", *dirs]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[0] == "1"
    for name in ("15_fails", "30_c", "40_d", "50_bad"):
        shutil.rmtree(tmp_path / "params" / name)
    assert cli.main(["reproduce", "--preset", "smoke", "--cores", "2", "--max-notebooks", "1", *dirs]) == 0
    capsys.readouterr()
    log = json.loads((out / "reproduce.json").read_text())
    assert [r["status"] for r in log["rows"]] == ["ran", "ran"] and log["rows"][1]["start"] >= log["rows"][0]["end"]


def test_reproduce_refuses_several_core_counts_without_plan(tmp_path, capsys):
    dirs = fake_notebooks(tmp_path)
    assert cli.main(["reproduce", "--preset", "smoke", "--cores", "1", "2", *dirs]) == 2
    assert "give --cores N once" in capsys.readouterr().err


def _marked(mark: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``KLEAR_TEST_SCHEDULE_MARK=mark``."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"KLEAR_TEST_SCHEDULE_MARK={mark}".encode() in (entry / "environ").read_bytes().split(b"\0") and \
                    experiment.identity_alive(entry.name):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_interrupting_or_killing_reproduce_ends_every_child(tmp_path, how):
    """A real `klear reproduce` in a subprocess with two notebooks whose units sleep: Ctrl-C (SIGINT to it alone)
    or SIGKILL once their units run. Every process it started ends (kernels and workers included) and each run is
    recorded interrupted; on Ctrl-C, reproduce exits 130 with the rows marked interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import uuid

    from test_cli import as_from_a_terminal

    dirs = fake_notebooks(tmp_path)
    for name in ("15_fails", "20_b", "40_d", "50_bad"):
        shutil.rmtree(tmp_path / "params" / name)
    for name in ("10_a", "30_c"):
        (tmp_path / "params" / name / "smoke.yaml").write_text("steps: 200\nstep_s: 0.5\nworkers: 1\n")
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "klear_lib.cli", "reproduce", "--preset", "smoke", "--cores", "2",
                             *dirs], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "KLEAR_TEST_SCHEDULE_MARK": mark}, preexec_fn=as_from_a_terminal)
    out = tmp_path / "out"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(list(out.glob("*/*/units/*.jsonl"))) < 2:
        time.sleep(0.5)
    assert len(list(out.glob("*/*/units/*.jsonl"))) == 2, "the units never started"
    proc.send_signal(getattr(signal, how))
    _, err = proc.communicate(timeout=120)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _marked(mark):
        time.sleep(0.5)
    assert _marked(mark) == []
    for name in ("10_a", "30_c"):
        [run_dir] = (out / name).iterdir()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (run_dir / "status.json").is_file():
            time.sleep(0.2)
        assert json.loads((run_dir / "status.json").read_text())["status"] == "interrupted", name
    if how == "SIGINT":
        assert proc.returncode == 130, err[-2000:]
        log = json.loads((out / "reproduce.json").read_text())
        assert [(r["notebook"], r["status"]) for r in log["rows"]] == [("10_a", "interrupted"),
                                                                       ("30_c", "interrupted")]
    else:
        assert proc.returncode == -signal.SIGKILL


def test_the_card_states_the_plans_predictions(tmp_path, monkeypatch):
    """The report card's time line (issue 46), from plan.json: per number of cores the larger of the one-pool
    makespan and all the work over the cores. The tree of test_plan_on_a_recorded_tree: one pool 15 s on 2 cores
    against all work (units 22 s, the notebooks' own 4 s) / 2 = 13 s; 11 s (the longest chain) from 4 cores on."""
    from klear_lib import report, report_data

    monkeypatch.setattr(schedule, "AFTER", {"02_b": ("01_a",)})
    out = tmp_path / "outputs"
    fake_run(out, "01_a", "20260101-000000", start=T0, seconds=11, groups={"units": [(1, 5, 4), (1, 5, 4),
                                                                                      (5, 10, 2)]})
    fake_run(out, "02_b", "20260101-000000", start=T0, seconds=3, groups={"units": [(0, 3, 3), (0, 3, 3)]})
    fake_run(out, "03_c", "20260101-000000", start=T0, seconds=6, groups={"units": [(0, 6, 6)]})
    fake_run(out, "00_report", "20260101-000000", start=T0, seconds=2, groups={})
    assert report_data.plan_rows(out) is None  # no plan.json: the card says nothing of a plan
    schedule.write_plan(out, schedule.plan(schedule.recorded_runs(out)))  # as klear reproduce does before its report
    rows = report_data.plan_rows(out)
    assert [(r["cores"], r["predicted_s"]) for r in rows] == [(2, 15), (4, 11), (8, 11), (16, 11), (64, 11)]
    (out / "plan.json").write_text("{")  # damaged: a warning, no line
    with pytest.warns(UserWarning, match="cannot be read as a plan"):
        assert report_data.plan_rows(out) is None
    card = report_data.make_card({}, report_data.gather_claims({}), log={"total_s": 30.0}, plan=rows)
    card = dataclasses.replace(card, wall_seconds=30.0)
    text = report.time_text(card)
    assert ("predicted on 2 / 4 / 8 / 16 / 64 cores" in text
            and " / ".join(report.duration(s) for s in (15, 11, 11, 11, 11)) in text), text
    assert "summed" not in text  # the runs' walls add up to reproduce's own: one after another
    text = report.time_text(dataclasses.replace(card, wall_seconds=60.0))
    assert text.startswith("1 min 00 s wall-clock over 0 runs, summed (they ran side by side in one schedule)"), text
    assert "klear reproduce 30 s in all" in text
