"""One schedule for ``klear reproduce``: its notebooks run at once, as child processes, over one pool of unit slots;
and ``klear reproduce --plan``, the wall-clock that schedule predicts for a number of cores from recorded times.

Why: inside a notebook the heavy work is units (``klear_lib.experiment.run_jobs``), and each notebook ends on a
barrier, its last unit. Run one after another, the notebooks leave cores idle at every tail (issue 46: on 64 cores
the unit times of a ``tiny`` reproduce predicted 1,064 s where the longest chain of work allows about 430 s). At
``smoke`` on a shared 2-core machine (2026-12-07, three pairs): 207, 203, 275 s of wall-clock one after another,
175, 163, 215 s in one pool (0.78-0.84x), with 1.16x the CPU time (the notebooks' kernels beside each other).

The pieces:

- ``AFTER``, the dependency graph (the one place it lives): 04 and 06 start from 03's SFT starts (the warm-start
  cache, ``klear_lib.train.sft.arithmetic_warm_start``), so they start once 03 has built them; the report notebook
  (``00_*``) runs last, after all (``dependencies``).
- Unit slots: ``klear reproduce`` makes a folder of N slot files (N = the cores, ``--cores``) and names it in
  ``KLEAR_UNIT_SLOTS`` for its children. A worker takes a slot (``fcntl.flock``) before a unit and gives it back
  after (``unit_slot``, in ``experiment._call``), so at most N units run at once across all notebooks, and a
  notebook's tail leaves its cores to the next. Without the variable (``klear run``, the tests, a notebook by hand)
  nothing changes.
- ``run_notebooks``: each notebook is exactly what ``klear run <nb> --preset P`` does (``runner.run_notebook``, in a
  child process: ``python -m klear_lib.schedule``), started once what it depends on ran, longest expected first;
  its lines on stderr prefixed with its name. A notebook that fails stops only those that depend on it (skipped,
  with why). The children watch ``klear reproduce`` by identity (``KLEAR_RUN_OWNER``, as workers watch
  ``klear run``) and end as if interrupted when it is gone; Ctrl-C ends them all.
- ``plan``: list scheduling of the recorded units (``cpu_seconds``, else ``seconds``) over the graph, for each
  number of cores, beside the prediction for the notebooks one after another; ``plan_table`` prints it,
  ``write_plan`` writes ``<output root>/plan.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import heapq
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from klear_lib.slots import QUEUE_FILE, SLOT_POLL_S, SLOTS_ENV, make_slots, unit_slot  # noqa: F401 (re-exported)

AFTER: dict[str, tuple[str, ...]] = {  # notebook -> the notebooks that must have run before it starts
    "04_erc_bounds": ("03_rl_clip_variants",),  # its seeds' SFT starts are 03's (the warm-start cache)
    "06_sft_loss_alpha": ("03_rl_clip_variants",),  # likewise
}
REPORT_PREFIX = "00_"  # the report notebook: after every other (as runner.REPORT_PREFIX)
PLAN_FILE = "plan.json"
PLAN_CORES = (2, 4, 8, 16, 64)
INTERRUPT_GRACE_S = 60.0  # after Ctrl-C, how long the children may take to record that they were interrupted


# ---------------------------------------------------------------------------------------- the dependency graph


def dependencies(names: Iterable[str], after: Mapping[str, Iterable[str]] | None = None) -> dict[str, set[str]]:
    """Each of ``names``' prerequisites among ``names``: ``after`` (default ``AFTER``) where both ends are there, and
    for a report notebook (``00_*``) every other one. ValueError on a cycle."""
    names = list(names)
    after = AFTER if after is None else after
    deps = {n: {d for d in after.get(n, ()) if d in names and d != n} for n in names}
    for n in names:
        if n.startswith(REPORT_PREFIX):
            deps[n] = {m for m in names if m != n and not m.startswith(REPORT_PREFIX)}
    order = topological(deps)
    if len(order) != len(names):
        raise ValueError(f"the notebooks' dependencies have a cycle among {sorted(set(names) - set(order))}")
    return deps


def topological(deps: Mapping[str, set[str]]) -> list[str]:
    """The names in an order where each comes after its prerequisites (name order among the free ones); the names
    on a cycle are left out."""
    left, order = {n: set(d) for n, d in deps.items()}, []
    while True:
        free = sorted(n for n, d in left.items() if not d)
        if not free:
            return order
        for n in free:
            order.append(n)
            del left[n]
        for d in left.values():
            d.difference_update(free)


# ------------------------------------------------------------------------------------------- the list scheduler


@dataclasses.dataclass(frozen=True)
class Work:
    """One notebook as the scheduler sees it: ``segments`` in order, each ``("serial", seconds)`` (the kernel's own
    work: no unit slot) or ``("units", (seconds, ...))`` (one ``run_jobs``: its units in their order, one slot each,
    at most ``workers`` at a time, then a barrier). ``workers`` None: ``auto``, the cores."""

    name: str
    segments: tuple = ()
    workers: int | None = None

    @property
    def unit_seconds(self) -> float:
        return sum(sum(v) for k, v in self.segments if k == "units")

    @property
    def serial_seconds(self) -> float:
        return sum(v for k, v in self.segments if k == "serial")


@dataclasses.dataclass
class Schedule:
    """``simulate``'s answer: the makespan, each notebook's start and end, and every unit as (notebook, start,
    end)."""

    makespan: float
    start: dict[str, float]
    end: dict[str, float]
    units: list = dataclasses.field(default_factory=list)


def upward_rank(works: Mapping[str, Work], deps: Mapping[str, set[str]],
                length: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each notebook's expected length (``length``, default its serial + unit seconds) plus the longest chain of
    notebooks that wait for it: the order in which ready notebooks start (longest first)."""
    own = {n: (length or {}).get(n, w.serial_seconds + w.unit_seconds) for n, w in works.items()}
    after_me = {n: [m for m, d in deps.items() if n in d and m in works] for n in works}
    rank: dict[str, float] = {}

    def of(n: str, seen: frozenset = frozenset()) -> float:
        if n not in rank:
            rank[n] = own[n] + max((of(m, seen | {n}) for m in after_me[n] if m not in seen), default=0.0)
        return rank[n]

    for n in works:
        of(n)
    return rank


