"""Run untrusted Python in a bubblewrap sandbox: the executor behind the code reward (reference §5).

Reference §5: run the tests "in a sandbox with no network, a private filesystem, and limits on processes,
files, memory and time". Klear used Firejail inside a Pebble process pool; this module uses bubblewrap
(Debian package `bubblewrap`, >= 0.8), which needs no daemon and no setuid helper.

What the program sees (see `_bwrap_argv`):

    /                       the host's root, read-only
    /root /home /run /tmp   empty tmpfs masks: home directories hold secrets, /run holds sockets (a unix socket
    /var/tmp $HOME          stays connectable on a read-only mount); the interpreter's install is re-bound
    + `hide_paths`          read-only where a mask hid it (pyenv lives in /root)
    /tmp                    private, size-limited tmpfs; the working directory; holds main.py
    /dev                    minimal devices, read-only; /dev/shm a size-limited tmpfs (multiprocessing needs it)
    /proc                   a new procfs showing only the sandbox's own PID namespace
    network                 a new, empty network namespace (its loopback is not the host's)

Limits, set by `_WRAPPER` inside the sandbox before the program runs: CPU seconds, address space, processes
(RLIMIT_NPROC), file size, open files, no core dumps. The wall-clock `timeout_s` is enforced from outside by
killing the sandbox's PID-namespace init, which takes every descendant with it (double-forked, setsid'd daemons
included); the program's own exit ends the namespace the same way. When `run_python` returns, nothing of the
run is left (see `_Killer`).

Privileges. RLIMIT_NPROC is ignored for uid 0 (and for any uid that maps to host root), so a fork bomb run as
root is unbounded. As root, bwrap therefore runs without a user namespace and `_WRAPPER` drops to a random
unprivileged uid/gid from a high range, after which the NPROC count is this sandbox's alone and root-only files
(/etc/shadow) are unreadable. As non-root, bwrap creates a user namespace (`--unshare-user`) and the program
keeps the caller's uid; the kernel counts NPROC per user namespace level (ucounts, Linux >= 5.14).

Output: stdout and stderr are read incrementally and capped (`max_output_bytes` each); a program that exceeds
a cap is killed (`output_limit_exceeded`), so a 1 GB print costs neither memory nor a drain of 1 GB.

Without bwrap, `run_python` raises `SandboxUnavailableError` saying how to install it. Running unsandboxed
needs `unsafe_no_sandbox=True` or `KLEAR_UNSAFE_NO_SANDBOX=1`, and warns on every call.
"""

from __future__ import annotations

import functools
import os
import random
import re
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, replace

UNSAFE_ENV_VAR = "KLEAR_UNSAFE_NO_SANDBOX"
MIN_BWRAP_VERSION = (0, 8, 0)  # --disable-userns (0.8), --size (0.7), --json-status-fd and --perms on tmpfs

# Masked with empty tmpfs on top of the read-only root (the caller's $HOME is added at run time).
MASKED_DIRS = ("/root", "/home", "/run", "/tmp", "/var/tmp")
# As root the program runs as a random uid/gid in this range: never a real account, and (almost surely) distinct
# from every concurrent sandbox, so each sandbox has its own RLIMIT_NPROC budget.
SANDBOX_UID_RANGE = (1_900_000_000, 2_000_000_000)
# The only environment the program gets: nothing of the caller's (API keys, tokens) leaks in.
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
PROGRAM_PATH = "/tmp/main.py"


class SandboxUnavailableError(RuntimeError):
    """bwrap is missing, too old, or cannot create namespaces on this machine."""


class UnsafeSandboxWarning(RuntimeWarning):
    """Untrusted code is being run without a sandbox."""


# Shown on every call, not once per call site: running model-written code unsandboxed must never go unnoticed.
warnings.simplefilter("always", UnsafeSandboxWarning)
_unsafe_runs = 0


@dataclass(frozen=True)
class SandboxResult:
    """What one run did. `returncode` is the program's exit status (bwrap reports death by signal N as 128 + N;
    a run killed on timeout or output overflow reads -9); `killed_by_signal` is that N, best effort."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    killed_by_signal: int | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    output_limit_exceeded: bool = False
    sandboxed: bool = True

    @property
    def ok(self) -> bool:
        """Exited normally with status 0 inside its limits."""
        return self.returncode == 0 and not self.timed_out and not self.output_limit_exceeded


# Runs inside the sandbox as `python -I -S -c _WRAPPER uid cpu_s as_bytes nproc fsize nofile path`: set the limits,
# drop root, then run the program in this same interpreter as __main__ (a second exec would cost a whole
# interpreter start per test). Limits are hard (soft = hard) so that the program cannot raise them back. Cheap on
# purpose, it is paid on every test: `posix` is built in where `os` costs ~1 ms to import, and exec() of the source
# skips the ~1 ms the first compile() call spends building the ast module's types; the price is that tracebacks
# name the program "<string>" (line numbers are right).
_WRAPPER = r"""
import posix, resource as R, sys
_a = [int(x) for x in sys.argv[1:7]]
for _k, _v in zip((R.RLIMIT_CPU, R.RLIMIT_AS, R.RLIMIT_NPROC, R.RLIMIT_FSIZE, R.RLIMIT_NOFILE, R.RLIMIT_CORE),
                  _a[1:] + [0]):
    R.setrlimit(_k, (_v, _v))
