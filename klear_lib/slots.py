"""Unit slots: at most N units at once across every process of a machine (``klear reproduce``'s notebooks run at
once, each with its own worker pool, over one folder of N slots; ``klear_lib.schedule``). A worker takes a slot
(``fcntl.flock`` on one of N files) before a unit and gives it back after (``klear_lib.experiment``); without
``KLEAR_UNIT_SLOTS`` nothing is held. This module imports nothing of klear_lib: the worker side (experiment) and the
driver side (schedule) both sit above it."""

from __future__ import annotations

import contextlib
import os
import pathlib
import time

SLOTS_ENV = "KLEAR_UNIT_SLOTS"  # the folder of unit slots (set by klear reproduce for its children)
SLOT_POLL_S = 0.05  # how often the one waiting worker (it holds the queue lock) looks for a free slot
QUEUE_FILE = "queue"


def make_slots(folder: str | os.PathLike, n: int) -> pathlib.Path:
    """A folder of ``n`` unit slots (``slot-000`` ...) and the queue lock, for ``KLEAR_UNIT_SLOTS``."""
    if n < 1:
        raise ValueError(f"unit slots: need at least 1, got {n}")
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"slot-{i:03d}").touch()
    (folder / QUEUE_FILE).touch()
    return folder


@contextlib.contextmanager
def unit_slot(folder: str | os.PathLike | None = None):
    """Hold one of the unit slots of ``folder`` (default ``$KLEAR_UNIT_SLOTS``) for the block; yields its name, or
    None (and does nothing) where no slot folder is named or it holds no slots. Waiters queue on an exclusive lock
    of the queue file (blocked in the kernel, no CPU); the one at its head polls the slots every ``SLOT_POLL_S``
    and lets the next in
    as soon as it holds one, so no slot is held while waiting. A slot is an ``flock``: the kernel frees it when its
    holder dies however it dies; it is unlocked explicitly on the way out, which frees it even if a process the unit
    forked still holds the file open."""
    folder = folder or os.environ.get(SLOTS_ENV)
    paths = sorted(pathlib.Path(folder).glob("slot-*")) if folder else []
    if not paths:  # none named, or a folder of another machine (a Ray task gets the driver's KLEAR_ variables)
        yield None
        return
    import fcntl

    folder = pathlib.Path(folder)
    held = None
    with open(folder / QUEUE_FILE, "a") as queue:
        fcntl.flock(queue, fcntl.LOCK_EX)
        try:
            while held is None:
                for path in paths:
                    f = open(path, "a")  # noqa: SIM115 (held until the unit ends)
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        f.close()
                        continue
                    held = f
                    break
                else:
                    time.sleep(SLOT_POLL_S)
        finally:
            fcntl.flock(queue, fcntl.LOCK_UN)
    try:
        yield pathlib.Path(held.name).name
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        held.close()