def simulate(works: Mapping[str, Work], deps: Mapping[str, Iterable[str]], cores: int, *,
             max_notebooks: int | None = None, rank: Mapping[str, float] | None = None) -> Schedule:
    """List scheduling of ``works`` on ``cores`` unit slots, as ``klear reproduce`` runs them: a notebook starts when
    its prerequisites (``deps``; those not in ``works`` are ignored) have ended and fewer than ``max_notebooks`` run
    (None: no cap), the ready ones in ``rank`` order (default ``upward_rank``), highest first, then by name; its
    segments run in order; a units segment hands its units, in order, to its ``workers`` (the cores when None),
    each of which waits for a free slot; waiting workers get slots first come, first served (ties: higher rank).
    Serial segments take no slot. Returns the makespan and each notebook's start and end."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    deps = {n: {d for d in deps.get(n, ()) if d in works} for n in works}
    rank = dict(rank) if rank is not None else upward_rank(works, deps)
    seq = iter(range(10**12))
    events: list = []  # (time, seq, name): a serial segment or a unit of `name` ends
    waiters: list = []  # (time it began waiting, -rank, seq, name): a worker waiting for a slot
    state = {n: {"seg": -1, "pending": deque(), "left": 0, "waiting": 0} for n in works}
    unstarted, done, running = set(works), set(), set()
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    trace: list = []
    free = cores

    def enter_next(name: str, t: float) -> None:
        st, segments = state[name], works[name].segments
        while True:
            st["seg"] += 1
            if st["seg"] >= len(segments):
                running.discard(name)
                done.add(name)
                end[name] = t
                return
            kind, value = segments[st["seg"]]
            if kind == "serial":
                heapq.heappush(events, (t + float(value), next(seq), name))
                return
            units = [float(v) for v in value]
            if units:
                st["pending"], st["left"] = deque(units), len(units)
                limit = min(works[name].workers or cores, cores)
                for _ in range(min(limit, len(units))):
                    add_waiter(name, t)
                return

    def add_waiter(name: str, t: float) -> None:
        state[name]["waiting"] += 1
        heapq.heappush(waiters, (t, -rank.get(name, 0.0), next(seq), name))

    t = 0.0
    while True:
        started = True
        while started:  # a notebook with nothing in it ends at once, and may free others at this same time
            started = False
            for name in sorted((n for n in unstarted if deps[n] <= done), key=lambda n: (-rank.get(n, 0.0), n)):
                if max_notebooks is not None and len(running) >= max_notebooks:
                    break
                unstarted.discard(name)
                running.add(name)
                start[name] = t
                enter_next(name, t)
                started = True
        while free > 0 and waiters:
            _, _, _, name = heapq.heappop(waiters)
            st = state[name]
            st["waiting"] -= 1
            free -= 1
            seconds = st["pending"].popleft()
            trace.append((name, t, t + seconds))
            heapq.heappush(events, (t + seconds, next(seq), name))
        if not events:
            if unstarted:  # only a cycle leaves notebooks that never become ready
                raise ValueError(f"cannot schedule {sorted(unstarted)}: their prerequisites never end")
            break
        t = events[0][0]
        while events and events[0][0] == t:
            _, _, name = heapq.heappop(events)
            st = state[name]
            if works[name].segments[st["seg"]][0] == "serial":
                enter_next(name, t)
                continue
            free += 1
            st["left"] -= 1
            if len(st["pending"]) > st["waiting"]:  # the worker takes the next unit and waits for a slot
                add_waiter(name, t)
            if st["left"] == 0:
                enter_next(name, t)
    return Schedule(max(end.values(), default=0.0), start, end, trace)


def one_after_another(works: Mapping[str, Work], deps: Mapping[str, Iterable[str]], cores: int) -> float:
    """The wall-clock of the notebooks run one at a time (``klear reproduce`` before one schedule): each alone on
    ``cores``, in an order that respects ``deps``."""
    order = topological({n: {d for d in deps.get(n, ()) if d in works} for n in works})
    return sum(simulate({n: works[n]}, {}, cores).makespan for n in order)


def critical_path(works: Mapping[str, Work], deps: Mapping[str, Iterable[str]]) -> float:
    """The longest chain of work: the makespan with a core for every unit."""
    cores = max(1, sum(len(v) for w in works.values() for k, v in w.segments if k == "units"))
    return simulate({n: dataclasses.replace(w, workers=None) for n, w in works.items()}, deps, cores).makespan


# ------------------------------------------------------------------------------------------- recorded runs


_STAMP = re.compile(r"(\d{8}-\d{6})(?:-(\d+))?")


def _stamp_key(stamp: str) -> tuple:
    m = _STAMP.fullmatch(stamp)
    return (m[1], int(m[2] or 1)) if m else ("", 0)


def _read_json(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
        value) else None


def latest_runs(output_root: str | os.PathLike, preset: str | None = None) -> dict[str, pathlib.Path]:
    """The latest finished run directory of each notebook under ``output_root`` (``<notebook>/<stamp>/`` with a
    ``params.json`` that records its ``seconds`` and no ``status.json``: not failed, not interrupted), of ``preset``
    when given."""
    root, found = pathlib.Path(output_root), {}
    if not root.is_dir():
        return {}
    for nb_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        best = None
        for run_dir in nb_dir.iterdir():
            if not (run_dir.is_dir() and _STAMP.fullmatch(run_dir.name)) or (run_dir / "status.json").exists():
                continue
            record = _read_json(run_dir / "params.json")
            if not isinstance(record, dict) or _num(record.get("seconds")) is None:
                continue
            if preset is not None and record.get("preset") != preset:
                continue
            if best is None or _stamp_key(run_dir.name) > _stamp_key(best.name):
                best = run_dir
        if best is not None:
            found[nb_dir.name] = best
    return found


def _reproduce_rows(output_root: pathlib.Path) -> dict[str, dict]:
    """reproduce.json's rows by run directory (their ``start`` and ``end``, Unix seconds, where recorded)."""
    log = _read_json(output_root / "reproduce.json")
    rows = log.get("rows") if isinstance(log, dict) else None
    return {str(r["run_dir"]): r for r in rows or () if isinstance(r, dict) and r.get("run_dir")}


