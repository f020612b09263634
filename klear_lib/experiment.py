"""An experiment's units of work (an arm × a seed, one SFT source, ...) run in worker processes, each recorded
when it finishes, so that an interrupted run resumes without redoing them.

    jobs = [Job("gppo/seed=0", "klear_lib.train.rl_jobs:rl_unit", {"config": {...}, "start": ..., "tags": {...}})]
    results = run_jobs(jobs, run_dir, workers=2)

Each job calls ``fn(**kwargs, metrics_path=...)`` in a worker process (forked from a forkserver that imported torch
and transformers once, ``_worker_context``; ``spawn`` where there is none; the function must be importable, not
defined in a notebook) and writes its metric records to ``run_dir/units/<job>.jsonl``; when it returns, the
parent writes its result (a JSON-able dict, with the unit's ``seconds``, ``cpu_seconds``, ``started_at`` and
``ended_at``: ``_call``) to ``run_dir/units/<job>.json``: that file is the job's "done" mark. Under ``klear
reproduce`` a unit runs only while it holds one of the machine's unit slots (``klear_lib.slots.unit_slot``).
On a second call with the same run directory, done jobs are skipped and their results read back; an unfinished
job's partial records are discarded and it runs again. After every finished job, ``metrics.jsonl`` is rewritten
from the done jobs' records in job order (atomically), so it never holds a record twice and always holds every
finished job.

No orphans, no late marks. The chain is ``klear run`` -> papermill's kernel (the driver, in ``run_jobs``) -> its
forkserver -> the workers -> whatever a unit starts. Each worker leads its own process group and ends it, with every
process it started (those in their own session too, found through /proc), as soon as its parent, the driver or the
run's owner is gone: its parent's death reaches it as a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGUSR1)``;
it fires when the parent *thread* ends, so the handler checks the lineage), and a watchdog thread polls its parent,
the driver and the owner by identity (pid and start time; ``KLEAR_RUN_OWNER``, set by ``klear run``: the kernel
outlives a killed ``klear run`` by up to a second) every ``WATCH_S``; SIGTERM (the parent's ``terminate()``) ends
it the same way. The forkserver and multiprocessing's resource tracker then exit too (each ends when the last
process holding its pipe does). The done mark is written by the parent, and only while the owner lives. A run
directory is driven by one ``run_jobs`` at a time (``units/.lock``), and a resume waits until no worker of an
earlier attempt holds ``units/.workers.lock``, so two attempts never write the same unit.

Beyond one machine: ``executor="ray"`` (``klear run --executor ray``) runs each unit as a Ray task, placed by its
needs, with the same records, done marks and resume (``klear_lib.ray_executor``).

Why processes: the tiny model is too small for two threads to speed one run up much, but two runs at a time,
one thread each, nearly double the throughput on two cores. Every job runs in a worker with ``threads`` torch
threads, whatever ``workers`` is, so its numbers do not depend on how many ran beside it.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import importlib
import json
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klear_lib import runs

UNITS_DIR = "units"
TRACKING_DIR = "tracking"


_CURRENT_UNIT: str | None = None  # in a worker: the key of the unit it runs (set by _call)


@dataclass(frozen=True)
class UnitTracking(os.PathLike):
    """Where a unit's experiment tracker writes and under which names: the notebook's run directory's
    ``tracking/<tracker>/`` (``tracking/tensorboard/gppo/lr=0.0001/seed=0``: TensorBoard shows the unit's key as its
    run; wandb's offline run folder goes there too; trackio keeps one database per run directory,
    ``tracking/trackio``, with the unit as the run and the notebook as the project). As a path it is the folder."""

    tracker: str
    root: Path  # <run dir>/tracking
    project: str  # the notebook's name
    run_name: str  # the unit's key

    @property
    def folder(self) -> Path:
        if self.tracker == "trackio":
            return self.root / "trackio"
        parts = [re.sub(r"[^A-Za-z0-9._=-]+", "_", p) for p in self.run_name.split("/") if p not in ("", ".", "..")]
        return self.root.joinpath(self.tracker, *parts)

    def __fspath__(self) -> str:
        return str(self.folder)


def _run_root(folder: Path) -> Path:
    """The notebook's run directory that holds ``folder`` (the nearest with a config.json: run_jobs may run in a
    subfolder, 03's ``control/``), else ``folder`` itself."""
    for candidate in (folder, *list(folder.parents)[:2]):
        if (candidate / runs.CONFIG_FILE).is_file():
            return candidate
    return folder


