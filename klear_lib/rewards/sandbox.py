"""Run untrusted Python in a bubblewrap sandbox: the executor behind the code reward (reference §5).

Reference §5: run the tests "in a sandbox with no network, a private filesystem, and limits on processes,
files, memory and time". Klear used Firejail inside a Pebble process pool; this module uses bubblewrap
(Debian package `bubblewrap`, >= 0.8), which needs no daemon and no setuid helper.

One sandbox per sample. `run_python_tests(program, tests)` starts one sandbox whose pid 1 is a warm interpreter
(`sandbox_zygote`): it compiles the program once and forks a fresh process per test, with the test's own stdin,
output capture, per-test timeout and rlimits, so a test that hangs, crashes, floods its output or leaves daemons
behind costs only itself. `run_python(code, stdin=...)` is the one-test case.

What the program sees, default deny (see `_bwrap_argv` and `sandbox_root`):

    /                  an empty, read-only tmpfs holding only the interpreter binary, its stdlib (read-only;
                       site-packages, test and config-* hidden), the libraries it maps, file by file, and the
                       loader's symlinks: no /home, /root, /etc, /run (no host sockets), repository or data; all of
                       it locked in the page cache once per process before a first sample (`resident_files`)
    /tmp               private, size-limited tmpfs; the working directory; holds main.py (read-only)
    /dev               minimal devices, read-only; /dev/shm a size-limited tmpfs (multiprocessing needs it)
    /proc              a new procfs showing only the sandbox's own PID namespace, the zygote's entry (/proc/1)
                       hidden under an empty read-only tmpfs (its counters grow with what tests print), and every
                       global file or directory of the kernel masked (`_proc_mask_argv`: /proc/stat, loadavg, sys)
    network            a new, empty network namespace (its loopback is not the host's)
    syscalls           a seccomp filter (`seccomp`): no namespaces, ptrace, mount, keyring, bpf, perf, modules,
                       io_uring, sockets but unix ones, ...: EPERM, in root and non-root mode alike; and a second
                       one each test stacks before the program runs: no socket of any family, no page-cache
                       query or eviction (mincore, cachestat, preadv2's flags, fadvise, madvise's PAGEOUT/COLD),
                       no pipe, pidfd or sysinfo (counters of the whole machine)

Issue 45 (channels from test k to test k+1 and from one sample of a group to the next): no socket means none of
the network namespace's counters moves (/proc/net/snmp, snmp6, netstat, dev, IPv6 flow labels) and no socket
cookie (a counter of the whole kernel) is drawn; with every shown file locked in memory and the residency calls
refused, the page cache tells a sample nothing an earlier one did, whatever the host evicts; no pipe, pidfd,
sysinfo or global /proc file means no counter of the machine a program can move. The wall clock remains:
docs/sandbox_security.md has each claim with the test that proves it, and the residuals with their measured
bandwidth.

Limits. Per test: `timeout_s` seconds of CPU time, counted over all the test's processes (so a busy machine
slows a test without failing it), and a wall-clock backstop of `wall_limit_s(timeout_s)` for a test that waits;
both enforced by the zygote. Per process, set before the program runs: address space, processes
(RLIMIT_NPROC), file size, open files, CPU seconds (a backstop), no core dumps. Per sample: memory, all its
processes, tmpfs and pipes together, capped at `sample_memory_mb` by a cgroup of its own where the machine
allows one (`sandbox_cgroup`, which also gives each sample an equal share of the CPU), else polled by the
zygote. The whole sandbox has a backstop deadline on the host, at which its pid 1 is killed, which takes every
process in the namespace with it (double-forked, setsid'd daemons included).

Fresh state. Each test finds /tmp and /dev/shm empty and as the first test found them (their inode and entry
counters included), no IPC object, no socket in /proc/net, the same pids, and only its own test in memory: the
zygote resets the sandbox after each test or runs no further test in it (`sandbox_zygote`). Where no cgroup
counts CPU time, the seccomp filter keeps SIGCHLD's action at its default (`seccomp`), so that no child the
kernel reaps itself escapes the zygote's /proc meter; training refuses such a sandbox unless
$KLEAR_SANDBOX_ALLOW_NO_CGROUP=1 (`require_metered`), and every run records the mode (`sandbox_mode`).

Reaping. bwrap runs with `--as-pid-1`: our zygote is the namespace's init and bwrap waits for it directly.
Without it, bwrap's own init reports the program's exit through an eventfd and bwrap exits at once, without
waiting for that init, which is then left a zombie under whatever process adopts it (one `[bwrap] <defunct>` per
call where pid 1 does not reap). Now, when `run_python_tests` returns, bwrap has been waited for, and bwrap has
waited for the zygote, which as init exits only once every process in the namespace is gone.

Privileges. RLIMIT_NPROC is ignored for uid 0 (and for any uid that maps to host root), so a fork bomb run as
root is unbounded. As root, bwrap therefore runs without a user namespace, keeps only CAP_SETUID, CAP_SETGID
and CAP_KILL for the zygote, and each test drops to a random unprivileged uid/gid from a high range (which clears
every capability), after which the NPROC count is this sandbox's alone and root-owned files are unreadable. As
non-root, bwrap creates a user namespace (`--unshare-user`, no nested ones) and the tests keep the caller's uid;
the kernel counts NPROC per user namespace level (ucounts, Linux >= 5.14), the zygote included. The zygote then
holds CAP_CHECKPOINT_RESTORE in that namespace to set the pid counter back, which is why /dev is built from
the host's nodes there rather than with `--dev` (its devpts would nest a second user namespace: `_dev_argv`).

Output: each test's stdout and stderr are read incrementally and capped (`max_output_bytes` each); a test whose
stdout (or result) exceeds the cap is killed (`output_limit_exceeded`), so a 1 GB print costs neither memory nor a
drain of 1 GB; stderr is a log: read to its end and kept truncated (`stderr_truncated`), never a failure.

Needs Linux >= 5.3 (pidfds). Without bwrap, the functions raise `SandboxUnavailableError` saying how to install
it. Running unsandboxed needs `unsafe_no_sandbox=True` or `KLEAR_UNSAFE_NO_SANDBOX=1`, and warns on every call.
"""