def last_reproduce_preset(output_root: str | os.PathLike) -> str | None:
    """The preset of the last ``klear reproduce`` into ``output_root`` (its reproduce.json), or None."""
    log = _read_json(pathlib.Path(output_root) / "reproduce.json")
    preset = log.get("preset") if isinstance(log, dict) else None
    return preset if isinstance(preset, str) else None


def _parse_time(text: Any) -> float | None:
    try:
        return datetime.datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


@dataclasses.dataclass
class Recorded:
    """What a run directory says about its notebook's time: ``work`` (the scheduler's shape), its wall-clock, its
    time outside units, and which unit time it used (``cpu_seconds``, ``seconds``, or ``mixed``)."""

    work: Work
    run_dir: pathlib.Path
    preset: str | None
    wall: float
    outside: float
    units: int
    unit_seconds: float
    source: str
    outside_wall: float = 0.0  # the wall-clock outside units, before the CPU time bounded it


def read_recorded(run_dir: str | os.PathLike, row: Mapping | None = None, *,
                  beside_others: bool = False) -> Recorded | None:
    """A run directory as the scheduler's ``Work``, or None without a ``params.json`` with ``seconds``.

    The units: every ``units/*.json`` below the run directory (each ``run_jobs`` writes its own ``units/``), each
    with its ``cpu_seconds`` (else ``seconds``) and its start and end (``started_at``/``ended_at``; for results
    written before they were recorded, the file's time as the end, less ``seconds``). One ``units/`` folder is one
    segment of units in the order they started; the folders in the order they started (overlapping ones merged).
    The time outside units is where it was found: the wall-clock before the first segment's first unit started,
    between one segment's last end and the next one's first start, and after the last end. The notebook's start and
    end are its reproduce.json row's (``row``: ``start``/``end``, the whole ``klear run`` child), else params.json's
    ``started`` (to the second) and ``seconds``. A run ``beside_others`` (klear reproduce ran other notebooks in its
    time) measured their work too in its wall-clock (01 at smoke on 2 cores: 100 s outside its units, 14 CPU-s):
    where its CPU time outside its units (params.json's ``cpu_seconds`` less the units') is less, its serial parts
    shrink to it. A run alone keeps its wall-clock (waits included)."""
    run_dir = pathlib.Path(run_dir)
    record = _read_json(run_dir / "params.json")
    if not isinstance(record, dict) or _num(record.get("seconds")) is None:
        return None
    wall = _num(record.get("seconds"))
    t0 = _num((row or {}).get("start"))
    t1 = _num((row or {}).get("end"))
    if t0 is not None and t1 is not None and t1 >= t0:
        wall = t1 - t0
    else:
        t0 = _parse_time(record.get("started"))
    workers = (record.get("params") or {}).get("workers")
    workers = workers if isinstance(workers, int) and not isinstance(workers, bool) else None
    groups: dict[pathlib.Path, list] = {}
    kinds = set()
    for folder in sorted(run_dir.rglob("units")):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            result = _read_json(path)
            if not isinstance(result, dict) or _num(result.get("seconds")) is None:
                continue
            seconds = _num(result["seconds"])
            cpu = _num(result.get("cpu_seconds"))
            kinds.add("cpu_seconds" if cpu is not None else "seconds")
            ended = _num(result.get("ended_at"))
            if ended is None:
                with contextlib.suppress(OSError):
                    ended = path.stat().st_mtime
            started = _num(result.get("started_at"))
            started = started if started is not None else (ended - seconds if ended is not None else None)
            groups.setdefault(folder, []).append((started, ended, cpu if cpu is not None else seconds))
    spans = []  # [first start, last end, [(start, seconds), ...]] per units folder, merged where they overlap
    for units in groups.values():
        known = [u for u in units if u[0] is not None and u[1] is not None]
        first = min((u[0] for u in known), default=None)
        last = max((u[1] for u in known), default=None)
        spans.append([first, last, units])
    spans.sort(key=lambda s: (s[0] is None, s[0] or 0.0))
    merged: list = []
    for span in spans:
        if merged and None not in (span[0], merged[-1][1]) and span[0] < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], span[1])
            merged[-1][2] = merged[-1][2] + span[2]
        else:
            merged.append(span)
    segments: list = []
    timed = t0 is not None and all(None not in (first, last) for first, last, _ in merged)
    outside = 0.0
    if timed:
        clock = t0
        for first, last, units in merged:
            segments += [("serial", max(0.0, first - clock)),
                         ("units", tuple(u[2] for u in sorted(units, key=lambda u: u[0])))]
            outside += max(0.0, first - clock)
            clock = max(clock, last)
        segments.append(("serial", max(0.0, t0 + wall - clock)))
        outside += max(0.0, t0 + wall - clock)
    else:  # no start or end known: what the units' spans do not cover, half before them, half after
        covered = sum(last - first for first, last, _ in merged if None not in (first, last))
        outside = max(0.0, wall - covered)
        segments = [("serial", outside / 2), *(("units", tuple(u[2] for u in units)) for _, _, units in merged),
                    ("serial", outside / 2)]
    outside_wall = outside
    cpu = _num(record.get("cpu_seconds"))
    unit_total = sum(u[2] for s in merged for u in s[2])
    if beside_others and cpu is not None and outside > 0 and 0.0 <= cpu - unit_total < outside:
        scale = (cpu - unit_total) / outside
        segments = [(k, v * scale) if k == "serial" else (k, v) for k, v in segments]
        outside *= scale
    name = run_dir.parent.name
    work = Work(name, tuple(s for s in segments if not (s[0] == "serial" and s[1] <= 0.0)), workers)
    return Recorded(work, run_dir, record.get("preset"), wall, outside, sum(len(s[2]) for s in merged),
                    work.unit_seconds, "mixed" if len(kinds) > 1 else (kinds.pop() if kinds else "none"),
                    outside_wall)


