"""Progress inside units (klear_lib.experiment.UnitProgress): the parent reads the records the units write as they
go, and shows per unit its rollouts done out of its budget with the rollout's reward, the fork probe and the last
held-out avg@n; in JupyterLab as tqdm widgets (one bar per running unit, one for the units, whose ETA is the mean
time per unit done), elsewhere as plain lines, throttled."""

from __future__ import annotations

import re

from klear_lib import experiment


def jobs(n=2, rollouts=3, delay=1.0):
    # the parent polls the records every second: a record a second apart is seen before the unit ends, however
    # slowly the machine runs the parent
    return [experiment.Job(f"arm{i}/seed=0", "jobfns:fake_rollouts",
                           {"rollouts": rollouts, "delay": delay, "config": {"rollouts": rollouts}}) for i in range(n)]


def test_plain_lines_show_rollouts_reward_and_probe_before_the_unit_is_done(tmp_path):
    lines = []
    experiment.run_jobs(jobs(), tmp_path, workers=2, progress=lines.append, bars="lines", progress_every_s=0.0)
    for key in ("arm0/seed=0", "arm1/seed=0"):
        mine = [i for i, line in enumerate(lines) if line.strip().startswith(key)]
        done = next(i for i, line in enumerate(lines) if f"] {key} done in" in line)
        counts = [int(re.search(r"\| *(\d)/3 ", lines[i])[1]) for i in mine]
        assert counts and counts == sorted(counts) and counts[-1] == 3, (key, [lines[i] for i in mine])
        assert min(mine) < done, "a line inside the unit, before its done line"
        last = lines[mine[-1]]
        assert "reward 0.750" in last and "p_fork 0.500" in last and "eval 0.300" in last, last


def test_lines_are_throttled_per_unit_and_end_on_the_last_rollout(tmp_path):
    lines = []
    experiment.run_jobs(jobs(n=1, rollouts=4), tmp_path, workers=1, progress=lines.append, bars="lines",
                        progress_every_s=60.0)
    mine = [line for line in lines if line.strip().startswith("arm0/seed=0")]
    assert len(mine) == 2 and "4/4" in mine[-1], lines  # the first line, then only the end (60 s throttle)


class FakeBar:
    made: list = []

    def __init__(self, total=None, initial=0, desc="", **kwargs):
        self.total, self.n, self.desc, self.kwargs, self.closed, self.postfix = total, initial, desc, kwargs, False, ""
        self.updates = []
        FakeBar.made.append(self)

    def update(self, k=1):
        self.n += k

    def set_postfix_str(self, text, refresh=True):
        self.postfix = text

    def refresh(self):
        self.updates.append(self.n)

    def close(self):
        self.closed = True


def test_widget_bars_one_per_unit_and_one_for_the_units(tmp_path):
    FakeBar.made = []
    todo = jobs(n=2, rollouts=3, delay=0.3)
    live = experiment.UnitProgress(todo, tmp_path, mode="widgets", done=1, total=3, bar=FakeBar)
    overall = FakeBar.made[0]
    assert (overall.total, overall.n, overall.kwargs["smoothing"]) == (3, 1, 0)  # the ETA from units done
    # run the units without run_jobs' own bars, polling as run_jobs does
    import concurrent.futures as cf
    import multiprocessing

    (tmp_path / "units").mkdir()
    with cf.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(experiment._call, j.fn, j.kwargs, str(tmp_path / "units" / f"{j.slug}.jsonl"),
                               j.key): j for j in todo}
        for fut in experiment._as_completed(futures, live.poll, every_s=0.1):
            live.finished(futures[fut])
    bars = {b.desc: b for b in FakeBar.made[1:]}
    assert set(bars) == {"arm0/seed=0", "arm1/seed=0"}
    for bar in bars.values():
        assert bar.total == 3 and bar.closed and bar.n == 3
        assert any(0 < n < 3 for n in bar.updates), bar.updates  # it moved while the unit ran
        assert "reward" in bar.postfix and "p_fork 0.500" in bar.postfix
    assert overall.n == 3
    live.close()
    assert overall.closed