from __future__ import annotations

import functools
import marshal
import math
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from klear_lib.rewards import sandbox_cgroup, sandbox_json, sandbox_zygote, seccomp
from klear_lib.rewards.sandbox_exec import SANDBOX_ENV, Killer, Raw, execute
from klear_lib.rewards.sandbox_root import interpreter_files, is_under, resident_files, root_argv

UNSAFE_ENV_VAR = "KLEAR_UNSAFE_NO_SANDBOX"
UNCOUNTED_ENV_VAR = "KLEAR_SANDBOX_ALLOW_NO_CGROUP"  # training's opt-in to a sandbox without a cgroup
MIN_BWRAP_VERSION = (0, 8, 0)  # --disable-userns (0.8), --size (0.7), --json-status-fd and --perms on tmpfs
# As root each test runs as one random uid/gid of this range per sandbox: never a real account, and (almost
# surely) distinct from every concurrent sandbox, so each sandbox has its own RLIMIT_NPROC budget.
SANDBOX_UID_RANGE = (1_900_000_000, 2_000_000_000)
PROGRAM_PATH = "/tmp/main.py"
STARTUP_BUDGET_S = 10.0  # host backstop: starting the sandbox and the zygote (tens of ms on an idle machine)
PER_TEST_SLACK_S = 4.0  # host backstop per test beyond its wall limit and reset budget: kill, reap, drain, frame
WALL_FACTOR, WALL_EXTRA_S = 3.0, 1.0  # a test's wall-clock backstop: 3 x its CPU-time limit + 1 s
RESET_EXTRA_S = 2.0  # emptying /tmp and /dev/shm after a test may take the test's timeout + 2 s
ZYGOTE_MB = 128  # the warm interpreter, bwrap and their buffers, in a sample's memory cap


class SandboxUnavailableError(RuntimeError):
    """bwrap is missing, too old, or cannot create namespaces on this machine."""


class UnsafeSandboxWarning(RuntimeWarning):
    """Untrusted code is being run without a sandbox."""


class UncountedSandboxWarning(RuntimeWarning):
    """Training scores programs in a sandbox without a cgroup (opted in with $KLEAR_SANDBOX_ALLOW_NO_CGROUP)."""


# Shown on every call, not once per call site: running model-written code unsandboxed must never go unnoticed.
warnings.simplefilter("always", UnsafeSandboxWarning)
_unsafe_runs = 0


@dataclass(frozen=True)
class FunctionCall:
    """A function-call test: run the program as module `solution` (its `if __name__ == "__main__":` block stays
    out), then call `name(*args)`, a top-level function or else a method of a top-level `class Solution`.
    The return value comes back in `SandboxResult.value`, through JSON."""

    name: str
    args: Sequence = ()