def recorded_runs(output_root: str | os.PathLike, preset: str | None = None,
                  run_dirs: Mapping[str, pathlib.Path] | None = None) -> dict[str, Recorded]:
    """``read_recorded`` of each notebook's latest finished run (``latest_runs``), or of ``run_dirs``."""
    root = pathlib.Path(output_root)
    rows = _reproduce_rows(root)
    chosen = run_dirs if run_dirs is not None else latest_runs(root, preset)
    spans = {n: _span(d, rows.get(str(d))) for n, d in chosen.items()}
    out = {}
    for name, run_dir in sorted(chosen.items()):
        mine = spans[name]
        beside = mine is not None and any(  # by more than a second: params.json's start is to the second
            o is not None and min(o[1], mine[1]) - max(o[0], mine[0]) > 1.0 for n, o in spans.items() if n != name)
        rec = read_recorded(run_dir, rows.get(str(run_dir)), beside_others=beside)
        if rec is not None:
            out[name] = rec
    return out


def _span(run_dir: pathlib.Path, row: Mapping | None) -> tuple[float, float] | None:
    """When a run ran: its reproduce.json row's start and end, else params.json's start and seconds."""
    t0, t1 = _num((row or {}).get("start")), _num((row or {}).get("end"))
    if t0 is not None and t1 is not None:
        return t0, t1
    record = _read_json(run_dir / "params.json")
    if not isinstance(record, dict):
        return None
    t0, seconds = _parse_time(record.get("started")), _num(record.get("seconds"))
    return (t0, t0 + seconds) if None not in (t0, seconds) else None