if _a[0] >= 0 and posix.getuid() == 0:
    posix.setgroups([]); posix.setresgid(_a[0], _a[0], _a[0]); posix.setresuid(_a[0], _a[0], _a[0])
_p = sys.argv[7]
sys.argv = [_p]
_m = type(sys)("__main__")
_m.__file__ = _p
_m.__builtins__ = __builtins__
sys.modules["__main__"] = _m
with open(_p, "rb") as _f:
    _s = _f.read()
del posix, R, _a, _k, _v, _p, _f
exec(_s, _m.__dict__)
"""


def run_python(
    code: str,
    *,
    stdin: str = "",
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    max_processes: int = 16,
    max_file_mb: int = 16,
    max_open_files: int = 64,
    tmpfs_mb: int = 64,
    max_output_bytes: int = 8 << 20,
    python: str | None = None,
    hide_paths: tuple[str, ...] = (),
    unsafe_no_sandbox: bool = False,
) -> SandboxResult:
    """Run `code` as a Python program (stdlib only: `-I -S`) with `stdin`, sandboxed, within `timeout_s` wall seconds.

    memory_mb: address-space limit (RLIMIT_AS) of each process. max_processes: RLIMIT_NPROC (threads count too;
    so does the sandbox's own init when not root). max_file_mb: largest file the program may write (RLIMIT_FSIZE).
    tmpfs_mb: size of each of the two writable tmpfs (/tmp and /dev/shm). python: the interpreter, default the
    real binary behind `sys.executable` (a venv's site-packages are not used). hide_paths: more host directories
    to mask, e.g. where datasets with the hidden tests live (the rest of the host stays readable: a program that
    can read its own tests can print their answers). Raises `SandboxUnavailableError`
    if bwrap is missing or cannot run here, unless `unsafe_no_sandbox` (or $KLEAR_UNSAFE_NO_SANDBOX=1).
    """
    python = os.path.realpath(python or sys.executable)
    cpu_s = int(timeout_s) + 1  # a backstop only: the wall-clock kill below is the real limit
    limits = [cpu_s, memory_mb << 20, max_processes, max_file_mb << 20, max_open_files]
    unsafe = unsafe_no_sandbox or os.environ.get(UNSAFE_ENV_VAR, "") not in ("", "0")
    if unsafe:
        global _unsafe_runs
        _unsafe_runs += 1  # in the message, so that even the "default" filter (once per text) shows every call
        why = "unsafe_no_sandbox=True" if unsafe_no_sandbox else f"{UNSAFE_ENV_VAR}=1"
        warnings.warn(f"running untrusted code WITHOUT a sandbox ({why}; unsandboxed run #{_unsafe_runs})",
                      UnsafeSandboxWarning, stacklevel=2)
        return _run_unsandboxed(code, stdin, timeout_s, python, limits, max_output_bytes)

    bwrap = _bwrap_path()
    uid = random.SystemRandom().randrange(*SANDBOX_UID_RANGE) if os.geteuid() == 0 else -1
    code_fd = os.memfd_create("klear-main-py", 0)  # bwrap copies it into the sandbox's /tmp (--file)
    status_r, status_w = os.pipe()  # bwrap's --json-status-fd: the init's pid, and whether the sandbox started
    try:
        os.write(code_fd, code.encode())
        os.lseek(code_fd, 0, os.SEEK_SET)
        argv = _bwrap_argv(bwrap, python, code_fd, status_w, tmpfs_mb << 20, hide_paths)
        argv += [python, "-I", "-S", "-c", _WRAPPER, str(uid), *map(str, limits), PROGRAM_PATH]
        killer = _Killer(status_r)
        result = _execute(argv, stdin, timeout_s, max_output_bytes, killer, pass_fds=(code_fd, status_w))
        started = killer.init_pid is not None
    finally:
        for fd in (code_fd, status_r, status_w):
            os.close(fd)
    if not started and not result.timed_out:
        raise SandboxUnavailableError(
            "bubblewrap could not start the sandbox. If the error below is about namespaces, this machine does not "
            "allow them (nested container, or kernel.apparmor_restrict_unprivileged_userns=1 on Ubuntu >= 23.10, or "
            "user.max_user_namespaces=0): run as root, or allow unprivileged user namespaces, or give the container "
            f"CAP_SYS_ADMIN. bwrap said:\n{result.stderr.strip()}")
    signum = -result.returncode if result.returncode < 0 else None
    if signum is None and 128 < result.returncode < 128 + 65:  # bwrap's convention for a child killed by a signal
        signum = result.returncode - 128
    return replace(result, killed_by_signal=signum)


@functools.lru_cache(maxsize=1)
def _bwrap_path() -> str:
    """The bwrap binary, checked once per process for presence and version."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailableError(
            "bubblewrap (bwrap) is not installed; the code reward runs model-written programs only inside it. "
            "Install it: `apt-get install bubblewrap` (Debian/Ubuntu; `make` in this repository does it), "
            "`dnf install bubblewrap` (Fedora). To run unsandboxed anyway (dangerous), pass unsafe_no_sandbox=True "
            f"or set {UNSAFE_ENV_VAR}=1.")
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    if m is None or tuple(map(int, m.groups())) < MIN_BWRAP_VERSION:
        raise SandboxUnavailableError(
            f"bubblewrap >= {'.'.join(map(str, MIN_BWRAP_VERSION))} is needed, found {out.strip() or 'unknown'} "
            f"at {path}: upgrade it (`apt-get install bubblewrap` from Debian 12 / Ubuntu 24.04 or newer).")
    return path


def _bwrap_argv(bwrap: str, python: str, code_fd: int, status_fd: int, tmpfs_bytes: int,
                hide_paths: tuple[str, ...] = ()) -> list[str]:
    """The bwrap command line up to `--`; each group says why it is there."""
    root = os.geteuid() == 0
    argv = [bwrap]
    # Namespaces: own PIDs (a kill of init reaps everything), no network, own IPC/UTS/cgroup view. As non-root a
    # user namespace (and no nested ones). As root none, so that _WRAPPER can drop to a real unprivileged uid.
    argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if root:
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]  # only what the drop needs
    else:
        argv += ["--unshare-user", "--disable-userns"]
    # Lifetime: die if the caller dies; setsid so the program cannot push input into our terminal (TIOCSTI).
    argv += ["--die-with-parent", "--new-session", "--json-status-fd", str(status_fd)]
    # Filesystem: host read-only, secrets and sockets masked, the interpreter re-exposed if a mask hid it.
    argv += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    masks = _masked_dirs(hide_paths)
    for d in masks:
        if d == "/tmp":
            argv += ["--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", d]
        else:
            argv += ["--tmpfs", d]
    for keep in _python_roots(python):
        argv += _rebind_under_masks(keep, masks)
    argv += ["--perms", "0444", "--file", str(code_fd), PROGRAM_PATH, "--chdir", "/tmp"]
    argv += ["--clearenv", *[a for k, v in SANDBOX_ENV.items() for a in ("--setenv", k, v)], "--"]
    return argv