@dataclass(frozen=True)
class SandboxResult:
    """What one test did. `returncode` is the exit status; death by signal N reads 128 + N, with N in
    `killed_by_signal` (a test killed on timeout, output overflow or memory reads 137 and 9). `duration_s`: wall
    time from the test's fork to its exit; `cpu_s`: CPU time of all its processes. `timed_out`: past its CPU
    time limit or its wall-clock backstop. `memory_exceeded`: the sample's memory cap was reached during it.
    For a `FunctionCall`, `returned` says whether the call returned a result; `value` is its return value after
    a JSON round trip (ints of more than 4,000 digits as `sandbox_json.LongInt`), or, where `value_is_json` is
    False, text: its repr (at most 300 characters), or why the result could not be decoded."""

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
    returned: bool = False
    value: object = None
    value_is_json: bool = True
    cpu_s: float = 0.0
    memory_exceeded: bool = False

    @property
    def ok(self) -> bool:
        """Exited normally with status 0 inside its limits."""
        return self.returncode == 0 and not self.timed_out and not self.output_limit_exceeded


def run_python(code: str, *, stdin: str = "", timeout_s: float = 10.0, **options) -> SandboxResult:
    """Run `code` as a Python program (stdlib only: `-I -S`) with `stdin`, sandboxed, within `timeout_s` seconds
    of CPU time: `run_python_tests` with one test. `options` are those of `run_python_tests`."""
    return run_python_tests(code, [stdin], timeout_s=timeout_s, **options)[0]


