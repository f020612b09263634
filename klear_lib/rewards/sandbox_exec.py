"""Host side of one sandbox run: start the command, collect its capped output, and end it, with every process
it started, at a deadline. Used by `sandbox` for bwrap (and for the unsandboxed opt-out)."""

from __future__ import annotations

import os
import re
import select
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

# The minimal env also for bwrap itself: its environment is readable in the sandbox as /proc/1/environ.
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


class Killer:
    """Ends a sandbox so that, when `run_python_tests` returns, no process of it is left.

    Killing bwrap itself is not enough: with `--die-with-parent` the zygote would die too, but only after bwrap
    is gone, and then nobody waits for it. Killing the zygote (the namespace's init) instead makes the kernel
    kill every process inside, and bwrap, which waits for it, exits once they are all gone: waiting for bwrap
    is then waiting for the whole tree. The init is signalled through a pidfd checked to be bwrap's child, so a
    recycled pid is never hit. Without a sandbox the process group is killed, which a setsid() escapes.
    """

    def __init__(self, status_fd: int | None):
        self.status_fd, self.status = status_fd, b""
        if status_fd is not None:
            os.set_blocking(status_fd, False)

    @property
    def init_pid(self) -> int | None:
        """The init's host pid from bwrap's --json-status-fd (None: the sandbox never started)."""
        if self.status_fd is not None:
            try:
                while chunk := os.read(self.status_fd, 4096):
                    self.status += chunk
            except BlockingIOError:
                pass
        m = re.search(rb'"child-pid": *(\d+)', self.status)
        return int(m.group(1)) if m else None

    def kill(self, proc: subprocess.Popen) -> None:
        pid = self.init_pid
        if pid is None and self.status_fd is not None:  # bwrap may have forked it a moment ago: its pid is due
            select.select([self.status_fd], [], [], 0.5)
            pid = self.init_pid
        fd = _pidfd_of_child(pid, proc.pid) if pid is not None else None
        if fd is not None:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it just exited: bwrap waits for it and exits by itself; killing bwrap now would orphan it
            finally:
                os.close(fd)
            return
        try:  # no init (the sandbox never started, or it is already reaped), or no sandbox: the group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self, proc: subprocess.Popen) -> None:
        """Wait for bwrap (it outlives the zygote, which outlives everything else in the sandbox)."""
        if not _wait_exit(proc, 10):  # bwrap stuck after its child died: never seen, but never hang on it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if self.status_fd is None:
            try:  # unsandboxed: children that stayed in the group (a setsid escapes this)
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _pidfd_of_child(pid: int, parent: int) -> int | None:
    """A pidfd on `pid` if it is (still) a child of `parent`, else None. `parent` is our unreaped child, so its pid
    cannot have been recycled; a `pid` whose parent it is must be the process we mean."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):  # gone, or Linux < 5.3
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ppid = int(f.read().rsplit(b")", 1)[1].split()[1])  # after "(comm)": state, then ppid
    except (OSError, ValueError, IndexError):
        ppid = None
    if ppid != parent:
        os.close(fd)
        return None
    return fd


@dataclass(frozen=True)
class Raw:
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool


def execute(argv, stdin_fd: int, budget_s: float, cap: int, killer: Killer, *, pass_fds=(), cwd=None) -> Raw:
    """Start `argv` in its own session with `stdin_fd` as stdin, collect its output (stdout up to `cap` bytes,
    stderr up to 64 KiB), and kill it at the deadline or past the cap."""
    deadline = time.monotonic() + budget_s
    # The minimal env also for bwrap itself: its environment is readable in the sandbox as /proc/1/environ.
    proc = subprocess.Popen(argv, stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=pass_fds, start_new_session=True, cwd=cwd, env=dict(SANDBOX_ENV))
    out, err = bytearray(), bytearray()
    timed_out = False
    try:
        timed_out = _pump(proc, out, err, deadline, cap, 64 << 10)
        if not timed_out:
            timed_out = not _wait_exit(proc, deadline - time.monotonic())
    finally:
        if proc.poll() is None:
            killer.kill(proc)
        killer.reap(proc)
        proc.stdout.close()
        proc.stderr.close()
    return Raw(proc.returncode, bytes(out), bytes(err), timed_out)


def _wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait up to `timeout` s for `proc` to exit; True if it did. A pidfd wakes us at the exit, where Popen.wait's
    sleep-polling would add up to milliseconds to every call."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (OSError, AttributeError):  # already reaped, or Linux < 5.3
        try:
            proc.wait(timeout=max(0.0, timeout))
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        select.select([fd], [], [], max(0.0, timeout))
    finally:
        os.close(fd)
    return proc.poll() is not None


def _pump(proc, out: bytearray, err: bytearray, deadline: float, out_cap: int, err_cap: int) -> bool:
    """Read stdout/stderr until both close; True if the deadline came first or stdout passed its cap (the caller
    kills); stderr past its cap is read and dropped."""
    sel = selectors.DefaultSelector()
    caps = {proc.stdout.fileno(): (out, out_cap), proc.stderr.fileno(): (err, err_cap)}
    for fd in caps:
        sel.register(fd, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf, cap = caps[key.fd]
                buf += chunk[: cap + 1 - len(buf)]
                if key.fd == proc.stdout.fileno() and len(buf) > cap:
                    return True  # more than the zygote may send: it is not behaving, stop it
        return False
    finally:
        sel.close()