# ------------------------------------------------------------------------------------------------- the plan


def plan(recorded: Mapping[str, Recorded], cores: Sequence[int] = PLAN_CORES, *, max_notebooks: int | None = None,
         after: Mapping[str, Iterable[str]] | None = None) -> dict:
    """The predicted wall-clock for each number of ``cores``: the notebooks one after another (``one_after_another``)
    and in one pool (``simulate``), beside the longest chain of work (``critical_path``) and the units' work shared
    by the cores. JSON-able: what ``write_plan`` writes to plan.json."""
    works = {n: r.work for n, r in recorded.items()}
    deps = dependencies(works, after)
    rank = upward_rank(works, deps, {n: r.wall for n, r in recorded.items()})
    chain = critical_path(works, deps)
    rows = []
    for n in cores:
        pool = simulate(works, deps, n, max_notebooks=max_notebooks, rank=rank)
        serial = one_after_another(works, deps, n)
        rows.append({"cores": n, "one_after_another_s": round(serial, 1), "one_pool_s": round(pool.makespan, 1),
                     "critical_path_s": round(chain, 1),
                     "unit_work_per_core_s": round(sum(w.unit_seconds for w in works.values()) / n, 1),
                     "all_work_per_core_s": round(sum(w.unit_seconds + w.serial_seconds for w in works.values()) / n,
                                                  1)})
    return {
        "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "presets": sorted({str(r.preset) for r in recorded.values()}),
        "unit_time": sorted({r.source for r in recorded.values()} - {"none"}),
        "after": {n: sorted(d) for n, d in deps.items() if d},
        "max_notebooks": max_notebooks,
        "notebooks": {n: {"run_dir": str(r.run_dir), "preset": r.preset, "wall_s": round(r.wall, 1),
                          "outside_units_s": round(r.outside, 1), "outside_units_wall_s": round(r.outside_wall, 1),
                          "units": r.units,
                          "unit_s": round(r.unit_seconds, 1), "unit_time": r.source}
                      for n, r in recorded.items()},
        "rows": rows,
    }