def run_python_tests(
    program: str,
    tests: Sequence[str | FunctionCall],
    *,
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
    wall_timeout_s: float | None = None,
    sample_memory_mb: int | None = None,
) -> list[SandboxResult]:
    """Run `program` once per test in one sandbox, each test in a fresh process; one result per test, in order.

    A test is a stdin string (the program runs as __main__ with it) or a `FunctionCall`. timeout_s: CPU time
    limit of each test (all its processes). wall_timeout_s: wall-clock backstop of each test (default
    `wall_limit_s(timeout_s)`). memory_mb: address-space limit (RLIMIT_AS) of each process. sample_memory_mb: cap
    on the memory of the whole sample (default `sample_memory_default_mb`: one process's memory_mb, both tmpfs,
    the output buffers and the zygote). max_processes: RLIMIT_NPROC (threads count too). max_file_mb: largest
    file the program may write (RLIMIT_FSIZE). tmpfs_mb: size of each of the two writable tmpfs (/tmp and
    /dev/shm, /tmp with room for the test's stdin besides), emptied between tests. max_output_bytes: cap on each
    test's stdout, on its stderr and on its result. python: the interpreter, default the real binary behind
    `sys.executable` (a venv's site-packages are not used). hide_paths: host directories to hide should they lie
    inside what the sandbox shows (the interpreter's directories); nothing else of the host is visible anyway.
    Raises `SandboxUnavailableError` if bwrap is missing or cannot run here, unless `unsafe_no_sandbox` (or
    $KLEAR_UNSAFE_NO_SANDBOX=1).
    """
    specs = [_test_spec(t) for t in tests]
    if not specs:
        return []
    python = os.path.realpath(python or sys.executable)
    wall_s = wall_limit_s(timeout_s) if wall_timeout_s is None else wall_timeout_s
    reset_s = timeout_s + RESET_EXTRA_S
    sample_mb = sample_memory_default_mb(memory_mb, tmpfs_mb, max_output_bytes) if sample_memory_mb is None \
        else sample_memory_mb
    stdin_room = max((len(t["stdin"].encode()) for t in specs if "stdin" in t), default=0)
    stdin_room = -(-stdin_room // 4096) * 4096 + 4096
    job = {"program": program, "tests": specs, "timeout_s": timeout_s, "wall_s": wall_s, "reset_s": reset_s,
           "cap": max_output_bytes, "preimport": True, "cpu_fd": -1, "cpu_v": 0, "oom_fd": -1, "pid_fd": -1,
           "mem_cap": sample_mb << 20,
           "limits": [math.ceil(timeout_s) + 1, memory_mb << 20, max_processes, max_file_mb << 20, max_open_files]}
    budget = sample_budget_s(len(specs), timeout_s, wall_timeout_s=wall_s)
    unsafe = unsafe_no_sandbox or os.environ.get(UNSAFE_ENV_VAR, "") not in ("", "0")
    if unsafe:
        global _unsafe_runs
        _unsafe_runs += 1  # in the message, so that even the "default" filter (once per text) shows every call
        why = "unsafe_no_sandbox=True" if unsafe_no_sandbox else f"{UNSAFE_ENV_VAR}=1"
        warnings.warn(f"running untrusted code WITHOUT a sandbox ({why}; unsandboxed run #{_unsafe_runs})",
                      UnsafeSandboxWarning, stacklevel=2)
        return _run_unsandboxed(job, python, budget)

    bwrap = _bwrap_path()
    root = os.geteuid() == 0
    job.update(sandboxed=True, path=PROGRAM_PATH, clean=["/tmp", "/dev/shm"], stdin_dir="/tmp",
               uid=random.SystemRandom().randrange(*SANDBOX_UID_RANGE) if root else -1,
               program_filter=_seccomp_filter(program=True))  # each test's process stacks it (`seccomp`)
    resident_files(python).refresh()  # every file the sandbox shows stays in memory: residency says nothing
    try:
        cgroup = sandbox_cgroup.open_sample(job["mem_cap"])
    except sandbox_cgroup.CgroupError as e:
        raise SandboxUnavailableError(f"{e}; to run without per-sample cgroups (a weaker memory bound), set "
                                      f"{sandbox_cgroup.ENV_VAR}=off") from e
    if cgroup is not None:  # the kernel caps the sample's memory; the zygote reads its counters
        job.update(cpu_fd=cgroup.cpu_fd, cpu_v=cgroup.cpu_version, oom_fd=cgroup.oom_fd, mem_cap=0)
    pid_fd = _ns_last_pid_fd()  # the zygote sets the sandbox's pid counter back before each test
    if pid_fd >= 0:
        job["pid_fd"] = pid_fd
    job_fd = _memfd("klear-job", _zygote_input(python, job))  # the zygote's stdin
    code_fd = _memfd("klear-main-py", program.encode())  # bwrap copies it to /tmp/main.py (--file)
    # Without the cgroup's CPU counter the zygote sums /proc, which misses children the kernel reaps itself.
    filter_fd = _memfd("klear-seccomp", _seccomp_filter(fixed_sigchld=job["cpu_fd"] < 0))  # bwrap reads it
    status_r, status_w = os.pipe()  # bwrap's --json-status-fd: the zygote's pid, and whether the sandbox started
    try:
        argv = _bwrap_argv(bwrap, python, code_fd, filter_fd, status_w, tmpfs_mb << 20, hide_paths, stdin_room,
                           pid_counter=pid_fd >= 0)
        argv += [python, "-I", "-S", "-c", sandbox_zygote.BOOTSTRAP]
        fds = (code_fd, filter_fd, status_w) + ((pid_fd,) if pid_fd >= 0 else ())
        if cgroup is not None:
            argv, fds = cgroup.wrap(argv), fds + cgroup.fds
        killer = Killer(status_r)
        raw = execute(argv, job_fd, budget, _stream_cap(job), killer, pass_fds=fds)
        started = killer.init_pid is not None
    finally:
        for fd in (job_fd, code_fd, filter_fd, status_r, status_w) + ((pid_fd,) if pid_fd >= 0 else ()):
            os.close(fd)
        if cgroup is not None:
            cgroup.close()
    frames = sandbox_zygote.decode_frames(raw.stdout)
    if not frames and not raw.timed_out:
        stderr = raw.stderr.decode(errors="replace").strip()
        if not started and cgroup is not None and raw.returncode == sandbox_cgroup.WRAPPER_FAILED:
            raise SandboxUnavailableError(
                f"could not place the sandbox in its cgroup ({stderr[-500:]}); to run without per-sample cgroups "
                f"(a weaker memory bound), set {sandbox_cgroup.ENV_VAR}=off")
        if not started:
            raise SandboxUnavailableError(
                "bubblewrap could not start the sandbox. If the error below is about namespaces, this machine does "
                "not allow them (nested container, or kernel.apparmor_restrict_unprivileged_userns=1 on Ubuntu >= "
                "23.10, or user.max_user_namespaces=0): run as root, or allow unprivileged user namespaces, or give "
                f"the container CAP_SYS_ADMIN. bwrap said:\n{stderr}")
        raise SandboxUnavailableError(
            f"the sandbox started but its interpreter {python} reported no test (exit status {raw.returncode}); "
            f"it said:\n{stderr[-2000:]}")
    return _results(frames, len(specs), raw, sandboxed=True)


def sandbox_status() -> dict:
    """A one-call health check for notebooks and CI: can programs be sandboxed here, and how."""
    t0 = time.monotonic()
    try:
        r = run_python("import os; print(os.getuid())", timeout_s=10)
    except SandboxUnavailableError as e:
        return {"available": False, "error": str(e)}
    return {"available": r.ok, "bwrap": _bwrap_path(), "uid_inside": r.stdout.strip(), "as_root": os.geteuid() == 0,
            "call_s": round(time.monotonic() - t0, 4), "cgroup": sandbox_cgroup.status()}


def sandbox_mode() -> str:
    """How this process's samples are bounded: ``cgroup v2``, ``cgroup v1`` (memory capped and CPU time counted
    by the kernel) or ``none`` (the zygote polls both: `sandbox_cgroup`); recorded in every run's
    ``versions.json``. Never raises."""
    try:
        return sandbox_cgroup.status()["mode"]
    except Exception as e:  # noqa: BLE001 - a record, not a check: say what happened instead of failing the run
        return f"unknown ({type(e).__name__}: {e})"


_uncounted_warned = False


def require_metered(who: str) -> str:
    """Training's check before it scores any program: the sandbox mode (`sandbox_mode`), or
    `SandboxUnavailableError` where no cgroup can be made, unless ${UNCOUNTED_ENV_VAR}=1 opts in to the fallback
    (then an `UncountedSandboxWarning`, once per process). Without a cgroup the memory cap is polled every
    10 ms and CPU time summed from /proc: weaker bounds that a policy may learn to lean on (docs/design.md)."""
    global _uncounted_warned
    mode = sandbox_mode()
    if mode != "none":
        return mode
    why = sandbox_cgroup.status().get("why", "")
    if os.environ.get(UNCOUNTED_ENV_VAR, "") in ("", "0"):
        raise SandboxUnavailableError(
            f"{who}: the code sandbox cannot make a cgroup here ({why}), so the kernel would neither cap a "
            f"sample's memory nor count its CPU time; give it one ({sandbox_cgroup.ENV_VAR}=<a delegated cgroup v2 "
            f"directory>, or run as root on cgroup v1) or opt in to the polled fallback with {UNCOUNTED_ENV_VAR}=1")
    if not _uncounted_warned:
        _uncounted_warned = True
        warnings.warn(f"{who}: training with the code sandbox's polled fallback ({UNCOUNTED_ENV_VAR}=1; no cgroup: "
                      f"{why}): memory is polled every 10 ms and CPU time summed from /proc", UncountedSandboxWarning,
                      stacklevel=2)
    return mode


def sample_budget_s(n_tests: int, timeout_s: float, *, wall_timeout_s: float | None = None) -> float:
    """The host's deadline for one sample of `n_tests` tests at a CPU-time limit of `timeout_s` each: the
    sandbox's start, then per test its wall-clock backstop, the reset budget and the slack. A caller's own limit
    per sample (a reward pool's per-item timeout) must be at least this, so that a slow program is judged (a
    wrong answer) before the caller gives up on it (a replaced worker)."""
    wall_s = wall_limit_s(timeout_s) if wall_timeout_s is None else wall_timeout_s
    return STARTUP_BUDGET_S + n_tests * (wall_s + timeout_s + RESET_EXTRA_S + PER_TEST_SLACK_S)


def wall_limit_s(timeout_s: float) -> float:
    """A test's default wall-clock backstop for a CPU-time limit of `timeout_s`: `WALL_FACTOR` x + `WALL_EXTRA_S`.
    Only a test that waits (sleeps, blocks) meets it; one that computes meets its CPU-time limit first unless the
    machine gives it less than a third of a core."""
    return WALL_FACTOR * timeout_s + WALL_EXTRA_S


def sample_memory_default_mb(memory_mb: int, tmpfs_mb: int, max_output_bytes: int) -> int:
    """The default memory cap of a sample, MiB: one process at its RLIMIT_AS, both tmpfs full, the zygote's three
    output buffers, and the zygote itself. An honest one-process program meets its own RLIMIT_AS first."""
    return memory_mb + 2 * tmpfs_mb + 3 * -(-max_output_bytes >> 20) + ZYGOTE_MB


def _test_spec(test) -> dict:
    if isinstance(test, str):
        return {"stdin": test}
    if isinstance(test, FunctionCall):
        return {"call": test.name, "args": list(test.args)}
    raise TypeError(f"a test is a stdin string or a FunctionCall, got {type(test).__name__}: {str(test)[:100]!r}")


def _zygote_input(python: str, job: dict) -> bytes:
    """The zygote's stdin (a memfd it reads with pread): the length of the head in `HEAD_DIGITS` digits, the head
    (a marshal of (its code, the job with, in place of the tests, where each one lies and its kind)), then each
    test's own marshal. The zygote never reads a test: each test's process reads its own section only, so it
    holds no other test's input (before, every test could walk the harness's frames to the next one's). The
    code is compiled here when `python` is this very interpreter (saves the sandbox ~6 ms of compiling per
    sample), else sent as source."""
    same = python == os.path.realpath(sys.executable)
    sections = [marshal.dumps(t) for t in job["tests"]]
    index, at = [], 0
    for t, blob in zip(job["tests"], sections):
        index.append({"kind": "call" if "call" in t else "stdin", "at": at, "size": len(blob)})
        at += len(blob)
    head = marshal.dumps((_zygote_code() if same else _zygote_source(), dict(job, tests=index)))
    start = sandbox_zygote.HEAD_DIGITS + len(head)
    for entry in index:
        entry["at"] += start
    head = marshal.dumps((_zygote_code() if same else _zygote_source(), dict(job, tests=index)))
    assert sandbox_zygote.HEAD_DIGITS + len(head) == start  # the offsets are ints of the same marshal size
    return b"%0*d" % (sandbox_zygote.HEAD_DIGITS, len(head)) + head + b"".join(sections)


CAP_CHECKPOINT_RESTORE = 40  # Linux >= 5.9: may set a pid namespace's last pid (ns_last_pid)


@functools.lru_cache(maxsize=1)
def _pid_counter_supported() -> bool:
    """Whether the kernel and bwrap know CAP_CHECKPOINT_RESTORE, the capability the zygote needs to set the
    sandbox's pid counter back (else the pid counter stays a channel between tests: docs/design.md). bwrap
    reads capability names through libcap, which learnt this one in 2.44: asked once per process."""
    try:
        if int(Path("/proc/sys/kernel/cap_last_cap").read_text()) < CAP_CHECKPOINT_RESTORE:
            return False
        probe = [_bwrap_path(), "--ro-bind", "/", "/", "--cap-drop", "ALL", "--cap-add", "CAP_CHECKPOINT_RESTORE",
                 "--", os.path.realpath(sys.executable), "-I", "-S", "-c", "0"]
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, ValueError, subprocess.SubprocessError, SandboxUnavailableError):
        return False