def unit_tracking_dir(metrics_path: str | os.PathLike, report_to: str) -> UnitTracking | None:
    """Where a unit's experiment tracker writes (``UnitTracking``), beside ``units/<unit>.jsonl`` in the notebook's
    run directory, so that its files outlive anything the unit deletes; ``None`` when ``report_to`` is ``"none"``.
    The unit's key comes from the worker (``run_jobs``); outside one, its file name."""
    if report_to == "none":
        return None
    unit = Path(metrics_path)
    root = _run_root(unit.parent.parent)
    key = _CURRENT_UNIT if _CURRENT_UNIT and Job(_CURRENT_UNIT, "m:f").slug == unit.stem else unit.stem
    return UnitTracking(report_to, root / TRACKING_DIR, root.parent.name, key)


@dataclass(frozen=True)
class Job:
    """One unit of work: ``fn`` ("package.module:function") called with ``kwargs`` (JSON-able) in a worker."""

    key: str
    fn: str
    kwargs: dict = field(default_factory=dict)
    needs: dict = field(default_factory=dict)  # on Ray: num_cpus, num_gpus, memory, resources (ray_executor)

    def __post_init__(self) -> None:
        if not self.key or ":" not in self.fn:
            raise ValueError(f"Job needs a key and fn='module:function', got key={self.key!r}, fn={self.fn!r}")

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._=-]+", "_", self.key)


class JobFailed(RuntimeError):
    """A job raised in its worker; the message carries the job and the worker's traceback."""


def _paths(run_dir: Path, job: Job) -> tuple[Path, Path]:
    units = run_dir / UNITS_DIR
    return units / f"{job.slug}.jsonl", units / f"{job.slug}.json"


EXECUTOR_ENV = "KLEAR_EXECUTOR"  # "local" (the default: this machine's worker pool) or "ray" (klear_lib.ray_executor)
OWNER_ENV = "KLEAR_RUN_OWNER"  # "pid:start time" of the process whose death ends the run (`klear run` sets it)
RUN_LOCK = ".lock"  # held (exclusively) by the run_jobs driving a run directory
WORKERS_LOCK = ".workers.lock"  # held (shared) by every worker of that run_jobs, until the worker is gone
WATCH_S = 0.25  # how often a worker checks that its parent and the run's owner live
END_HANDOFF_S = 1.0  # how long the watchdog leaves the ending to the unit's thread before it ends the worker
END_SCANS = 20  # at most this many scans for processes below a worker that is ending


class RunBusy(RuntimeError):
    """Another process drives this run directory, or workers of an earlier attempt still run in it."""


class OwnerGone(RuntimeError):
    """The process that owns the run (``KLEAR_RUN_OWNER``: ``klear run``) died; nothing more is recorded."""


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state, ppid, ...; the command name, which may hold spaces, is cut off)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_identity(pid: int | None = None) -> str:
    """``"pid:start time"`` of a process (its start in clock ticks since boot, from /proc; empty where there is
    no /proc): a recycled pid does not match it."""
    pid = os.getpid() if pid is None else pid
    stat = _proc_stat(pid)
    return f"{pid}:{stat[19] if stat else ''}"


def identity_alive(identity: str) -> bool:
    """Whether the process named by ``process_identity`` still runs (a zombie, dead but not reaped, does not)."""
    pid_text, _, start = identity.partition(":")
    try:
        pid = int(pid_text)
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return not start and not os.path.isdir("/proc")  # no /proc: the signal test is all there is
    return stat[0] != "Z" and (not start or stat[19] == start)


