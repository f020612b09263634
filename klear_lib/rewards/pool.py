"""Reward manager: grade a batch in worker processes, where a hung, dying or raising judge costs one score.

Reference §5: math-verify's timeouts are ``SIGALRM`` and work only in a process's main thread, and "a hung
parse must never stall training"; Klear grades in a Pebble process pool (code: 10 workers, 500 s per item,
timeout or crash → −1). ``RewardPool`` is that: pebble's ``ProcessPool`` (pinned 5.2.3) under a thin layer.
Every item yields a ``RewardResult``, in input order: the judge's own, or ``failure_score`` with one of
``POOL_REASONS``; nothing about one item is raised into the training loop, and nothing waits forever.

What pebble does here: it runs each task in the main thread of a worker process (so a judge's signal-based budget,
``score_math``'s SIGPROF, works there), started with ``spawn`` by default; kills and replaces the worker of a task
that runs past its ``timeout`` (→ ``timeout``); reports a worker that dies with an error status or a signal while
on a task (``ProcessExpired`` → ``worker_died``: ``os._exit(1)``, a segfault, SIGKILL); replaces a worker after
``max_tasks`` tasks; runs an initializer in each worker, which here caps its address space (``memory_mb``,
``RLIMIT_AS`` above what the worker holds once the judge is loaded; a judgement that runs into it raises
MemoryError → ``memory_exceeded``). The worker side turns what the judge returns into a plain result
(``checked``: NaN, inf, non-numbers → ``invalid_score``; a raise or a wrong type → ``error``).

What the layer adds, because pebble 5.2.3 does not do it:

* Start failures. A pebble worker that cannot load the judge (its module fails to import in a fresh process,
  the initializer raises) dies at start: pebble then restarts it in a loop, or fails the whole pool for good
  ("All workers expired"), or, for a module that quits on import, loses the task it took. So the pool first
  loads the judge by name in one fresh process of the same start method, with the same initializer and cap;
  if that fails the constructor raises ``WorkerStartError`` with that process's traceback. The same probe runs
  again whenever the layer rebuilds pebble's pool (below), so a judge that stopped loading fails the batch the
  same way.
* Progress. pebble says nothing about a task until it ends. Each task writes, into a small per-batch file
  (``/dev/shm``), which item its worker process (pid) is on and since when. The next three points use it.
* Exit status 0. pebble ignores a worker that exits with status 0 (``os._exit(0)``): its item waited for the
  timeout and came back as one. An item whose worker process is gone (reaped) while pebble, 0.25 s later, still
  reports nothing is ``worker_died`` ("exit status 0": pebble reports every other exit).
* Groups. pebble's timeout is per task and a task's results come back only when it ends. A group task's limit
  is enforced per item here, from the progress file: an item that runs past ``timeout_s`` is cancelled (pebble
  kills the worker) and scored ``timeout``; an item whose worker died is ``worker_died``; the group's other
  items are then graded again one per task. pebble's own timeout of a group task (``timeout_s`` times its size)
  is the backstop. A hang costs its own item, grouped or not (benchmarks/bench_pool_faults.py).
* Lost tasks (an open pebble problem). A worker that dies after taking a task from pebble's pipe but before
  acknowledging it loses the task: it never starts, so its timeout never runs. Workers take tasks in order, so a
  task still not started 10 s after a later one has started is lost: ``worker_died`` (not at once: two workers
  acknowledge the tasks they took in either order, seconds apart on a loaded machine). Every other silence (e.g. a
  worker that died holding pebble's channel lock, which stalls the other workers for 60 s) is bounded by the batch
  deadline,
  ``start_timeout_s + 2 * timeout_s * ceil(items / workers)`` (each item timed out twice, after a group's and its
  own attempt, on every worker): what has no result by then is ``timeout``, and pebble's pool is rebuilt.
* A broken pool. A worker that dies while no task runs (the OOM killer taking an idle worker) makes pebble fail
  every pending task and refuse new ones, for good. The layer rebuilds pebble's pool (probe first) and grades
  the batch's unfinished items again.
* SIGTERM. pebble stops a worker with SIGTERM, whose handler is Python code that cannot run while a judge is
  stuck in C (a huge sympy power), and waits 3 s before SIGKILL while holding the channel lock every worker
  needs. During a judgement SIGTERM has its default action, so the kill is immediate.

Groups. In GRPO the G completions of a prompt share a gold answer, and parsing the gold costs about as much as
parsing an answer. With ``group_key="gold"``, a run of consecutive items with the same gold (at most
``max_group``) is one task: one worker parses the gold once (score_math caches it) and the batch pays one round
trip per group instead of one per item (benchmarks/bench_math_pool.py).

``make_trl_reward_func`` wraps a pool as a TRL ``reward_funcs`` entry that also reports why each reward is
what it is (TRL's ``log_extra`` column and a running ``Counter`` on the function).

Workers start with ``spawn`` by default: the trainer process holds torch (and possibly CUDA) threads, and
forking a multi-threaded process can deadlock the child; a spawned worker imports the judge's module (and runs
the main module's top level again, as ``spawn`` does), ≈0.5 s, paid at pool start (twice: the probe, then the
workers) and when a killed worker is replaced. ``score_fn`` must therefore be picklable by reference: a
module-level function of an importable module (``klear_lib.rewards.math.score_math``), not one defined in a
notebook.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import multiprocessing
import numbers
import os
import pickle
import resource
import signal
import struct
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout  # the builtin TimeoutError from Python 3.11 on
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import connection

from pebble import ProcessExpired, ProcessPool

from klear_lib.rewards.result import DATA_ERROR, DataError, RewardResult

__all__ = ["RewardPool", "WorkerStartError", "POOL_REASONS", "checked"]

#: Reasons the pool itself can give (the judge's own reasons pass through unchanged); each scores failure_score.
POOL_REASONS = {
    "timeout": "the item ran past the pool's timeout_s (its worker was killed and replaced), or had no result by "
               "the batch deadline",
    "worker_died": "the worker process ended while grading the item (os._exit, a segfault, a signal), or before "
                   "it could start it",
    "memory_exceeded": "the judgement raised MemoryError: it ran into the worker's memory_mb cap (or the machine's)",
    "invalid_score": "the judge returned a score that is not a finite real number (NaN, inf, a str, None, a bool)",
    DATA_ERROR: "score_fn raised rewards.result.DataError: the item's data (a code problem's tests) is malformed",
    "error": "score_fn raised (SystemExit included), returned something other than a RewardResult, or the item "
             "or its result could not be pickled",
}

_TICK_S = 0.05  # how often the layer reads the progress file
_EXIT_GRACE_S = 0.25  # once a worker is reaped, how long pebble gets to report its death (it does so at once)
# how long a task may stay unstarted after a later one started before it counts as lost: two workers that took
# tasks k and k+1 acknowledge them in either order, and on a loaded machine the second acknowledgement can come
# seconds after the first (a lost task is rare; waiting for it costs only time)
_LOST_GRACE_S = 10.0
_RECORD = struct.Struct("<qdd8x")  # per item: worker pid, start, end (time.monotonic(): one clock for all processes)


class WorkerStartError(RuntimeError):
    """A worker process could not start: the judge (or the initializer) failed in a fresh process."""


# -- in the worker ---------------------------------------------------------------------------------------------
def _short(text: str, n: int = 500) -> str:
    return text if len(text) <= n else text[:n] + "..."


def address_space_mb() -> float:
    """This process's virtual address space (VmSize), in MiB: what RLIMIT_AS limits (0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def checked(result, failure_score: float) -> RewardResult:
    """The judge's return value as a plain ``RewardResult`` with a finite float score, or the failure it is.

    Rebuilt field by field so that what crosses the pipe is made of builtins only (a numpy score or a custom
    ``detail`` object from the judge's module could not be unpickled by a parent without that module).
    """
    if not isinstance(result, RewardResult):
        return RewardResult(failure_score, "error",
                            detail=f"score_fn returned {type(result).__name__}, expected RewardResult")
    score = result.score
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        return RewardResult(failure_score, "invalid_score", detail=_short(
            f"score is {type(score).__name__} ({score!r}), expected a real number; judge's reason {result.reason!r}"))
    if not math.isfinite(float(score)):
        return RewardResult(failure_score, "invalid_score",
                            detail=_short(f"score is {float(score)!r}; judge's reason {result.reason!r}"))
    return RewardResult(float(score), str(result.reason), _count(result.passed), _count(result.total),
                        str(result.detail))