def plan_table(data: Mapping) -> str:
    """The plan as a plain-text table (one row a number of cores)."""
    times = ", ".join(data.get("unit_time") or ["none"])
    lines = [f"plan: the latest runs of {len(data['notebooks'])} notebooks ({', '.join(data.get('presets') or [])}), "
             f"unit time from {times}; the wall-clock predicted by list scheduling (klear_lib.schedule):",
             f"{'cores':>5}  {'one after another':>17}  {'one pool':>9}  {'saved':>6}  {'longest chain':>13}  "
             f"{'all work / cores':>16}"]
    for r in data["rows"]:
        saved = 1 - r["one_pool_s"] / r["one_after_another_s"] if r["one_after_another_s"] else 0.0
        lines.append(f"{r['cores']:>5}  {r['one_after_another_s']:>16.0f}s  {r['one_pool_s']:>8.0f}s  {saved:>6.0%}  "
                     f"{r['critical_path_s']:>12.0f}s  {r['all_work_per_core_s']:>15.0f}s")
    lines.append("(one pool gives the notebooks' own work outside units no core; where all work / cores is more, the "
                 "cores bound the wall-clock instead)")
    return "\n".join(lines)


def write_plan(output_root: str | os.PathLike, data: Mapping) -> pathlib.Path:
    """``<output root>/plan.json``, for the report: ``rows`` (per ``cores``: ``one_after_another_s``, ``one_pool_s``,
    ``critical_path_s``, ``unit_work_per_core_s``, ``all_work_per_core_s``), ``notebooks`` (per notebook: ``run_dir``,
    ``preset``, ``wall_s``, ``outside_units_s``, ``outside_units_wall_s``, ``units``, ``unit_s``, ``unit_time``),
    ``after`` (the graph used), ``unit_time``, ``presets``, ``max_notebooks``, ``made``."""
    from klear_lib import runs

    path = pathlib.Path(output_root) / PLAN_FILE
    runs.write_atomic(path, runs.to_json_text(data, indent=2) + "\n")
    return path


# ------------------------------------------------------------------------------------ running the notebooks

# Memory, measured at `smoke` on 2026-12-07 (/proc/<pid>/smaps_rollup, 2-core AMD EPYC, 23 GB): a notebook's kernel
# 420 MB PSS and its forkserver 230 MB; a worker waiting for a slot 15 MB of its own (PSS 115 MB, the rest shared
# with its forkserver); a running tiny unit 190 MB private.
NOTEBOOK_MB, IDLE_WORKER_MB, UNIT_MB = 700, 15, 200