def _ns_last_pid_fd() -> int:
    """A descriptor on /proc/sys/kernel/ns_last_pid, opened here for writing, or -1. A write through it sets the
    last pid of the WRITER's pid namespace, so the zygote (pid 1 of the sandbox, with CAP_CHECKPOINT_RESTORE)
    uses it to give every test the same pids; the tests never hold it, nor the capability."""
    if not _pid_counter_supported():  # a kernel before 5.9, or a bwrap/libcap that does not know the capability
        return -1
    try:
        return os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return -1


@functools.lru_cache(maxsize=1)
def _zygote_source() -> str:
    return Path(sandbox_zygote.__file__).read_text()


@functools.lru_cache(maxsize=1)
def _zygote_code():
    return compile(_zygote_source(), sandbox_zygote.FILENAME, "exec", dont_inherit=True)  # no __future__ of ours


@functools.lru_cache(maxsize=4)
def _seccomp_filter(fixed_sigchld: bool = False, *, program: bool = False) -> bytes:
    """The sandbox's filter (bwrap loads it), or with `program` the one each test stacks on it (`seccomp`)."""
    try:
        return seccomp.build_program_filter() if program else seccomp.build_filter(fixed_sigchld=fixed_sigchld)
    except seccomp.UnsupportedMachineError as e:
        raise SandboxUnavailableError(f"{e}: the sandbox cannot filter syscalls here. To run unsandboxed anyway "
                                      f"(dangerous), pass unsafe_no_sandbox=True or set {UNSAFE_ENV_VAR}=1.") from e


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