def _masked_dirs(extra: tuple[str, ...] = ()) -> list[str]:
    """MASKED_DIRS, the caller's $HOME and `extra`, as real paths, minus any inside another (bwrap mounts in order)."""
    dirs: list[str] = []
    home = os.path.expanduser("~")
    for d in sorted({os.path.realpath(p) for p in (*MASKED_DIRS, home, *extra) if os.path.isdir(p)}):
        if d != "/" and not any(_is_under(d, m) for m in dirs):
            dirs.append(d)
    return dirs


@functools.lru_cache(maxsize=8)
def _python_roots(python: str) -> tuple[str, ...]:
    """Directories the interpreter needs: its install prefix (stdlib, libpython) and its binary's directory."""
    out = subprocess.run([python, "-I", "-S", "-c", "import sys; print(sys.base_prefix); print(sys.base_exec_prefix)"],
                         capture_output=True, text=True, check=True).stdout.split()
    roots: list[str] = []
    for p in sorted({os.path.realpath(p) for p in out} | {os.path.dirname(python)}):
        if not any(_is_under(p, r) for r in roots):  # sorted: a parent comes before its children
            roots.append(p)
    return tuple(roots)


def _rebind_under_masks(path: str, masks: list[str]) -> list[str]:
    """`--ro-bind path path` if a mask covers it, creating the parents world-traversable (bwrap makes them 0700)."""
    mask = next((m for m in masks if _is_under(path, m) and path != m), None)
    if mask is None:
        return []
    parts, argv, cur = os.path.relpath(path, mask).split(os.sep), [], mask
    for p in parts[:-1]:
        cur = os.path.join(cur, p)
        argv += ["--perms", "0755", "--dir", cur]
    return argv + ["--ro-bind", path, path]


def _is_under(path: str, d: str) -> bool:
    return path == d or path.startswith(d.rstrip("/") + "/")


