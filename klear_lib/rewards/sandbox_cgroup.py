"""One cgroup per sample, where the machine allows it: the memory of the whole sample capped by the kernel, its CPU
time counted exactly, and its share of the CPU equal to any other sample's however many processes it runs.

A sample is the bubblewrap sandbox of one `run_python_tests` call. Its cgroup is created before bwrap starts and
removed after bwrap has been waited for (by then every process of the sandbox is gone). bwrap is placed in it
by a shell that moves itself into the cgroup and then execs bwrap (`SampleCgroup.wrap`), so the sandbox is inside
from its first instruction; Python's subprocess has no portable way to start a child in a cgroup. On v1 the shell
moves its one thread (`0` into `tasks`), which the kernel does without the global lock that moving a process by
pid takes (and its RCU grace period: 5-30 ms a sample, the largest single wait of a sample before issue 45).

Memory charged to the cgroup is everything the sample's processes allocate: anonymous memory, tmpfs and
/dev/shm pages, pipe and socket buffers, page tables (what RLIMIT_AS, per process and virtual, cannot see).
At the cap the kernel's OOM killer ends a process of the sample (the tests' processes first: their OOM score
is the highest), never one outside it. The zygote reads the cgroup's CPU counter and OOM count through
read-only descriptors it inherits (the tests do not: every descriptor past their own is closed).

Where (`setup`, once per process; `KLEAR_SANDBOX_CGROUP` overrides):

    cgroup v2     the cgroup this process runs in, when its ``cgroup.subtree_control`` has (or, at the root of
                  the hierarchy, can be given) the memory controller; or the v2 directory named by
                  ``KLEAR_SANDBOX_CGROUP`` (for example a delegated one: ``systemd-run --scope -p Delegate=yes``)
    cgroup v1     the memory hierarchy's cgroup of this process, when it may create children there (root,
                  usually), with the cpuacct and cpu hierarchies beside it when they are mounted
    none          ``KLEAR_SANDBOX_CGROUP=off``, or neither works: the zygote then polls memory and CPU time
                  itself (`sandbox_zygote.Meter`), a weaker bound (see docs/design.md)

A cgroup v2 process cannot create cgroups with controllers in the cgroup it lives in unless that is the root
(the "no internal processes" rule), so an unprivileged or containerised caller on v2 needs a delegated
directory. `status` says which case holds here.
"""

from __future__ import annotations

import functools
import itertools
import os
import secrets
import shutil
import time
from dataclasses import dataclass

ENV_VAR = "KLEAR_SANDBOX_CGROUP"
PREFIX = "klear-sandbox-"
STALE_S = 60.0  # an empty sample cgroup of a dead process, this old, is removed (at set-up, and every ...)
STALE_EVERY = 256  # ... so many samples: a pool worker killed mid-sample leaves its cgroup behind
# Moves the shell (bwrap, after the exec) into each cgroup given before "--", then execs the rest. v1: `0` written
# to `tasks` moves the writing thread, the shell's only one, and takes no global lock; v2: its pid written to
# `cgroup.procs` (a whole process: the kernel takes cgroup_threadgroup_rwsem for writing, which waits for an RCU
# grace period, 5-30 ms on the project's machine, measured in the sample's critical path; v1 did the same before).
WRAPPER = 'while [ "$1" != -- ]; do echo {value} > "$1" || exit 125; shift; done; shift; exec "$@"'
MOVE = {1: ("0", "tasks"), 2: ("$$", "cgroup.procs")}  # version -> (what the wrapper writes, into which file)
WRAPPER_FAILED = 125
_counter = itertools.count()
_unremoved: set[str] = set()


class CgroupError(RuntimeError):
    """A sample cgroup could not be created or removed."""


@dataclass(frozen=True)
class Host:
    """How this machine holds sample cgroups: the version and, per role, the directory they are created in.
    Roles: ``memory`` (always), ``cpuacct`` (the CPU counter; v2: the same directory), ``cpu`` (fair share)."""

    version: int
    parents: tuple[tuple[str, str], ...]

    def parent(self, role: str) -> str | None:
        return dict(self.parents).get(role)