def default_max_notebooks(cores: int, workers: int | None = None, *, avail_mb: float | None = None) -> int | None:
    """How many notebooks may run at once within the available memory (``MemAvailable``): what ``cores`` running
    units leave, shared among notebooks of ``NOTEBOOK_MB`` each plus ``workers`` (default ``cores``, ``auto``) idle
    workers; at least 1. None (every ready notebook) where the memory cannot be read. With 22 GB free: 29 on 2 cores,
    5 on 64."""
    if avail_mb is None:
        try:
            text = pathlib.Path("/proc/meminfo").read_text()
            avail_mb = int(re.search(r"^MemAvailable:\s+(\d+) kB", text, re.M)[1]) / 1024
        except (OSError, TypeError, ValueError):
            return None
    workers = cores if workers is None else workers
    return max(1, int((avail_mb - cores * UNIT_MB) // (NOTEBOOK_MB + workers * IDLE_WORKER_MB)))



@dataclasses.dataclass
class _Child:
    name: str
    proc: subprocess.Popen
    result: pathlib.Path
    start: float
    pump: threading.Thread


def _pump(stream, name: str, lock: threading.Lock) -> None:
    """Copy a child's output to this process's stderr, a line at a time, each prefixed with its notebook."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        with lock:
            sys.stderr.write(f"[{name}] {line}\n")
            sys.stderr.flush()
    stream.close()


def run_notebooks(layout, preset: str, names: Sequence[str], *, cores: int, max_notebooks: int | None = None,
                  after: Mapping[str, Iterable[str]] | None = None, rank: Mapping[str, float] | None = None,
                  on_row=None, poll_s: float = 0.1) -> list[dict]:
    """Run ``names`` (notebooks with ``preset``) as ``klear run`` children sharing ``cores`` unit slots; returns one
    row per notebook in name order: ``notebook``, ``status`` (ran, incomplete, FAILED, ERROR, interrupted, skipped),
    ``seconds``, ``run_dir``, ``message``, ``start`` and ``end`` (Unix seconds). ``on_row(rows)`` after every row.
    A notebook starts once every notebook it depends on (``dependencies``) ran; if one did not, it is skipped, with
    why. At most ``max_notebooks`` at once (None: all ready ones), highest ``rank`` first (default: name order).
    On Ctrl-C (or any exception) every child is asked to stop (SIGINT: it records itself interrupted), waited for up
    to ``INTERRUPT_GRACE_S``, then killed; the rows so far go to ``on_row`` and the exception goes on.

    Every notebook's parameters are checked here first, its config cells run (``runner.resolve``: what ``klear run``
    does before a kernel starts), all in this one process: a notebook they refuse is an ERROR row at once, and the
    children skip the check. Each child doing it again imported torch again: 5.5 CPU-s a child, where a child
    without it starts in 1.3 (2026-12-07, 03 at smoke)."""
    import tempfile

    from klear_lib import experiment, runner
    from klear_lib.presets import KlearError

    deps = dependencies(names, after)
    rank = dict(rank or {})
    order = sorted(names, key=lambda n: (-rank.get(n, 0.0), n))
    rows: dict[str, dict] = {}
    children: dict[str, _Child] = {}
    lock = threading.Lock()

    def publish() -> None:
        if on_row is not None:
            on_row([rows[n] for n in sorted(rows)])

    for name in names:
        clock = time.time()
        try:
            runner.resolve(name, preset, (), layout, dry_run=True)
        except KlearError as err:
            print(f"klear: error: {err}", file=sys.stderr)
            rows[name] = {"notebook": name, "status": "ERROR", "seconds": round(time.time() - clock, 1),
                          "run_dir": "", "message": str(err), "start": clock, "end": time.time()}
    if rows:
        publish()

    with tempfile.TemporaryDirectory(prefix="klear-reproduce-") as scratch:
        slots = make_slots(pathlib.Path(scratch) / "slots", cores)
        env = {**os.environ, SLOTS_ENV: str(slots), experiment.OWNER_ENV: experiment.process_identity(),
               "PYTHONUNBUFFERED": "1"}
        try:
            while len(rows) < len(names):
                for name in order:
                    if name in rows or name in children:
                        continue
                    failed = sorted(d for d in deps[name] if d in rows and rows[d]["status"] not in OK)
                    if failed:
                        why = ", ".join(f"{d} {rows[d]['status']}" for d in failed)
                        now = time.time()
                        rows[name] = {"notebook": name, "status": "skipped", "seconds": 0.0, "run_dir": "",
                                      "message": f"not run: it runs after {why}", "start": now, "end": now}
                        publish()
                        continue
                    if not deps[name] <= {n for n, r in rows.items() if r["status"] in OK}:
                        continue
                    if max_notebooks is not None and len(children) >= max_notebooks:
                        continue
                    children[name] = _start_child(layout, preset, name, env, pathlib.Path(scratch), lock)
                for name, child in list(children.items()):
                    if child.proc.poll() is None:
                        continue
                    child.pump.join(timeout=5)
                    rows[name] = _child_row(child)
                    del children[name]
                    publish()
                time.sleep(poll_s)
        except BaseException:
            _stop_children(children)
            for name, child in children.items():
                child.pump.join(timeout=5)
                rows[name] = _child_row(child)
                if not child.result.is_file():
                    rows[name]["status"] = "interrupted"
            publish()
            raise
    return [rows[n] for n in sorted(rows)]


OK = ("ran", "incomplete")  # a notebook its dependents may follow (incomplete: it ran, a record file is missing)


def _start_child(layout, preset: str, name: str, env: Mapping[str, str], scratch: pathlib.Path,
                 lock: threading.Lock) -> _Child:
    result = scratch / f"{name}.result.json"
    cmd = [sys.executable, "-m", "klear_lib.schedule", name, "--preset", preset, "--result", str(result), "--checked",
           "--repo-root", str(layout.repo_root), "--notebooks-dir", str(layout.notebooks_dir),
           "--params-dir", str(layout.params_dir), "--output-root", str(layout.output_root)]
    start = time.time()
    # A process group of its own (the child and its kernel): Ctrl-C reaches it once, from klear reproduce, as the
    # terminal's reaches a `klear run` and its kernel (`_interrupt_group`).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=dict(env), cwd=str(layout.repo_root), process_group=0)
    pump = threading.Thread(target=_pump, args=(proc.stdout, name, lock), name=f"klear-{name}-output", daemon=True)
    pump.start()
    return _Child(name, proc, result, start, pump)


def _child_row(child: _Child) -> dict:
    end = time.time()
    got = _read_json(child.result)
    if not isinstance(got, dict):
        rc = child.proc.returncode
        how = f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exit status {rc}"
        got = {"status": "FAILED", "run_dir": "", "message": f"klear run of {child.name} ended ({how}) without a "
                                                              "result"}
    return {"notebook": child.name, "status": got.get("status", "FAILED"), "seconds": round(end - child.start, 1),
            "run_dir": got.get("run_dir") or "", "message": got.get("message") or "", "start": round(child.start, 3),
            "end": round(end, 3)}


def _stop_children(children: Mapping[str, _Child]) -> None:
    """Ctrl-C (SIGINT) to every running child's process group, the child and its kernel, as a terminal's Ctrl-C
    reaches a ``klear run`` (its run is recorded interrupted, the kernel's cell stops, its workers end); the groups
    still there after ``INTERRUPT_GRACE_S`` are killed, at once on a second Ctrl-C."""
    live = [c.proc for c in children.values() if c.proc.poll() is None]
    for proc in live:
        _signal_group(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + INTERRUPT_GRACE_S
    try:
        while any(p.poll() is None for p in live) and time.monotonic() < deadline:
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    for proc in live:
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()


def _signal_group(pid: int, sig: int) -> None:
    """``sig`` to the process group that ``pid`` leads, else to ``pid`` alone."""
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


# ------------------------------------------------------------------------------------------- one child


def _watch_owner(owner: str | None) -> None:
    """In a child: when ``owner`` (``klear reproduce``) is gone, interrupt this process and its kernel (its process
    group) as Ctrl-C would: its run is recorded interrupted, the kernel and the workers end; kill them if that has
    not ended them within ``INTERRUPT_GRACE_S``."""
    from klear_lib import experiment

    if not owner:
        return

    def watch() -> None:
        while experiment.identity_alive(owner):
            time.sleep(experiment.WATCH_S)
        _signal_group(os.getpid(), signal.SIGINT)
        time.sleep(INTERRUPT_GRACE_S)
        _signal_group(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="klear-reproduce-watchdog", daemon=True).start()


def child_main(argv: Sequence[str] | None = None) -> int:
    """``python -m klear_lib.schedule NOTEBOOK --preset P --result FILE [--checked] <folders>``: what ``klear run
    NOTEBOOK --preset P`` does (``runner.run_notebook``, without papermill's progress bar; with ``--checked``,
    without running the config cells first), with its outcome written to FILE as JSON (``status``, ``run_dir``,
    ``message``) for ``klear reproduce``. Exit status as klear run's."""
    import argparse

    from klear_lib import experiment, runner
    from klear_lib.presets import KlearError

    parser = argparse.ArgumentParser(prog="python -m klear_lib.schedule")
    parser.add_argument("notebook")
    parser.add_argument("--preset", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--checked", action="store_true", help="the parameters were checked (config cells run)")
    for flag in ("--repo-root", "--notebooks-dir", "--params-dir", "--output-root"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as klear run takes it, even if it was ignored
    _watch_owner(experiment.run_owner())
    layout = runner.Layout(*(pathlib.Path(p).resolve() for p in (args.repo_root, args.notebooks_dir,
                                                                  args.params_dir, args.output_root)))
    code, run_dir, message = 0, "", ""
    try:
        run_dir = runner.run_notebook(args.notebook, args.preset, layout=layout, progress_bar=False,
                                      dry_run=not args.checked)
    except runner.NotebookFailed as err:
        print(f"klear: {err}", file=sys.stderr)
        code, status, run_dir, message = 1, "FAILED", str(err.output.parent), str(err).split("\n")[0]
    except runner.RunInterrupted as err:
        print(f"klear: {err}", file=sys.stderr)
        code, status, run_dir, message = 130, "interrupted", str(err.run_dir), "interrupted"
    except KlearError as err:
        print(f"klear: error: {err}", file=sys.stderr)
        code, status, message = 2, "ERROR", str(err)
    except KeyboardInterrupt:  # before the run directory was made
        code, status, message = 130, "interrupted", "interrupted before the run started"
    else:
        missing = runner.report_contract(run_dir)
        status = "ran" if not missing else "incomplete"
        message = f"missing {', '.join(missing)}" if missing else ""
    from klear_lib import runs

    runs.write_atomic(pathlib.Path(args.result), json.dumps({"status": status, "run_dir": str(run_dir),
                                                              "message": message}) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(child_main())