def _count(value):
    return None if value is None else int(value)


def _grade(score_fn, item: dict, failure_score: float) -> RewardResult:
    try:
        return checked(score_fn(**item), failure_score)
    except MemoryError as e:  # the address-space cap (or the machine) ran out while grading this item
        return RewardResult(failure_score, "memory_exceeded", detail=_short(f"MemoryError: {e}"))
    except DataError as e:  # the problem's data, not the response: a trainer refuses the batch (DATA_ERROR)
        return RewardResult(failure_score, DATA_ERROR, detail=_short(f"{type(e).__name__}: {e}"))
    except BaseException as e:  # noqa: BLE001 - the judge's failure (sys.exit included) is that item's "error"
        return RewardResult(failure_score, "error", detail=_short(f"{type(e).__name__}: {e}"))


def _init_worker(score_fn, initializer, initargs, memory_mb) -> None:
    """pebble's initializer of every worker, and what the start probe runs.

    ``score_fn`` is passed only so that unpickling it imports the judge's module before the cap is set: the cap
    is on top of what the worker holds with the judge loaded."""
    if initializer is not None:
        initializer(*initargs)
    if memory_mb is not None:
        # The soft limit only: the judge's own children (the code sandbox) set their own limits from it.
        cap = int((address_space_mb() + memory_mb) * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _probe(conn, payload: bytes, memory_mb) -> None:
    """Body of the start probe: load the judge by name in a fresh process; send None, or the traceback.

    ``payload`` is ``pickle.dumps((score_fn, initializer, initargs))``, unpickled here rather than by
    multiprocessing, so that a module that fails to import (or quits) is reported with its traceback instead of
    killing the process before it can say."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        score_fn, initializer, initargs = pickle.loads(payload)
        _init_worker(score_fn, initializer, initargs, memory_mb)
    except BaseException:  # noqa: BLE001 - SystemExit from a module that quits on import included
        conn.send(_short(traceback.format_exc(), 4000))
        return
    conn.send(None)


def _record(fd: int | None, i: int, pid: int, start: float, end: float) -> None:
    if fd is not None:
        try:
            os.pwrite(fd, _RECORD.pack(pid, start, end), i * _RECORD.size)
        except OSError:
            pass  # no record: the layer then regrades a failed group item by item, and the deadline still holds


def _grade_task(score_fn, items: list[dict], indices: list[int], failure_score: float, progress: str) -> list:
    """One pebble task: grade ``items`` in order, writing into the batch's progress file which item this process
    is on (``indices``: their places in the batch)."""
    # pebble's SIGTERM handler cannot run while a judge is stuck in C; the default action kills at once.
    pebble_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        fd = os.open(progress, os.O_WRONLY)
    except OSError:
        fd = None  # the batch is over (a cancelled task still running), or no file could be made
    pid, results = os.getpid(), []
    try:
        for i, item in zip(indices, items):
            start = time.monotonic()
            _record(fd, i, pid, start, 0.0)
            results.append(_grade(score_fn, item, failure_score))
            _record(fd, i, pid, start, time.monotonic())
    finally:
        if fd is not None:
            os.close(fd)
        signal.signal(signal.SIGTERM, pebble_term)
    return results


# -- in the parent ---------------------------------------------------------------------------------------------
def exit_description(exitcode: int | None) -> str:
    """``exit status 3`` or ``killed by SIGSEGV`` for a process's exit code."""
    if exitcode is None:
        return "no exit status"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie does: pebble reaps its workers within its 0.1 s loop)."""
    try:
        os.kill(pid, 0)
    except OSError:  # ESRCH: gone and reaped; EPERM: the pid is another user's process by now
        return False
    return True


def _groups(items: Sequence[Mapping], key: str | None, max_group: int) -> list[list[int]]:
    """Indices of runs of consecutive items with the same ``item[key]``, at most ``max_group`` long
    (each item alone when ``key`` is None or the item has no such key)."""
    groups: list[list[int]] = []
    missing = last = object()
    for i, item in enumerate(items):
        value = missing if key is None else item.get(key, missing)
        if value is missing or last is missing or value != last or len(groups[-1]) >= max_group:
            groups.append([])
        groups[-1].append(i)
        last = value
    return groups


def _name(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


class _Progress:
    """The per-batch file the workers write their records into (one ``_RECORD`` per item, written at its offset).

    Where no file can be made, or written (no space), records are missing and read as "not started": a group that
    fails is then graded again item by item, an exit with status 0 comes back at the item's timeout, and the batch
    deadline still holds."""

    def __init__(self):
        try:
            folder = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # tmpfs: no disk writes
            self.fd, self.path = tempfile.mkstemp(prefix="klear-reward-", suffix=".progress", dir=folder)
        except OSError:
            self.fd, self.path = None, os.devnull

    def read(self, i: int) -> tuple[int, float, float]:
        record = b"" if self.fd is None else os.pread(self.fd, _RECORD.size, i * _RECORD.size)
        return _RECORD.unpack(record) if len(record) == _RECORD.size else (0, 0.0, 0.0)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            with contextlib.suppress(OSError):  # removed by someone else: nothing left to clean
                os.unlink(self.path)


@dataclass
class _Task:
    indices: list[int]
    seq: int  # order given to pebble, which is the order its workers take tasks in
    future: object
    done: int = 0  # items of the task the progress file shows finished
    gone_since: float | None = None  # when its worker process was first seen gone while pebble said nothing
    behind_since: float | None = None  # when a later task was first seen running while this one was not


class RewardPool:
    """pebble worker processes that turn a batch of judge calls into a list of ``RewardResult`` (module doc).

    Args:
        score_fn: picklable, module-level ``f(**item) -> RewardResult`` (e.g. ``score_math``).
        workers: worker processes (Klear: 10 for code; 2 on the project's 2-core machines).
        timeout_s: wall-clock limit per item, from the moment a worker starts it; an item past it is ended (its
            worker killed) within twice the limit, and its ``timeout`` detail names it. Keep it above the judge's
            own budget (``score_math``'s ``timeout_s``, 5 s of CPU by default) so the judge can report its own
            ``timeout``.
        failure_score: the score of every ``POOL_REASONS`` failure (reference §5: −1).
        group_key: item key whose equal values, in consecutive items, go to one worker as one task (``"gold"``
            for ``score_math``); None: one task per item.
        max_group: the most items in one task.
        start_method: multiprocessing start method of the workers: ``"spawn"`` (default, safe next to torch
            threads), ``"forkserver"`` or ``"fork"``.
        max_tasks: replace a worker after this many tasks (0: never); bounds slow leaks of a judge.
        initializer, initargs: run once in each worker when it starts (e.g. warm the judge up).
        memory_mb: address space (MiB) a worker may add to what it holds once started, enforced with
            ``RLIMIT_AS`` (virtual memory, so a judge's reservations count, not only what it touches); None: no cap.
            The default, 4 GiB, is far above what math-verify or the sandbox's parent side add (tens of MiB) and
            keeps a runaway sympy expansion from taking the machine's memory.
        start_timeout_s: how long the start probe may take (spawn, imports, initializer) before the pool fails;
            also the restart allowance in the batch deadline.

    Raises ``WorkerStartError`` when the judge cannot start in a fresh process (the pool is closed then),
    ``TypeError`` when ``score_fn`` does not pickle. Use as a context manager (``with RewardPool(score_math) as
    pool: pool.score_batch(items)``), or call ``close()`` yourself; after either, no worker process is left.
    """

    def __init__(self, score_fn: Callable[..., RewardResult], *, workers: int = 2, timeout_s: float = 10.0,
                 failure_score: float = -1.0, group_key: str | None = None, max_group: int = 16,
                 start_method: str = "spawn", max_tasks: int = 0, initializer: Callable | None = None,
                 initargs: Sequence = (), memory_mb: float | None = 4096, start_timeout_s: float = 120.0):
        if workers < 1 or max_group < 1:
            raise ValueError(f"workers and max_group must be >= 1, got {workers} and {max_group}")
        for name, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s), ("memory_mb", memory_mb)):
            if name == "memory_mb" and value is None:
                continue  # no cap
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        try:
            self._payload = pickle.dumps((score_fn, initializer, tuple(initargs)))
        except Exception as e:  # pickle raises several types for "not picklable by reference"
            raise TypeError(f"score_fn {_name(score_fn)} (with initializer and initargs) must be picklable: a "
                            f"module-level function of an importable module; {type(e).__name__}: {e}") from e
        self.score_fn = score_fn
        self.timeout_s = float(timeout_s)
        self.failure_score = float(failure_score)
        self.group_key = group_key
        self.max_group = max_group
        self.start_method = start_method
        self.max_tasks = max_tasks
        self.initializer = initializer
        self.initargs = tuple(initargs)
        self.memory_mb = memory_mb
        self.start_timeout_s = float(start_timeout_s)
        self._workers = workers
        self._ctx = multiprocessing.get_context(start_method)
        self._lock = threading.Lock()  # one batch at a time: callers in several threads (verl's reward loop) queue
        self._pool: ProcessPool | None = None
        self._closed = False
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    @property
    def workers(self) -> int:
        return self._workers

    def worker_pids(self) -> set[int]:
        """The pids of the worker processes pebble runs now (empty when no pebble pool runs). A worker killed at a
        per-item limit is replaced by a new process: a caller that checks for leftover processes tells them apart
        from this pool's own. pebble has no public accessor; this reads its worker manager."""
        pool = self._pool
        manager = getattr(pool, "_pool_manager", None) if pool is not None else None
        if manager is None:
            return set()
        return {pid for pid, process in dict(manager.worker_manager.workers).items() if process.is_alive()}

    # -- lifecycle -------------------------------------------------------------------------------------------
    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def close(self, wait: bool = True) -> None:
        """Stop the workers and reap them. ``wait`` is kept for callers of the earlier pool: pebble's ``stop``
        ends idle and busy workers alike (SIGTERM, SIGKILL after 3 s), and there is nothing left to wait for."""
        if self._closed:
            return
        self._closed = True
        self._stop_pool()

    def __del__(self):
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
                pass

    def _stop_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
            pool.join()

    def _start(self) -> None:
        """(Re)build pebble's pool, after the start probe."""
        if self._closed:
            raise RuntimeError("RewardPool is closed")
        self._stop_pool()
        self._probe_start()
        self._pool = ProcessPool(max_workers=self._workers, max_tasks=self.max_tasks, initializer=_init_worker,
                                 initargs=(self.score_fn, self.initializer, self.initargs, self.memory_mb),
                                 context=self._ctx)
        if not self._pool.active:  # `active` starts the workers now rather than at the first task
            raise RuntimeError("pebble's ProcessPool did not start")

    def _probe_start(self) -> None:
        """Load the judge in one fresh process (this pool's start method); raise ``WorkerStartError`` if it fails."""
        reader, writer = self._ctx.Pipe(duplex=False)
        # Not a daemon, so that an initializer may start processes of its own, as it may in a worker.
        process = self._ctx.Process(target=_probe, args=(writer, self._payload, self.memory_mb),
                                    name="klear-reward-probe", daemon=False)
        process.start()
        writer.close()  # only the probe's end stays open, so its death reads as EOF here
        what = f"score_fn {_name(self.score_fn)} could not start in a worker process (start_method " \
               f"{self.start_method!r})"
        try:
            if not connection.wait([reader, process.sentinel], self.start_timeout_s):
                raise WorkerStartError(f"{what}: the probe process was not ready after {self.start_timeout_s:g} s")
            try:
                error = reader.recv()
            except EOFError:
                process.join()
                raise WorkerStartError(
                    f"{what}: the process ended ({exit_description(process.exitcode)}) before it could load the "
                    f"judge: it died starting Python or running the main module's top level again; its traceback, "
                    f"if any, is on stderr") from None
            if error is not None:
                raise WorkerStartError(f"{what}; the worker's error:\n{error}")
        finally:
            if process.is_alive():
                process.kill()
            process.join()
            reader.close()

    # -- scoring ---------------------------------------------------------------------------------------------
    def score_batch(self, items: Sequence[Mapping]) -> list[RewardResult]:
        """``score_fn(**item)`` for each item, in the workers; results in input order.

        Raises only ``WorkerStartError`` (the judge no longer starts in a fresh process: the pool is closed) or
        what interrupts the caller (KeyboardInterrupt: this batch's tasks are cancelled, their workers killed)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardPool is closed")
            try:
                return self._score_batch([dict(it) for it in items])
            except WorkerStartError:
                self.close()
                raise

    def score(self, **item) -> RewardResult:
        """One item through the pool (convenience for notebooks)."""
        return self.score_batch([item])[0]

    def batch_deadline_s(self, n: int) -> float:
        """How long a batch of ``n`` items may take at most (module doc: lost tasks)."""
        return self.start_timeout_s + 2 * self.timeout_s * math.ceil(n / self._workers)

    def _score_batch(self, items: list[dict]) -> list[RewardResult]:
        if not items:
            return []
        if self._pool is None or not self._pool.active:  # broken (or wedged) at the end of the last batch
            self._start()
        batch = _Batch(self, items)
        try:
            batch.run(_groups(items, self.group_key, self.max_group), self.batch_deadline_s(len(items)))
        except BaseException:
            batch.cancel()  # a stale result must not reach the next batch; pebble kills the busy workers
            raise
        finally:
            batch.progress.close()
        return batch.results  # type: ignore[return-value]


class _Batch:
    """One ``score_batch`` call: its tasks on pebble's pool, and what the layer does where pebble stays silent."""

    def __init__(self, owner: RewardPool, items: list[dict]):
        self.owner, self.items = owner, items
        self.results: list[RewardResult | None] = [None] * len(items)
        self.progress = _Progress()
        self.tasks: dict[int, _Task] = {}  # seq -> task pebble has and the layer waits for, in seq order
        self.finished: collections.deque[_Task] = collections.deque()  # appended by pebble's threads
        self.wake = threading.Event()
        self.seq = itertools.count()
        self.last_started = -1  # the highest seq of a task a worker is known to have taken
        self.rebuild = False

    def fail(self, i: int, reason: str, detail: str) -> None:
        self.results[i] = RewardResult(self.owner.failure_score, reason, detail=detail)

    def submit(self, indices: list[int]) -> None:
        o = self.owner
        # A group's items are timed one by one by `watch`; pebble's limit on the whole task is the backstop.
        future = o._pool.schedule(_grade_task, timeout=o.timeout_s * len(indices), args=(
            o.score_fn, [self.items[i] for i in indices], indices, o.failure_score, self.progress.path))
        task = _Task(indices, next(self.seq), future)
        self.tasks[task.seq] = task

        def finished(_, task=task):
            self.finished.append(task)
            self.wake.set()
        future.add_done_callback(finished)

    def run(self, queue: list[list[int]], deadline_s: float) -> None:
        queue = collections.deque(queue)
        deadline = time.monotonic() + deadline_s
        watched = 0.0
        while queue or self.tasks:
            try:
                while queue:
                    self.submit(queue[0])
                    queue.popleft()
            except RuntimeError:  # pebble's pool is broken and refuses tasks ("Unexpected error within the Pool")
                self.rebuild = True
            if self.rebuild:
                self.restart(queue)
                continue
            self.wake.wait(_TICK_S)
            self.wake.clear()
            while self.finished:
                self.collect(self.finished.popleft(), queue)
            now = time.monotonic()
            if now - watched >= _TICK_S:
                watched = now
                self.watch(queue, now)
            if now > deadline and (queue or self.tasks):
                self.expire(deadline_s)
                return

    def current(self, task: _Task) -> tuple[int, int, float] | None:
        """(batch index, worker pid, start) of the item the task's worker is on, from the progress file."""
        while task.done < len(task.indices):
            pid, start, end = self.progress.read(task.indices[task.done])
            if end > 0:
                task.done += 1
                continue
            return (task.indices[task.done], pid, start) if start > 0 else None
        return None

    def settle(self, task: _Task, queue, reason: str, detail: str) -> None:
        """The item ``task``'s worker was on gets ``reason``; its other items are graded again, one per task. A
        ``timeout`` detail names the item, its limit and when it ended (``overrun``)."""
        on = self.current(task)
        k = on[0] if on else task.indices[0] if len(task.indices) == 1 else None
        if k is not None:
            self.fail(k, reason, self.overrun(k, on[2] if on else 0.0) if reason == "timeout" else detail)
        queue.extend([i] for i in task.indices if i != k)

    def overrun(self, k: int, start: float) -> str:
        """The detail of item ``k`` ended at its limit: which item, the limit, and (where the progress file says
        when it started) how long after its start the layer saw it ended."""
        text = f"item {k} ran past its limit of {self.owner.timeout_s:g} s (wall time); its worker was killed"
        return text + (f"; ended after {time.monotonic() - start:.1f} s" if start > 0 else "")

    def collect(self, task: _Task, queue) -> None:
        """A task pebble has finished."""
        if self.tasks.pop(task.seq, None) is None or task.future.cancelled():
            return  # settled by the layer already
        error = task.future.exception()
        if isinstance(error, BrokenProcessPool):  # pebble failed every task: grade them again on a new pool
            queue.append(task.indices)
            self.rebuild = True
            return
        if error is None or isinstance(error, (FutureTimeout, ProcessExpired)):
            self.last_started = max(self.last_started, task.seq)  # these went through a worker
        if error is None:
            for i, result in zip(task.indices, task.future.result()):
                self.results[i] = result
        elif isinstance(error, FutureTimeout):
            self.settle(task, queue, "timeout", "")
        elif isinstance(error, ProcessExpired):
            self.settle(task, queue, "worker_died",
                        f"the worker process ended while grading ({exit_description(error.exitcode)})")
        elif len(task.indices) > 1:  # an item or a result that does not pickle: find which, one by one
            queue.extend([i] for i in task.indices)
        else:
            self.fail(task.indices[0], "error", _short(f"item or result could not be sent: "
                                                       f"{type(error).__name__}: {error}"))

    def watch(self, queue, now: float) -> None:
        """Per-item limits inside groups, exits pebble does not report, tasks pebble lost (module doc)."""
        pending = [t for t in self.tasks.values() if not t.future.done()]
        running = [t for t in pending if t.future.running()]
        if running:
            self.last_started = max(self.last_started, running[-1].seq)
        for task in pending:
            if not task.future.running():
                if task.seq < self.last_started:
                    task.behind_since = task.behind_since or now
                if (task.behind_since is not None and now - task.behind_since >= _LOST_GRACE_S
                        and task.future.cancel()):
                    del self.tasks[task.seq]
                    if len(task.indices) > 1:
                        queue.extend([i] for i in task.indices)
                    else:
                        self.fail(task.indices[0], "worker_died", "pebble lost the task: the worker that took it "
                                  "ended before starting it")
                continue
            on = self.current(task)
            if on is None:
                continue
            _, pid, start = on
            if len(task.indices) > 1 and now - start > self.owner.timeout_s:
                reason, detail = "timeout", ""
            elif not _alive(pid):
                task.gone_since = task.gone_since or now
                if now - task.gone_since < _EXIT_GRACE_S:
                    continue
                reason, detail = "worker_died", "the worker process ended while grading (exit status 0)"
            else:
                continue
            if task.future.cancel():  # pebble kills the worker, if it still lives
                del self.tasks[task.seq]
                self.settle(task, queue, reason, detail)

    def restart(self, queue) -> None:
        """Grade every unfinished task again on a new pebble pool (after the start probe)."""
        for task in self.cancel():
            queue.append(task.indices)
        self.rebuild = False
        self.owner._start()

    def cancel(self) -> list[_Task]:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.future.cancel()
        self.tasks.clear()
        return tasks

    def expire(self, deadline_s: float) -> None:
        """The batch deadline: every item still without a result is ``timeout``; pebble's pool is rebuilt at the
        next batch (it may be wedged: a worker that died holding its channel lock)."""
        self.cancel()
        for i, result in enumerate(self.results):
            if result is None:
                self.fail(i, "timeout", f"no result by the batch deadline ({deadline_s:g} s): pebble lost the "
                          f"task or stalled")
        self.owner._stop_pool()