def _run_unsandboxed(code, stdin, timeout_s, python, limits, max_output_bytes) -> SandboxResult:
    """The explicit opt-out: limits still apply, but no namespaces, no uid drop, and a setsid daemon escapes."""
    with tempfile.TemporaryDirectory(prefix="klear-unsafe-") as cwd:
        path = os.path.join(cwd, "main.py")
        with open(path, "w") as f:
            f.write(code)
        argv = [python, "-I", "-S", "-c", _WRAPPER, "-1", *map(str, limits), path]
        result = _execute(argv, stdin, timeout_s, max_output_bytes, _Killer(None), cwd=cwd)
    signum = -result.returncode if result.returncode < 0 else None
    return replace(result, killed_by_signal=signum, sandboxed=False)


class _Killer:
    """Ends a run so that, when `run_python` returns, no process of it is left.

    Killing bwrap itself is not enough: it dies at once while its PID namespace is still being torn down, so for
    a moment the program's processes live on. Killing the namespace's init instead makes the kernel kill every
    process inside, and bwrap exits only once they are all gone: waiting for bwrap is then waiting for the whole
    tree. The init is signalled through a pidfd checked to be bwrap's child, so a recycled pid is never hit.
    Without a sandbox (or if the init cannot be reached) the process group is killed, which a setsid() escapes.
    """

    def __init__(self, status_fd: int | None):
        self.status_fd, self.status, self.pidfd = status_fd, b"", None
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
        fd = _pidfd_of_child(pid, proc.pid) if pid is not None else None
        if fd is not None:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                self.pidfd = fd
                return
            except ProcessLookupError:
                os.close(fd)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self, proc: subprocess.Popen) -> None:
        """Wait for bwrap (it outlives its init, which outlives everything else), then release the pidfd."""
        if not _wait_exit(proc, 10):  # bwrap stuck after its init died: never seen, but never hang on it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if self.pidfd is not None:
            select.select([self.pidfd], [], [], 10)  # readable once the init has exited: at once
            os.close(self.pidfd)
        elif self.status_fd is None:
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


def _execute(argv, stdin, timeout_s, cap, killer: _Killer, *, pass_fds=(), cwd=None) -> SandboxResult:
    """Start `argv` in its own session, feed stdin, collect capped output, and kill it at the deadline."""
    start = time.monotonic()
    deadline = start + timeout_s
    # The minimal env also for bwrap itself: its environment is readable in the sandbox as /proc/1/environ.
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=pass_fds, start_new_session=True, cwd=cwd, env=dict(SANDBOX_ENV))
    out, err = bytearray(), bytearray()
    timed_out = overflow = False
    try:
        timed_out, overflow = _pump(proc, stdin.encode(), out, err, deadline, cap)
        if not (timed_out or overflow):
            timed_out = not _wait_exit(proc, deadline - time.monotonic())
    finally:
        if proc.poll() is None:
            killer.kill(proc)
        killer.reap(proc)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()
    return SandboxResult(
        returncode=proc.returncode,
        stdout=out[:cap].decode(errors="replace"), stderr=err[:cap].decode(errors="replace"),
        timed_out=timed_out, duration_s=time.monotonic() - start,
        stdout_truncated=len(out) > cap, stderr_truncated=len(err) > cap, output_limit_exceeded=overflow)


def _wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait up to `timeout` s for `proc` to exit; True if it did. A pidfd wakes us at the exit, where Popen.wait's
    sleep-polling would add up to milliseconds to every test."""
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


def _pump(proc, data: bytes, out: bytearray, err: bytearray, deadline: float, cap: int) -> tuple[bool, bool]:
    """Write stdin and read stdout/stderr until both close: (timed_out, output overflow); the caller kills."""
    sel = selectors.DefaultSelector()
    fds = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    win = proc.stdin.fileno()
    os.set_blocking(win, False)
    if data:
        sel.register(win, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    pos = 0
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return True, False
            for key, _ in sel.select(timeout=left):
                if key.fd == win:
                    try:
                        pos += os.write(win, data[pos:pos + 65536])
                    except BlockingIOError:
                        continue
                    except OSError:  # EPIPE: the program exited or closed stdin without reading it all; fine
                        pos = len(data)
                    if pos >= len(data):
                        sel.unregister(win)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = fds[key.fd]
                buf += chunk[: cap + 1 - len(buf)]  # keep one byte past the cap to know it was exceeded
                if len(buf) > cap:
                    return False, True
        return False, False
    finally:
        sel.close()


def sandbox_status() -> dict:
    """A one-call health check for notebooks and CI: can programs be sandboxed here, and how."""
    try:
        r = run_python("import os; print(os.getuid())", timeout_s=10)
    except SandboxUnavailableError as e:
        return {"available": False, "error": str(e)}
    return {"available": r.ok, "bwrap": _bwrap_path(), "uid_inside": r.stdout.strip(), "as_root": os.geteuid() == 0,
            "startup_s": round(r.duration_s, 4)}