def run_owner() -> str | None:
    """The run owner's identity from ``KLEAR_RUN_OWNER`` (None outside ``klear run``: a notebook in Jupyter)."""
    return os.environ.get(OWNER_ENV) or None


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` in the process tree (children first), from /proc; [] without /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if name.isdigit():
            stat = _proc_stat(int(name))
            if stat is not None:
                children.setdefault(int(stat[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def _end_worker(*_args) -> None:
    """End this worker and everything it started: the processes below it (also those in a session of their own,
    which a process-group kill misses), then its process group, itself included. The scan repeats until it finds
    none: called from the watchdog thread, it may race the unit's thread starting a process (one that has left the
    group for a session of its own between a scan and the group kill would outlive the worker)."""
    me = os.getpid()
    for _ in range(END_SCANS):
        found = _descendants(me)
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
    try:
        if os.getpgid(0) == me:
            os.killpg(me, signal.SIGKILL)
    except OSError:
        pass
    os._exit(1)


def _parent_death_signal(sig: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, sig)`` through ctypes (Linux; a no-op elsewhere). It fires when the thread that
    started this process ends; ``_on_parent_signal`` checks that the parent process really is gone."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _init_worker(threads: int, driver: str = "", owner: str | None = None, lock: str | None = None,
                 env: dict | None = None, cwd: str | None = None) -> None:
    # First, before anything imports trackio (TRL imports it with itself): trackio reads TRACKIO_DIR once, at
    # import, so every unit of this run logs to the run's one trackio folder (UnitTracking). A worker forked by the
    # forkserver holds the environment the forkserver started with: ``env`` is the driver's whole environment now.
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    global _PARENT, _DRIVER, _OWNER
    _PARENT, _DRIVER, _OWNER = os.getppid(), driver, owner
    try:
        os.setpgid(0, 0)  # a group of its own: ending it ends what the unit started, and nothing else
    except OSError:
        pass
    if lock is not None and (mode := _flock_mode("LOCK_SH")):
        import fcntl

        holder = open(lock, "a")  # noqa: SIM115 (held until this process is gone; the kernel then drops the lock)
        fcntl.flock(holder, mode)
        _HELD.append(holder)
    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, _end_worker)  # the parent's terminate(): the unit's own processes go too
    if driver and hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, _on_parent_signal)
        _parent_death_signal(signal.SIGUSR1)
        if not _lineage_alive():  # the parent or the driver died before the signal was armed
            _end_worker()
        threading.Thread(target=_watch, name="klear-unit-watchdog", daemon=True).start()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(threads)
    from klear_lib.notebook import quiet

    quiet()


_PARENT, _DRIVER, _OWNER = 0, "", None
_HELD: list = []


def _lineage_alive() -> bool:
    """The worker's parent (the forkserver, or the driver where workers are spawned) is the one it started under,
    and the driver (the process in ``run_jobs``: a kernel) and the run's owner live. The forkserver outlives a
    dead driver until its last worker is gone (each holds its pipe), so the driver is watched by identity."""
    return (os.getppid() == _PARENT and (not _DRIVER or identity_alive(_DRIVER))
            and (_OWNER is None or identity_alive(_OWNER)))


def _on_parent_signal(*_args) -> None:
    if not _lineage_alive():  # the parent process is gone, not just the thread that started this one
        _end_worker()


def _watch() -> None:
    while _lineage_alive():
        time.sleep(WATCH_S)
    # First hand the ending to the main thread (the unit's): a signal handler runs there between two bytecodes, never
    # inside a subprocess start, so every process the unit started is below this one when it scans. A main thread in
    # a long C call (a torch op) does not take it; the watchdog then ends the worker itself.
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(END_HANDOFF_S)
    _end_worker()


# The heavy imports every unit shares, done once in the forkserver that starts the workers (``_worker_context``).
PRELOAD = "klear_lib.worker_preload"


def _worker_context():
    """How workers start: forked from a forkserver that imported ``PRELOAD`` once (≈8 CPU-seconds a process that a
    spawned worker pays again, every ``run_jobs``), where the platform has one; ``spawn`` elsewhere. Either way a
    worker is a fresh process with the driver's ``sys.path``, working directory and environment (``_init_worker``);
    the forkserver is the driver's child and ends with it."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])  # no effect once this process's forkserver runs: it keeps its own
    return ctx


def _call(fn: str, kwargs: dict, metrics_path: str, key: str | None = None) -> dict:
    """Run one unit in this worker; its result with the unit's wall time (``seconds``), its CPU time
    (``cpu_seconds``: this worker's user + system time over the unit, the children it reaped included) and its start
    and end (``started_at``, ``ended_at``: Unix seconds), which ``klear reproduce --plan`` schedules from. Under
    ``klear reproduce`` the unit first takes one of the machine's unit slots (``slots.unit_slot``): the times
    count from when it has one."""
    global _CURRENT_UNIT
    _CURRENT_UNIT = key  # the unit's name for its experiment tracker (unit_tracking_dir)
    module, name = fn.split(":")
    func = getattr(importlib.import_module(module), name)
    from klear_lib.slots import unit_slot

    with unit_slot():  # one of `klear reproduce`'s machine-wide unit slots (a no-op outside it)
        started, start, cpu = time.time(), time.perf_counter(), _cpu_now()
        result = dict(func(**kwargs, metrics_path=metrics_path) or {})
        result["seconds"] = round(time.perf_counter() - start, 1)
        result["cpu_seconds"] = round(_cpu_now() - cpu, 2)
        result["started_at"], result["ended_at"] = round(started, 3), round(time.time(), 3)
    runs.to_json_text(result, "result")  # a result that cannot be written fails here, in the unit
    return result


def _cpu_now() -> float:
    """CPU time (user + system) of this process and of the children it has waited for (``getrusage`` SELF +
    CHILDREN): its difference across a unit is the unit's CPU time, its own processes' included once they are
    reaped (a worker runs one unit at a time)."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def merge_metrics(run_dir: str | os.PathLike, jobs: list[Job]) -> int:
    """Rewrite ``run_dir/metrics.jsonl`` from the records of the done jobs, in job order; returns the count.
    Written whole or not at all (``runs.write_atomic``): on a full disk the previous file stays as it was."""
    run_dir = Path(run_dir)
    lines = []
    for job in jobs:
        metrics, result = _paths(run_dir, job)
        if result.is_file() and metrics.is_file():
            lines += [line for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    runs.write_atomic(run_dir / runs.METRICS_FILE, "".join(line + "\n" for line in lines))
    return len(lines)


def _lock(path: Path, mode: int, *, wait_s: float) -> Any:
    """An open file holding ``flock(mode)`` on ``path``, tried for ``wait_s`` seconds; None if it stayed taken.
    (No fcntl, as on Windows: a dummy, nothing is locked.)"""
    try:
        import fcntl
    except ImportError:
        return open(path, "a")  # noqa: SIM115
    f = open(path, "a")  # noqa: SIM115 (returned to the caller, which closes it)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() >= deadline:
                f.close()
                return None
            time.sleep(0.1)


def _check_owner(owner: str | None) -> None:
    if owner is not None and not identity_alive(owner):
        raise OwnerGone(f"the process that owns this run ({OWNER_ENV}={owner}: klear run) is gone: "
                        "no more units are recorded")


def run_jobs(jobs: list[Job], run_dir: str | os.PathLike, *, workers: int = 2, threads: int = 1,
             progress=print, busy_wait_s: float = 30.0, bars: str = "auto",
             progress_every_s: float = 15.0, executor: str | None = None) -> dict[str, dict]:
    """Run ``jobs`` (``workers`` at a time, each with ``threads`` torch threads) and return ``{key: result}``.

    Done jobs (a result file in ``run_dir/units``) are not run again. The first failure stops the run: the jobs
    not yet started are cancelled, the running ones finish and are recorded, then ``JobFailed`` is raised with
    the worker's traceback. ``RunBusy`` when another ``run_jobs`` drives ``run_dir``, or when workers of an
    earlier attempt still run there after ``busy_wait_s`` seconds; ``OwnerGone`` when ``klear run`` died.
    Progress inside the units comes from their records as they are written (``UnitProgress``): ``bars="auto"``
    shows tqdm widgets in JupyterLab and lines through ``progress`` (at most one per unit every
    ``progress_every_s`` seconds) elsewhere; ``"none"``: the done lines only.

    ``executor``: ``"local"`` (``workers`` processes on this machine) or ``"ray"`` (each unit a task on a Ray
    cluster, placed by its needs, ``klear_lib.ray_executor``: ``workers`` does not apply); default
    ``$KLEAR_EXECUTOR``, else local. Both write the same run directory: a run started with one resumes with the other.
    A done mark that cannot be read (a truncated file) is named, and its unit runs again.
    """
    run_dir = Path(run_dir)
    keys = [j.key for j in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"job keys must be unique; repeated: {sorted({k for k in keys if keys.count(k) > 1})}")
    slugs = [j.slug for j in jobs]
    if len(set(slugs)) != len(slugs):
        raise ValueError("two job keys map to the same file name; make them differ in letters or digits")
    if workers < 1 or threads < 1:
        raise ValueError(f"workers and threads must be >= 1, got {workers}, {threads}")
    executor = executor or os.environ.get(EXECUTOR_ENV) or "local"
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r} ({EXECUTOR_ENV})")
    owner = run_owner()
    _check_owner(owner)
    units = run_dir / UNITS_DIR
    units.mkdir(parents=True, exist_ok=True)
    driver = _lock(units / RUN_LOCK, _flock_mode("LOCK_EX"), wait_s=0.0)
    if driver is None:
        raise RunBusy(f"{run_dir} is being run by another process (it holds {units / RUN_LOCK}): "
                      "let it finish, or end it, before running this directory again")
    try:
        return _run_locked(jobs, run_dir, keys, workers, threads, progress, busy_wait_s, owner, bars, progress_every_s,
                           executor)
    finally:
        driver.close()


def _flock_mode(name: str) -> int:
    try:
        import fcntl
    except ImportError:
        return 0
    return getattr(fcntl, name)


def _read_done(metrics: Path, result: Path) -> tuple[dict | None, str | None]:
    """A done unit's result, or why its record cannot be trusted (a truncated or altered done mark or records)."""
    reading = result
    try:
        value = json.loads(result.read_text(encoding="utf-8"))
        if not isinstance(value, dict):
            return None, f"{result} holds no JSON object"
        reading = metrics
        if metrics.is_file():
            for n, line in enumerate(metrics.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    if line.strip() and not isinstance(json.loads(line), dict):
                        raise ValueError("not a JSON object")
                except ValueError as err:
                    return None, f"{metrics} line {n}: {type(err).__name__}: {err}"
    except (OSError, ValueError) as err:  # JSONDecodeError, UnicodeDecodeError
        return None, f"{reading}: {type(err).__name__}: {err}"
    return value, None


def _run_locked(jobs, run_dir, keys, workers, threads, progress, busy_wait_s, owner, bars,
                progress_every_s, executor="local") -> dict[str, dict]:
    units = run_dir / UNITS_DIR
    earlier = _lock(units / WORKERS_LOCK, _flock_mode("LOCK_EX"), wait_s=0.0)
    if earlier is None:
        progress(f"waiting up to {busy_wait_s:.0f}s for the workers of an earlier attempt to exit")
        earlier = _lock(units / WORKERS_LOCK, _flock_mode("LOCK_EX"), wait_s=busy_wait_s)
    if earlier is None:
        raise RunBusy(f"workers of an earlier attempt are still running in {run_dir} (they hold "
                      f"{units / WORKERS_LOCK}): end them before resuming, so that no unit is written twice")
    earlier.close()  # no earlier worker lives: from here on, only this call's workers write in units/
    results: dict[str, dict] = {}
    todo = []
    for job in jobs:
        metrics, result = _paths(run_dir, job)
        if result.is_file():
            value, damage = _read_done(metrics, result)
            if damage is None:
                results[job.key] = value
                continue
            progress(f"unit {job.key!r}: its record is damaged ({damage}); running it again")
            result.unlink(missing_ok=True)
        metrics.unlink(missing_ok=True)  # a partial record of an interrupted attempt
        todo.append(job)
    if results:
        progress(f"resuming: {len(results)} of {len(jobs)} units already done, {len(todo)} to run")
    merge_metrics(run_dir, jobs)
    if not todo:
        return {k: results[k] for k in keys}
    clock = time.perf_counter()
    live = UnitProgress(todo, run_dir, mode=bars, progress=progress, every_s=progress_every_s, done=len(results),
                        total=len(jobs))

    def record(job: Job, result: dict) -> None:
        """The done mark of a unit that returned (only while the run's owner lives), its progress line."""
        _check_owner(owner)
        runs.write_atomic(_paths(run_dir, job)[1], runs.to_json_text(result, "result", sort_keys=True) + "\n")
        results[job.key] = result
        live.finished(job)
        merge_metrics(run_dir, jobs)
        elapsed = time.perf_counter() - clock
        done_count = len(results)
        ran = done_count - (len(jobs) - len(todo))
        left = elapsed / ran * (len(jobs) - done_count) if ran else 0.0
        progress(f"[{done_count:3d}/{len(jobs)}] {job.key} done in {result['seconds']:.0f}s "
                 f"(elapsed {elapsed:.0f}s, about {left / 60:.1f} min left)")

    try:
        if executor == "ray":
            from klear_lib import ray_executor

            kit = ray_executor.UnitKit(
                records=lambda job: _paths(run_dir, job)[0], run_root=_run_root(run_dir),
                check_owner=lambda: _check_owner(owner), failed=JobFailed,
                worker=(_worker_context, _init_worker, _call, process_identity), owner_env=OWNER_ENV,
                env={"TRACKIO_DIR": str(_run_root(run_dir) / TRACKING_DIR / "trackio")})
            failure = ray_executor.run_units(todo, run_dir, threads=threads, kit=kit, live=live, record=record,
                                             progress=progress)
        else:
            failure = _run_pool(todo, run_dir, units, workers, threads, owner, live, record)
    finally:
        live.close()
    if failure is not None:
        raise failure
    return {k: results[k] for k in keys}


def _run_pool(todo, run_dir, units, workers, threads, owner, live, record) -> JobFailed | None:
    """The local executor: ``workers`` processes of this machine; the first failure, or None."""
    failure = None
    worker_env = {**os.environ, "TRACKIO_DIR": str(_run_root(run_dir) / TRACKING_DIR / "trackio")}
    pool = cf.ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=_worker_context(),
                                  initializer=_init_worker, initargs=(threads, process_identity(), owner,
                                                                      str(units / WORKERS_LOCK), worker_env,
                                                                      os.getcwd()))
    try:
        futures = {}
        for job in todo:
            metrics, _ = _paths(run_dir, job)
            futures[pool.submit(_call, job.fn, job.kwargs, str(metrics), job.key)] = job
        for fut in _as_completed(futures, live.poll):
            job = futures[fut]
            try:
                result = fut.result()
            except Exception as err:  # noqa: BLE001 (reported with the job and re-raised below)
                _check_owner(owner)  # a worker that ended itself because klear run died: say that instead
                if failure is None:
                    detail = getattr(err, "__cause__", None) or err
                    text = "".join(traceback.format_exception(type(detail), detail, detail.__traceback__))
                    failure = JobFailed(f"unit {job.key!r} ({job.fn}) failed: {type(err).__name__}: {err}\n"
                                        f"worker traceback:\n{text}")
                    for other in futures:
                        other.cancel()
                continue
            record(job, result)  # the done mark is written only while the run's owner lives
    except BaseException:  # Ctrl-C above all: stop now; the running units are lost (redone on the next call)
        # concurrent.futures has no public way to stop a running task: end its worker processes (SIGTERM, which
        # each worker turns into the end of its process group and of everything it started)
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return failure


def _as_completed(futures, poll, every_s: float = 1.0):
    """``concurrent.futures.as_completed``, calling ``poll()`` at least every ``every_s`` seconds while it waits."""
    pending = set(futures)
    while pending:
        done, pending = cf.wait(pending, timeout=every_s, return_when=cf.FIRST_COMPLETED)
        poll()
        yield from done


class UnitProgress:
    """Progress inside the running units, read from the records they write as they go (``units/<job>.jsonl``; the
    parent polls the files, so nothing travels between processes): an RL unit's rollout records give its rollouts
    done out of ``config["rollouts"]``, with the rollout's mean reward, the fork probe (``klear/p_correct_fork``) and
    the last held-out avg@n. A unit whose config has no ``rollouts`` (an SFT unit) shows only that it runs.

    ``mode``: ``"widgets"`` (``tqdm.auto``: a bar per running unit and one for the units, whose ETA comes from the
    units done), ``"lines"`` (a plain text bar per unit through ``progress``, at most one per unit every ``every_s``
    seconds and one when it finishes: ``klear run``, papermill, logs), ``"none"``, or ``"auto"``: widgets in a
    JupyterLab kernel (``notebook.launcher() == "jupyter"``, ipywidgets installed), lines elsewhere."""

    def __init__(self, jobs: list[Job], run_dir: Path, *, mode: str = "auto", progress=print, every_s: float = 15.0,
                 done: int = 0, total: int | None = None, bar=None):
        if mode == "auto":
            mode = "widgets" if _in_jupyter() else "lines"
        if mode not in ("widgets", "lines", "none"):
            raise ValueError(f"bars must be 'auto', 'widgets', 'lines' or 'none', got {mode!r}")
        self.mode, self.progress, self.every_s, self.run_dir = mode, progress, every_s, Path(run_dir)
        self.jobs = {j.key: j for j in jobs}
        self.state: dict[str, dict] = {}  # key -> {"offset", "n", "reward", "p_fork", "eval", "bar", "printed"}
        self.clock = time.perf_counter()
        self._bar = bar
        self.overall = None
        if mode == "widgets":
            self.overall = self._new_bar(total=total or len(jobs), initial=done, desc="units", unit="unit",
                                         smoothing=0)  # smoothing 0: the ETA is the mean time per unit done

    def _new_bar(self, **kwargs):
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm
        return self._bar(**kwargs)

    @staticmethod
    def total(job: Job) -> int | None:
        rollouts = (job.kwargs.get("config") or {}).get("rollouts") if isinstance(job.kwargs, dict) else None
        return int(rollouts) if isinstance(rollouts, int) and not isinstance(rollouts, bool) else None

    def _read(self, job: Job, st: dict) -> bool:
        """New complete lines of the job's records; True when its rollout count moved."""
        metrics, _ = _paths(self.run_dir, job)
        try:
            with open(metrics, "rb") as f:
                f.seek(st["offset"])
                chunk = f.read()
        except OSError:
            return False
        end = chunk.rfind(b"\n") + 1  # a partial last line is read on a later poll
        st["offset"] += end
        moved = False
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or "final" not in rec or "rollout" not in rec:
                continue  # a step record: the rollout records carry the progress
            moved |= rec["rollout"] != st["n"]
            st["n"] = rec["rollout"]
            for key, name in (("reward", "reward"), ("klear/p_correct_fork", "p_fork"), ("eval/avg_at_n", "eval")):
                if isinstance(rec.get(key), (int, float)):
                    st[name] = rec[key]
        return moved

    def _postfix(self, st: dict) -> str:
        parts = [f"{name} {st[name]:.3f}" for name in ("reward", "p_fork", "eval") if st.get(name) is not None]
        return ", ".join(parts)

    def poll(self) -> None:
        if self.mode == "none":
            return
        if self.overall is not None:
            self.overall.refresh()  # its elapsed time moves between units too
        for key, job in self.jobs.items():
            st = self.state.get(key)
            if st is None:
                try:  # the unit opened its records when it started: its elapsed time counts from there
                    started = _paths(self.run_dir, job)[0].stat().st_mtime
                except OSError:
                    continue  # not started yet
                st = self.state[key] = {"offset": 0, "n": 0, "printed": None, "start": min(started, time.time())}
                if self.mode == "widgets":
                    st["bar"] = self._new_bar(total=self.total(job), desc=key, unit="rollout", leave=False)
            if st.get("done"):
                continue
            moved = self._read(job, st)
            if self.mode == "widgets":
                bar = st["bar"]
                bar.n = st["n"]
                bar.set_postfix_str(self._postfix(st), refresh=False)
                bar.refresh()
            elif moved and (st["printed"] is None or time.perf_counter() - st["printed"] >= self.every_s):
                self._line(job, st)

    def _line(self, job: Job, st: dict) -> None:
        from tqdm import tqdm

        st["printed"], st["printed_n"] = time.perf_counter(), st["n"]
        meter = tqdm.format_meter(st["n"], self.total(job), time.time() - st["start"], prefix=f"  {job.key}",
                                  unit="rollout", postfix=self._postfix(st) or None, ascii=True)
        self.progress(meter)

    def finished(self, job: Job) -> None:
        """The unit's done mark is written: its bar ends (and the units bar moves)."""
        st = self.state.get(job.key)
        if st is not None and self.mode != "none":
            self._read(job, st)
            if self.mode == "widgets":
                st["bar"].close()
            elif st["printed"] is not None and st["n"] != st.get("printed_n"):
                self._line(job, st)  # its last rollouts, if a throttled line left them out
        if st is not None:
            st["done"] = True
        if self.overall is not None:
            self.overall.update(1)

    def close(self) -> None:
        for st in self.state.values():
            if "bar" in st and not st.get("done"):
                st["bar"].close()
        if self.overall is not None:
            self.overall.close()


def _in_jupyter() -> bool:
    """A kernel of a Jupyter server (JupyterLab) with ipywidgets: where tqdm's widgets render."""
    import importlib.util

    from klear_lib.notebook import launcher

    return launcher() == "jupyter" and importlib.util.find_spec("ipywidgets") is not None


def unit_records(run_dir: str | os.PathLike, job: Job) -> list[dict[str, Any]]:
    """The metric records one done job wrote (``runs.read_metrics`` of its unit file)."""
    metrics, _ = _paths(Path(run_dir), job)
    return runs.read_metrics(metrics)