def _bwrap_argv(bwrap: str, python: str, code_fd: int, filter_fd: int, status_fd: int, tmpfs_bytes: int,
                hide_paths: tuple[str, ...] = (), stdin_room: int = 0, *, pid_counter: bool = False) -> list[str]:
    """The bwrap command line up to `--`; each group says why it is there. `pid_counter`: the zygote gets
    CAP_CHECKPOINT_RESTORE, to set the pid counter back before each test (each test drops it: as root with its
    uid, as non-root explicitly)."""
    argv = [bwrap]
    # Namespaces: own PIDs (killing pid 1 ends everything), no network, own IPC/UTS/cgroup view. As non-root a
    # user namespace (and no nested ones). As root none, so that each test can drop to a real unprivileged uid.
    argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    restore = ["--cap-add", "CAP_CHECKPOINT_RESTORE"] if pid_counter else []
    if os.geteuid() == 0:  # the zygote drops each test's uid and kills what the test leaves: nothing more
        argv += ["--cap-drop", "ALL"] + [a for c in ("SETUID", "SETGID", "KILL") for a in ("--cap-add", f"CAP_{c}")]
        argv += restore
    else:  # bwrap's --disable-userns nests a second user namespace, in which the capability would not cover the
        # sandbox's pid namespace (EPERM on ns_last_pid); the seccomp filter refuses new user namespaces anyway
        # (unshare, setns, clone's CLONE_NEWUSER, clone3), so it only goes where the pid counter needs the room
        argv += ["--unshare-user"] + (restore if pid_counter else ["--disable-userns"])
    # Lifetime: the zygote is pid 1 and bwrap waits for it (no zombie, see the module docstring); it dies if
    # bwrap dies; setsid so the program cannot push input into our terminal (TIOCSTI).
    argv += ["--as-pid-1", "--die-with-parent", "--new-session", "--json-status-fd", str(status_fd)]
    argv += ["--seccomp", str(filter_fd)]
    # Filesystem: the minimal root, then /proc, /dev and the two size-limited tmpfs, then the root read-only.
    argv += list(root_argv(python))
    argv += _hide_argv(python, hide_paths)
    argv += ["--proc", "/proc"] + _dev_argv(nested_userns_ok=os.geteuid() == 0 or not pid_counter)
    # The zygote's own /proc entry hidden: its counters (page faults, resident size, context switches) grow with
    # every output it reads, and /proc/<pid>/stat shows them to any uid, so a test could read what the previous
    # one printed. An empty read-only tmpfs over /proc/1 (the zygote is pid 1 for the sandbox's whole life).
    argv += ["--perms", "0555", "--size", "4096", "--tmpfs", "/proc/1", "--remount-ro", "/proc/1"]
    argv += list(_proc_mask_argv())
    argv += ["--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    argv += ["--perms", "1777", "--size", str(tmpfs_bytes + stdin_room), "--tmpfs", "/tmp"]  # stdin lives there too
    argv += ["--perms", "0444", "--file", str(code_fd), PROGRAM_PATH, "--remount-ro", "/", "--chdir", "/tmp"]
    argv += ["--clearenv", *[a for k, v in SANDBOX_ENV.items() for a in ("--setenv", k, v)], "--"]
    return argv


# What /proc keeps besides the processes' own directories: the links to them, and the sandbox's own IPC namespace.
PROC_KEPT = ("self", "thread-self", "mounts", "net", "sysvipc")


@functools.lru_cache(maxsize=1)
def _proc_mask_argv() -> tuple[str, ...]:
    """Every other top-level entry of /proc masked: a file by /dev/null, a directory by an empty read-only tmpfs.
    They are the kernel's, not the sandbox's: counters every process on the machine moves and any can read
    (/proc/stat's fork count, loadavg's last pid, vmstat, meminfo, /proc/sys/fs's file and dentry counts, ...),
    which a test could move for the next one to read (/proc/stat carried a count exactly from one test to the
    next). Default deny: what a later kernel adds is masked too. Listed from the host's /proc, which shows the same
    kernel's entries."""
    argv: list[str] = []
    for name in sorted(os.listdir("/proc")):
        if name.isdigit() or name in PROC_KEPT:
            continue
        path = f"/proc/{name}"
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            argv += ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
        elif stat.S_ISREG(st.st_mode):
            argv += ["--ro-bind", "/dev/null", path]
    return tuple(argv)


DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")  # what bwrap's --dev binds from the host


def _dev_argv(*, nested_userns_ok: bool) -> list[str]:
    """/dev: bwrap's `--dev`, or, where the zygote must hold a capability over the sandbox's pid namespace (the
    pid counter, as non-root), the same nodes without a devpts. To mount a devpts as non-root, bwrap puts the
    program in a second user namespace nested in the one that owns the pid namespace, and a capability held
    there does not reach ns_last_pid (EPERM). No pseudo-terminal is then available: the tests' stdio are pipes."""
    if nested_userns_ok:
        return ["--dev", "/dev"]
    argv = ["--perms", "0755", "--size", "65536", "--tmpfs", "/dev"]
    for node in DEV_NODES:
        argv += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
    links = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2", "core": "/proc/kcore"}
    for name, target in links.items():
        argv += ["--symlink", target, f"/dev/{name}"]
    return argv + ["--perms", "0755", "--dir", "/dev/shm"]


def _hide_argv(python: str, hide_paths: tuple[str, ...]) -> list[str]:
    """An empty read-only tmpfs over each `hide_paths` directory that lies inside what the root shows."""
    shown = interpreter_files(python).directories
    argv: list[str] = []
    for p in sorted({os.path.realpath(p) for p in hide_paths}):
        if os.path.isdir(p) and any(is_under(p, d) for d in shown):
            argv += ["--perms", "0555", "--size", "4096", "--tmpfs", p, "--remount-ro", p]
    return argv


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # not close-on-exec: handed to bwrap through pass_fds or as stdin
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _stream_cap(job: dict) -> int:
    """Most bytes the zygote can legitimately send: three capped payloads and a header per test."""
    return len(job["tests"]) * (3 * job["cap"] + 4096)


def _run_unsandboxed(job: dict, python: str, budget: float) -> list[SandboxResult]:
    """The explicit opt-out: the same per-test processes and limits, but no namespaces, no seccomp, no uid drop,
    and a daemon that calls setsid() escapes the kill."""
    with tempfile.TemporaryDirectory(prefix="klear-unsafe-") as cwd:
        path = os.path.join(cwd, "main.py")
        Path(path).write_text(job["program"])
        job = dict(job, sandboxed=False, path=path, clean=[], uid=-1, stdin_dir=cwd)
        job_fd = _memfd("klear-job", _zygote_input(python, job))
        try:
            argv = [python, "-I", "-S", "-c", sandbox_zygote.BOOTSTRAP]
            raw = execute(argv, job_fd, budget, _stream_cap(job), Killer(None), cwd=cwd)
        finally:
            os.close(job_fd)
    frames = sandbox_zygote.decode_frames(raw.stdout)
    if not frames and not raw.timed_out:
        raise RuntimeError(f"the unsandboxed interpreter {python} reported no test (exit status {raw.returncode}): "
                           f"{raw.stderr.decode(errors='replace')[-2000:]}")
    return _results(frames, len(job["tests"]), raw, sandboxed=False)


def _results(frames: list[dict], n: int, raw: Raw, *, sandboxed: bool) -> list[SandboxResult]:
    """One SandboxResult per test; a test without a frame (the sandbox ended first) timed out if the host's
    deadline ended it, else carries the sandbox's exit status and stderr. A result record is decoded as hostile
    input (`sandbox_json.decode_result`: never raises)."""
    by_index = {f["i"]: f for f in frames}
    results = []
    for i in range(n):
        f = by_index.get(i)
        if f is None:
            results.append(SandboxResult(
                returncode=raw.returncode if raw.returncode >= 0 else 128 - raw.returncode, stdout="",
                stderr="the sandbox ended before this test finished: " + raw.stderr.decode(errors="replace")[-500:],
                timed_out=raw.timed_out, duration_s=0.0, sandboxed=sandboxed))
            continue
        status = f["status"]
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        returned, value, is_json = False, None, True
        if f["result"] or f["result_overflow"]:
            decoded = sandbox_json.decode_result(f["result"], overflow=f["result_overflow"])
            returned, value, is_json = True, decoded.value, decoded.is_json
        results.append(SandboxResult(
            returncode=128 + signum if signum else os.WEXITSTATUS(status),
            stdout=f["out"].decode(errors="replace"), stderr=f["err"].decode(errors="replace"),
            timed_out=f["timed_out"], duration_s=f["duration_s"], killed_by_signal=signum,
            stdout_truncated=f["out_truncated"], stderr_truncated=f["err_truncated"],
            output_limit_exceeded=f["overflow"], sandboxed=sandboxed, returned=returned, value=value,
            value_is_json=is_json, cpu_s=f["cpu_s"], memory_exceeded=f["memory_exceeded"]))
    return results