class SampleCgroup:
    """The cgroup(s) of one sample: created with the memory cap set, removed by `close`."""

    def __init__(self, host: Host, memory_bytes: int):
        self.host = host
        name = f"{PREFIX}{os.getpid()}-{next(_counter)}-{secrets.token_hex(3)}"
        self.dirs: list[str] = []
        self.cpu_fd = self.oom_fd = -1
        try:
            for parent in dict.fromkeys(p for _, p in host.parents):  # a directory once (v2, co-mounted v1)
                path = os.path.join(parent, name)
                os.mkdir(path)
                self.dirs.append(path)
            mem = os.path.join(host.parent("memory"), name)
            if host.version == 2:
                _write(mem, "memory.max", memory_bytes)
                _write(mem, "memory.swap.max", 0, optional=True)
                self.oom_fd = os.open(os.path.join(mem, "memory.events"), os.O_RDONLY)
                self.cpu_fd = os.open(os.path.join(mem, "cpu.stat"), os.O_RDONLY)
            else:
                _write(mem, "memory.limit_in_bytes", memory_bytes)
                _write(mem, "memory.memsw.limit_in_bytes", memory_bytes, optional=True)  # no swapping past it
                _write(mem, "memory.swappiness", 0, optional=True)
                self.oom_fd = os.open(os.path.join(mem, "memory.oom_control"), os.O_RDONLY)
                if host.parent("cpuacct"):
                    self.cpu_fd = os.open(os.path.join(host.parent("cpuacct"), name, "cpuacct.usage"), os.O_RDONLY)
        except OSError as e:
            self.close()
            raise CgroupError(f"could not create the sample cgroup {name} ({e})") from e

    @property
    def cpu_version(self) -> int:
        return self.host.version if self.cpu_fd >= 0 else 0

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(fd for fd in (self.cpu_fd, self.oom_fd) if fd >= 0)

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` started inside this cgroup (see the module docstring and `WRAPPER`)."""
        value, name = MOVE[self.host.version]
        files = [os.path.join(d, name) for d in self.dirs]
        return [_shell(), "-c", WRAPPER.format(value=value), "klear-sandbox-cgroup", *files, "--", *argv]

    def close(self) -> None:
        for fd in (self.cpu_fd, self.oom_fd):
            if fd >= 0:
                os.close(fd)
        self.cpu_fd = self.oom_fd = -1
        for d in reversed(self.dirs):
            _rmdir(d)
        self.dirs = []


def open_sample(memory_bytes: int) -> SampleCgroup | None:
    """A cgroup for one sample capped at `memory_bytes`, or None where this machine has no usable cgroups.
    Every `STALE_EVERY` samples, the cgroups that killed processes left behind are removed too."""
    host = setup()
    if host is None:
        return None
    cg = SampleCgroup(host, memory_bytes)
    for path in list(_unremoved):  # ours, still busy when their sample ended
        _unremoved.discard(path)
        _rmdir(path, tries=1)
    if next(_counter) % STALE_EVERY == 0:
        for parent in dict.fromkeys(p for _, p in host.parents):
            _remove_stale(parent)
    return cg


def setup() -> Host | None:
    """Where sample cgroups go on this machine (module docstring), or None; decided once per process and value
    of $KLEAR_SANDBOX_CGROUP."""
    return _setup(os.environ.get(ENV_VAR, "auto"))[0]


def status() -> dict:
    """How samples are bounded here: ``{"mode": "cgroup v2" | "cgroup v1" | "none", "where"/"why": ...}``."""
    host, why = _setup(os.environ.get(ENV_VAR, "auto"))
    if host is None:
        return {"mode": "none", "why": why}
    return {"mode": f"cgroup v{host.version}", "where": dict(host.parents)}


@functools.lru_cache(maxsize=4)
def _setup(choice: str) -> tuple[Host | None, str]:
    if choice == "off":
        return None, f"{ENV_VAR}=off"
    mounts = _mounts()
    own = _own_cgroups()
    reasons = []
    candidates = [_v2_named(choice, mounts)] if choice != "auto" else [_v2_own(mounts, own), _v1_own(mounts, own)]
    for found in candidates:
        host, why = found
        if host is None:
            reasons.append(why)
            continue
        try:
            _probe(host)
        except (OSError, CgroupError) as e:
            reasons.append(f"cgroup v{host.version} at {host.parent('memory')}: {e}")
            continue
        for _, parent in host.parents:
            _remove_stale(parent)
        return host, ""
    return None, "; ".join(reasons)


def _v2_named(path: str, mounts: list[tuple[str, str, str, str]]) -> tuple[Host | None, str]:
    path = os.path.realpath(path)
    if not any(fs == "cgroup2" and (path == mp or path.startswith(mp.rstrip("/") + "/")) for fs, mp, _, _ in mounts):
        return None, f"{ENV_VAR}={path} is not a directory of a cgroup v2 hierarchy"
    return _v2_at(path)


def _v2_own(mounts, own) -> tuple[Host | None, str]:
    mount = next(((mp, root) for fs, mp, root, _ in mounts if fs == "cgroup2"), None)
    if mount is None or "" not in own:
        return None, "no cgroup v2 hierarchy"
    path = _join(mount, own[""])
    if path is None:
        return None, "this process's cgroup v2 is outside the mounted hierarchy"
    return _v2_at(path, may_enable=own[""] == "/")


def _v2_at(path: str, may_enable: bool = True) -> tuple[Host | None, str]:
    try:
        enabled = _read(path, "cgroup.subtree_control").split()
        if "memory" not in enabled:
            available = _read(path, "cgroup.controllers").split()
            if "memory" not in available:
                return None, f"cgroup v2 at {path}: no memory controller (available: {' '.join(available) or 'none'})"
            if not may_enable:
                return None, (f"cgroup v2 at {path}: the memory controller is not enabled for its children, and a "
                              f"cgroup with processes cannot enable it; set {ENV_VAR} to a delegated directory")
            _write(path, "cgroup.subtree_control", " ".join(f"+{c}" for c in ("memory", "cpu") if c in available))
    except OSError as e:
        return None, f"cgroup v2 at {path}: {e}"
    return Host(2, (("memory", path), ("cpuacct", path), ("cpu", path))), ""


def _v1_own(mounts, own) -> tuple[Host | None, str]:
    parents = []
    for role in ("memory", "cpuacct", "cpu"):
        for fs, mp, root, opts in mounts:
            if fs == "cgroup" and role in opts.split(","):
                key = next((k for k in own if role in k.split(",")), None)
                path = _join((mp, root), own[key]) if key is not None else None
                if path is not None and os.access(path, os.W_OK):
                    parents.append((role, path))
                break
    if not parents or parents[0][0] != "memory":
        return None, "no writable cgroup v1 memory hierarchy"
    return Host(1, tuple(parents)), ""


def _probe(host: Host) -> None:
    """Create a sample cgroup, place a shell in it through the wrapper, remove it: fails here, not per sample."""
    import subprocess

    cg = SampleCgroup(host, 64 << 20)
    try:
        r = subprocess.run(cg.wrap([_shell(), "-c", "exit 0"]), capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise CgroupError(f"could not place a process in it: {r.stderr.strip()[-300:] or r.returncode}")
    finally:
        cg.close()


def _mounts() -> list[tuple[str, str, str, str]]:
    """(fstype, mount point, root inside the hierarchy, super options) of every cgroup mount."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rest = left.split(), right.split()
                if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                    out.append((rest[0], _unescape(fields[4]), _unescape(fields[3]), rest[2]))
    except OSError:
        pass
    return out


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per hierarchy: controllers (``""`` for v2) -> path."""
    own = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) == 3:
                    own[parts[1]] = parts[2]
    except OSError:
        pass
    return own


def _join(mount: tuple[str, str], path: str) -> str | None:
    mount_point, root = mount
    if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
        return None
    rel = path[len(root):] if root != "/" else path
    return os.path.normpath(mount_point + "/" + rel.lstrip("/"))


def _remove_stale(parent: str) -> None:
    """Remove empty sample cgroups of processes that are gone (left by a process that was killed)."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        try:
            pid = int(name[len(PREFIX):].split("-")[0])
            path = os.path.join(parent, name)
            if _alive(pid) or time.time() - os.stat(path).st_mtime < STALE_S:
                continue
            os.rmdir(path)
        except (ValueError, OSError):
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rmdir(path: str, tries: int = 50) -> None:
    """Remove a sample cgroup; one still busy after `tries` (the last exits may take a moment to leave it) is
    retried when the next sample opens."""
    for i in range(tries):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if i + 1 < tries:
                time.sleep(0.002)
    _unremoved.add(path)


def _read(d: str, name: str) -> str:
    with open(os.path.join(d, name)) as f:
        return f.read()


def _write(d: str, name: str, value, optional: bool = False) -> None:
    path = os.path.join(d, name)
    if optional and not os.path.exists(path):
        return
    try:
        with open(path, "w") as f:
            f.write(str(value))
    except OSError:
        if not optional:
            raise


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


@functools.lru_cache(maxsize=1)
def _shell() -> str:
    return shutil.which("sh") or "/bin/sh"
