"""The worker processes behind ``RewardPool``: what runs in a worker, and the parent's handle on one.

One worker is one process with its own pipe to the parent. It loads the judge, reports ``ready``, then takes one
task at a time (a list of items) and sends one result per item as soon as that item is graded. The parent
(``klear_lib.rewards.pool``) therefore always knows which item a worker is on and since when, and whether the
process still lives (its sentinel), which is what per-item limits need.

Why not pebble (the pool was built on it before): pebble ignores a worker that exits with status 0, so an item
whose worker called ``os._exit(0)`` waited for its timeout; a worker that died after taking a task but before
acknowledging it lost that task, which then never timed out (a judge module that quit on import made a 5-item
batch wait 440 s for the batch deadline); a pool whose workers die at start is broken for good with
"All workers expired"; and a task's results only come back when the whole task ends, so one hung item in a
group of 16 held the other 15 hostage.

Messages, worker -> parent: ``("ready", pid)``, ``("start_error", text)``, ``("result", task_id, k, RewardResult)``.
Parent -> worker: ``(task_id, items, failure_score)`` or ``None`` (stop).
"""

from __future__ import annotations

import math
import numbers
import os
import pickle
import resource
import signal
import time
import traceback
from multiprocessing.connection import Connection

from klear_lib.rewards.result import RewardResult

READY, START_ERROR, RESULT = "ready", "start_error", "result"


class WorkerStartError(RuntimeError):
    """A worker process could not start: the judge (or the initializer) failed in a fresh process."""


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
    except Exception as e:  # noqa: BLE001 - the judge's failure is that item's "error"
        return RewardResult(failure_score, "error", detail=_short(f"{type(e).__name__}: {e}"))


def worker_main(conn: Connection, payload: bytes, memory_mb: float | None) -> None:
    """Body of a worker process: load the judge, say ready, grade tasks until told to stop or the parent goes.

    ``payload`` is ``pickle.dumps((score_fn, initializer, initargs))``, unpickled here rather than by
    multiprocessing, so that a judge module that fails to import in a fresh process is reported to the parent
    with its traceback (the parent raises ``WorkerStartError``) instead of killing the worker before it can say.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops the workers
    try:
        score_fn, initializer, initargs = pickle.loads(payload)
        if initializer is not None:
            initializer(*initargs)
        if memory_mb is not None:
            # The soft limit only: the judge's own children (the code sandbox) set their own limits from it.
            cap = int((address_space_mb() + memory_mb) * 2**20)
            resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except BaseException:  # noqa: BLE001 - SystemExit from a module that quits on import included
        conn.send((START_ERROR, _short(traceback.format_exc(), 4000)))
        return
    conn.send((READY, os.getpid()))
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the parent is gone
            return
        if task is None:
            return
        task_id, items, failure_score = task
        for k, item in enumerate(items):
            result = _grade(score_fn, item, failure_score)
            try:
                conn.send((RESULT, task_id, k, result))
            except Exception as e:  # noqa: BLE001 - e.g. a detail too large for memory: say so, keep going
                conn.send((RESULT, task_id, k, RewardResult(failure_score, "error", detail=_short(
                    f"result could not be sent: {type(e).__name__}: {e}"))))


def exit_description(exitcode: int | None) -> str:
    """``exit status 3`` or ``killed by SIGSEGV`` for a worker's ``Process.exitcode``."""
    if exitcode is None:
        return "no exit status"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


class Worker:
    """The parent's handle on one worker: its process, its pipe, and the task it is on.

    ``task`` is ``(task_id, indices)`` (the batch indices of the items sent) and ``done`` how many of them have
    come back; ``since`` is when the item now being graded started (when the task was sent, then when the
    previous item's result arrived).
    """

    def __init__(self, ctx, payload: bytes, memory_mb: float | None):
        self.conn, child = ctx.Pipe(duplex=True)
        # Not a daemon, so that a judge may start processes of its own; the pool (and its atexit hook) ends it.
        self.process = ctx.Process(target=worker_main, args=(child, payload, memory_mb),
                                   name="klear-reward-worker", daemon=False)
        self.process.start()
        child.close()  # the parent keeps only its end, so the worker's death reads as EOF here
        self.started = time.monotonic()
        self.ready = False
        self.task: tuple[int, list[int]] | None = None
        self.done = 0
        self.since = 0.0
        self.n_tasks = 0

    @property
    def sentinel(self):
        return self.process.sentinel

    def current(self) -> int:
        """Batch index of the item this worker is grading now."""
        return self.task[1][self.done]

    def remaining_after_current(self) -> list[int]:
        return self.task[1][self.done + 1:]

    def send(self, task_id: int, indices: list[int], items: list[dict], failure_score: float) -> None:
        self.conn.send((task_id, items, failure_score))
        self.task, self.done, self.since = (task_id, indices), 0, time.monotonic()

    def kill(self) -> None:
        """SIGKILL and reap (no zombie); a no-op on a process that already ended."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()

    def request_stop(self) -> None:
        """Ask an idle worker to exit (it returns from ``worker_main`` when it reads this)."""
        try:
            self.conn.send(None)
        except OSError:
            pass  # already gone

    def stop(self, timeout_s: float) -> None:
        """Ask an idle worker to exit, then make sure it did."""
        self.request_stop()
        self.process.join(timeout_s)
        self.kill()
