"""Proof by hostile input: programs written to escape or exhaust the code sandbox, each shown contained.

Every test runs hostile programs through `run_python` / `run_python_tests` and asserts three things: the program
did not get what it wanted (host files, secrets, sockets, network, kernel interfaces, surviving processes), it
came back within its tests' wall-clock backstops (`sandbox.wall_limit_s`) + 2 s, and the host is unchanged
afterwards: the `host` fixture, used by every test, checks that the planted directory (a secret, hidden test
data, a world-writable folder, a unix socket) is byte-identical, that nothing new appeared in $HOME or the
repository, that no process of ours is left (zombies included), and that no socket server got a connection.
Timeouts are short (1 s of CPU time) to keep this file fast. `pytest -s` prints the corpus size and the worst
wall-time overrun. The reward-level corpus (probes scored as training scores them) is test_reward_hostile.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from klear_lib.rewards import sandbox, sandbox_root
from klear_lib.rewards.sandbox import SandboxUnavailableError, UnsafeSandboxWarning, run_python, run_python_tests
from klear_lib.rewards.sandbox_root import interpreter_files, is_under

NO_BWRAP = "bubblewrap is not installed (apt-get install bubblewrap, or `make`)"
TIMEOUT = 1.0
SLACK = 2.0  # every result within its wall-clock backstop + 2 s
REPO = Path(__file__).resolve().parents[1]
INTERPRETER = interpreter_files(os.path.realpath(sys.executable))  # what the sandbox shows of the host
PROGRAMS: list[float] = []  # wall time minus the wall-clock budget of every hostile program run


@pytest.fixture(scope="module", autouse=True)
def report_corpus():
    yield
    if PROGRAMS:
        print(f"\nhostile corpus: {len(PROGRAMS)} programs, all contained; worst wall time = "
              f"budget {max(PROGRAMS):+.3f} s")


def run(code: str, **kw):
    """Run one hostile program; assert it came back in time; the result."""
    return run_tests(code, [kw.pop("stdin", "")], **kw)[0]


def run_tests(code: str, tests: list, **kw):
    """Run one hostile program on several tests in one sandbox; assert it came back in time; the results."""
    if shutil.which("bwrap") is None:
        pytest.skip(NO_BWRAP)
    kw.setdefault("timeout_s", TIMEOUT)
    t0 = time.monotonic()
    results = run_python_tests(textwrap.dedent(code), tests, **kw)
    wall = time.monotonic() - t0
    budget = len(tests) * kw.get("wall_timeout_s", sandbox.wall_limit_s(kw["timeout_s"]))
    PROGRAMS.append(wall - budget)
    assert wall <= budget + SLACK, f"took {wall:.2f} s"
    assert all(r.sandboxed for r in results)
    return results


def snapshot(d: Path) -> dict:
    """Every entry under d with its bytes (None for a directory or a socket)."""
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


def descendants() -> list[str]:
    """Every process below this one (zombies too), as 'pid comm state'."""
    stats = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            head, tail = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)
        except OSError:
            continue
        stats[int(p)] = (head.split("(", 1)[1], tail.split()[0], int(tail.split()[1]))
    found, frontier = [], {os.getpid()}
    while frontier:
        frontier = {pid for pid, (_, _, ppid) in stats.items() if ppid in frontier}
        found += [f"{pid} {stats[pid][0]} {stats[pid][1]}" for pid in frontier]
    return found



PLANTED_IN_HOME = ".klear-sandbox-secret-"  # test_home_directory_secret_is_not_there's file, while it runs


def _listing(d):
    """The names in `d`, but the home-secret test's planted file: `make test` runs the host tests in two pytest-xdist
    workers side by side, and one's check of the home directory must not see the other's plant (CI saw it: an
    error at the teardown of an unrelated test)."""
    return sorted(n for n in os.listdir(d) if not n.startswith(PLANTED_IN_HOME)) if os.path.isdir(d) else None

class Host:
    """What a program must not reach: a planted directory with a secret, hidden test data, a world-writable
    folder and a listening unix socket, plus a TCP server on the host's loopback and an abstract unix socket."""

    def __init__(self, root: Path):
        self.dir = root
        self.secret = secrets.token_hex(16)
        (root / "secret.txt").write_text(self.secret)
        (root / "hidden_tests.jsonl").write_text(json.dumps({"input": "1", "output": self.secret}) + "\n")
        (root / "open").mkdir(mode=0o777)
        os.chmod(root / "open", 0o777)  # world-writable on purpose: only the sandbox may stop a write
        os.chmod(root, 0o755)
        self.unix_path = str(root / "host.sock")
        self.servers = []
        for family, addr in ((socket.AF_UNIX, self.unix_path), (socket.AF_UNIX, "\0klear-" + self.secret[:12]),
                             (socket.AF_INET, ("127.0.0.1", 0))):
            s = socket.socket(family)
            s.bind(addr)
            s.listen(8)
            s.setblocking(False)
            self.servers.append(s)
        self.abstract = self.servers[1].getsockname()
        self.tcp_port = self.servers[2].getsockname()[1]

    def state(self):
        return snapshot(self.dir), _listing(os.path.expanduser("~")), _listing(REPO), _listing(REPO / "tests")

    def connections(self) -> int:
        n = 0
        for s in self.servers:
            try:
                s.accept()[0].close()
                n += 1
            except BlockingIOError:
                pass
        return n


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


@contextlib.contextmanager
def host_unchanged(root: Path, pools=()):
    """A `Host` planted in `root`; on exit, assert it is unchanged (see the module docstring). `pools`: reward
    pools open across the check, whose workers, if pebble replaced one (a worker killed at the pool's per-item
    limit), are the pool's own new processes; any process below a worker still counts."""
    h = Host(root)
    before = h.state()
    # processes this test session already had (e.g. multiprocessing's resource tracker, started by an earlier test
    # that used a spawn pool, lives as long as pytest): not the hostile program's
    already = set(descendants())
    yield h
    try:
        workers = set().union(*(pool.worker_pids() for pool in pools))
        new = [p for p in descendants() if p not in already and int(p.split()[0]) not in workers]
        assert new == [], [(p, _cmdline(p.split()[0])) for p in new]
        assert h.connections() == 0
        assert h.state() == before
    finally:
        for s in h.servers:
            s.close()


@pytest.fixture
def host(tmp_path):
    with host_unchanged(tmp_path) as h:
        yield h


def assert_no_secret(h: Host, *results):
    for r in results:
        assert h.secret not in r.stdout + r.stderr


# --- the host's files and secrets ------------------------------------------------------------------------------

def test_planted_secret_and_hidden_tests_are_not_there(host):
    r = run(f"""
        for p in ({str(host.dir / 'secret.txt')!r}, {str(host.dir / 'hidden_tests.jsonl')!r}, {str(host.dir)!r}):
            try:
                print(open(p).read())
            except OSError as e:
                print('blocked', type(e).__name__)
    """)
    assert r.stdout.split() == ["blocked", "FileNotFoundError"] * 3
    assert_no_secret(host, r)


def test_searching_the_whole_filesystem_finds_no_secret_and_no_data(host):
    r = run(f"""
        import os
        hits, n = [], 0
        needle = {host.secret[::-1]!r}[::-1].encode()  # reversed here, so that main.py itself does not hold it
        for top, dirs, files in os.walk('/'):
            if top in ('/proc', '/dev'):
                dirs[:] = files[:] = []  # the sandbox's own processes; devices (reading /dev/ptmx would block)
            for f in files:
                p = os.path.join(top, f)
                n += 1
                if f.endswith(('.jsonl', '.parquet', '.json', '.csv')) and '/python3' not in p:
                    hits.append(p)  # data files outside the stdlib
                try:
                    with open(p, 'rb') as fh:
                        if needle in fh.read(1 << 16):
                            hits.append('SECRET ' + p)
                except OSError:
                    pass
        print(n, hits)
    """, timeout_s=20)
    assert r.ok, r.stderr
    assert int(r.stdout.split()[0]) > 100 and r.stdout.split(maxsplit=1)[1] == "[]\n"
    assert_no_secret(host, r)


def test_the_repository_is_not_there(host):
    r = run(f"""
        import os
        for p in ({str(REPO)!r}, {str(REPO / 'README.md')!r}, {str(Path(__file__).resolve())!r},
                  os.path.dirname(__file__)):
            print(p, os.path.exists(p))
    """)
    lines = r.stdout.splitlines()
    assert [ln.rsplit(" ", 1)[1] for ln in lines] == ["False", "False", "False", "True"]  # only /tmp, its own
    assert lines[3] == "/tmp True"


def test_home_directory_secret_is_not_there(host):
    home = Path(os.path.expanduser("~"))
    if not os.access(home, os.W_OK):
        pytest.skip(f"cannot plant a file in {home}")
    planted = home / f"{PLANTED_IN_HOME}{host.secret[:8]}"
    planted.write_text(host.secret)
    try:
        r = run(f"""
            import glob, os
            print(os.path.exists({str(planted)!r}))
            for p in glob.glob({str(home)!r} + '/.*') + glob.glob({str(home)!r} + '/*') + glob.glob('/home/*/*'):
                print(p)
        """)
        lines = r.stdout.splitlines()
        assert lines[0] == "False"
        # What is left is the interpreter's own (pyenv keeps it in a home) or the directories leading to it.
        shown = [*INTERPRETER.directories, *INTERPRETER.files]
        assert [p for p in lines[1:] if not any(is_under(d, p) or is_under(p, d) for d in shown)] == []
        assert_no_secret(host, r)
    finally:
        planted.unlink()


def test_system_files_are_not_there(host):
    # The top level holds /dev, /proc, /tmp, and the first component of each path of the interpreter's minimal
    # root (usr, lib, lib64, etc for ld.so.cache, and wherever the interpreter itself lives, e.g. /opt).
    shown = {a.split("/")[1] for a in sandbox_root.root_argv(os.path.realpath(sys.executable)) if a.startswith("/")}
    absent = [p for p in ("/etc/passwd", "/etc/shadow", "/etc/hostname", "/etc/hosts", "/var", "/run", "/sys",
                          "/opt", "/srv", "/mnt", "/bin/sh", "/usr/bin/env", "/sbin") if p.split("/")[1] not in shown
              or p.startswith(("/etc/", "/usr/bin/"))]
    r = run(f"""
        import os
        for p in {absent!r}:
            print(os.path.exists(p))
        print(sorted(os.listdir('/')))
    """)
    lines = r.stdout.splitlines()
    assert len(absent) >= 9 and lines[:-1] == ["False"] * len(absent)
    assert set(json.loads(lines[-1].replace("'", '"'))) <= {"dev", "proc", "tmp"} | shown


def test_environment_secrets_do_not_leak(host, monkeypatch):
    monkeypatch.setenv("KLEAR_TEST_API_KEY", host.secret)
    r = run("""
        import os
        print(dict(os.environ))
        for pid in os.listdir('/proc'):
            if pid.isdigit():
                for what in ('environ', 'cmdline'):
                    try:
                        print(open(f'/proc/{pid}/{what}', 'rb').read())
                    except OSError:
                        pass
    """)
    assert r.returncode == 0 and "PATH" in r.stdout
    assert_no_secret(host, r)


def test_the_warm_interpreter_is_out_of_reach_through_proc(host):
    # pid 1 holds the frame pipe to the host; its memory and descriptors must stay closed to the tests.
    r = run("""
        import os
        for p in ('/proc/1/mem', '/proc/1/fd', '/proc/1/environ', '/proc/1/root/tmp', '/proc/1/map_files'):
            try:
                if os.path.isdir(p):
                    print(p, 'listed', len(os.listdir(p)))
                else:
                    open(p, 'rb').read(1); print(p, 'read')
            except OSError as e:
                print(p, 'blocked', e.errno)
        for fd in range(3, 64):
            try:
                os.write(os.open(f'/proc/1/fd/{fd}', os.O_WRONLY), b'0 0 0 0 0 0 0.0 0 0 0\\n')
                print('WROTE', fd)
            except OSError:
                pass
    """)
    lines = r.stdout.splitlines()
    assert [ln.split()[1] for ln in lines if not ln.startswith("/proc/1/root")] == ["blocked"] * 4
    assert "WROTE" not in r.stdout


def test_writing_the_root_the_interpreter_and_proc_fails(host):
    stdlib = os.path.dirname(os.__file__)
    before = sorted(os.listdir(stdlib))
    r = run(f"""
        import os
        for p in ('/new.txt', {stdlib + '/evil.py'!r}, '/usr/lib/evil.so', '/etc/ld.so.cache', '/dev/evil',
                  '/proc/sysrq-trigger', '/proc/sys/vm/drop_caches'):
            try:
                with open(p, 'w') as f:
                    f.write('1')
                print('DID', p)
            except OSError as e:
                print('blocked', e.errno)
    """)
    assert "DID" not in r.stdout and r.stdout.count("blocked") == 7
    assert sorted(os.listdir(stdlib)) == before


PROC_READER = """
import os
for name in sorted(os.listdir('/proc')):
    if name.isdigit():
        continue
    path = '/proc/' + name
    try:
        got = len(os.listdir(path)) if os.path.isdir(path) else len(open(path, 'rb').read(1 << 16))
    except OSError as e:
        got = 'E%d' % e.errno
    print(name, got)
"""


def test_procs_global_files_are_masked(host):
    # The kernel's files in /proc (counters every process moves: /proc/stat's forks, loadavg, vmstat, /proc/sys/fs)
    # are masked: unreadable, or an empty directory. What stays: the links to the process's own entries, its own
    # network and IPC namespaces. The positive control: unsandboxed, the same reader sees them.
    r = run(PROC_READER)
    assert r.ok, r.stderr
    seen = dict(line.split() for line in r.stdout.splitlines())
    kept = {name: seen.pop(name) for name in sandbox.PROC_KEPT if name in seen}
    assert {"self", "net", "sysvipc"} <= set(kept) and int(kept["sysvipc"]) > 0 and int(kept["self"]) > 10, kept
    assert {"stat", "loadavg", "meminfo", "sys", "vmstat"} <= set(seen), seen
    assert all(v in ("0", "E13") for v in seen.values()), seen  # an empty directory, or EACCES (/dev/null's bind)
    with pytest.warns(sandbox.UnsafeSandboxWarning):
        free = run_python(PROC_READER, timeout_s=10, unsafe_no_sandbox=True)
    free_seen = dict(line.split() for line in free.stdout.splitlines())
    assert int(free_seen["stat"]) > 100 and int(free_seen["sys"]) > 3, free_seen


def test_shell_and_coreutils_are_absent(host):
    r = run(f"""
        import os
        pid = os.fork()
        if pid == 0:
            try:
                os.execvp('rm', ['rm', '-rf', {str(host.dir)!r}])
            except OSError as e:
                os._exit(e.errno)
        print('no rm', os.waitpid(pid, 0)[1] >> 8)
        print(os.system('rm -rf {host.dir}; echo pwned > {host.dir}/open/x'))
    """)
    assert r.stdout.split() == ["no", "rm", "2", str(127 << 8)]  # ENOENT; /bin/sh not found


def test_symlinks_and_hard_links_lead_nowhere(host):
    r = run(f"""
        import os
        os.symlink({str(host.dir / 'secret.txt')!r}, '/tmp/s')
        os.symlink('/proc/1/root' + {str(host.dir)!r}, '/tmp/t')
        for p in ('/tmp/s', '/tmp/t/secret.txt'):
            try:
                print(open(p).read())
            except OSError as e:
                print('blocked', e.errno)
        try:
            os.link('/etc/ld.so.cache', '/tmp/h'); print('linked')
        except OSError as e:
            print('blocked', e.errno)
    """)
    out = r.stdout.split()
    assert out[0::2] == ["blocked"] * 3
    assert out[1] == "2" and out[3] in ("2", "13") and out[5] == "18"  # ENOENT, ENOENT or EACCES, EXDEV
    assert_no_secret(host, r)


def test_the_working_directory_is_private(host, monkeypatch):
    monkeypatch.chdir(host.dir / "open")  # the caller's cwd: the program must not get it
    r = run("""
        import os
        print(os.getcwd(), sorted(os.listdir('.')))
        try:
            os.remove('main.py')
        except PermissionError:
            print('main.py is not mine')
        open('written.txt', 'w').write('mine')
        print(sorted(os.listdir('.')))
    """)
    assert r.stdout.splitlines() == ["/tmp ['main.py']", "main.py is not mine", "['main.py', 'written.txt']"]


def test_filling_the_disk_stays_in_the_tmpfs(host):
    # What the test itself did, measured where it did it (the host's free disk moves with every other process):
    # both directories are tmpfs of 32 MiB, and the writes filled exactly those.
    r = run("""
        import os
        total = 0
        mounts = {line.split()[4]: line.split(' - ')[1].split()[0] for line in open('/proc/self/mountinfo')}
        print('fs', mounts['/tmp'], mounts['/dev/shm'])
        for d in ('/tmp', '/dev/shm'):
            for i in range(1000):
                try:
                    with open(f'{d}/fill{i}', 'wb') as f:
                        for _ in range(64):
                            f.write(b'\\0' * (1 << 20)); f.flush(); total += 1 << 20
                except OSError as e:
                    print(d, e.errno)
                    if e.errno == 28:  # ENOSPC: this filesystem is full, try the next
                        break
        for d in ('/tmp', '/dev/shm'):
            st = os.statvfs(d)
            print('used', d, (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize)
        print('total', total)
    """, tmpfs_mb=32, max_file_mb=8, timeout_s=10)
    lines = r.stdout.split("\n")
    assert lines[0] == "fs tmpfs tmpfs"  # in memory, in the sandbox's own mounts: not the host's disk
    assert "/tmp 27" in lines  # EFBIG: one file stops at RLIMIT_FSIZE
    assert "/tmp 28" in lines and "/dev/shm 28" in lines  # ENOSPC: the tmpfs sizes bound the total
    total = int(r.stdout.split("total")[1])
    used = {ln.split()[1]: (int(ln.split()[2]), int(ln.split()[3])) for ln in lines if ln.startswith("used")}
    assert used["/dev/shm"][1] == 32 << 20 and used["/dev/shm"][0] == used["/dev/shm"][1]  # full, at its size
    assert used["/tmp"][0] == used["/tmp"][1] <= (32 << 20) + (1 << 20)  # /tmp: its size (+ room for a stdin)
    assert total <= used["/tmp"][0] + used["/dev/shm"][0] <= 2 * (33 << 20)


# --- sockets and the network ---------------------------------------------------------------------------------

def test_the_hosts_unix_sockets_are_unreachable(host):
    r = run(f"""
        import socket
        for addr in ({host.unix_path!r}, {host.abstract!r}, '/run/docker.sock', '/var/run/docker.sock',
                     '/run/dbus/system_bus_socket', '/run/systemd/private'):
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(addr); print('CONNECTED', addr)
            except OSError as e:
                print('blocked', e.errno)
    """)
    # EPERM: the program may make no socket at all (before: ENOENT, ECONNREFUSED; the host's were never there)
    assert r.stdout.split() == ["blocked", "1"] * 6


def test_no_network_to_the_hosts_loopback_or_beyond(host):
    r = run(f"""
        import socket
        for addr in (('127.0.0.1', {host.tcp_port}), ('localhost', {host.tcp_port}), ('1.1.1.1', 53)):
            try:
                socket.create_connection(addr, timeout=0.5); print('CONNECTED', addr)
            except OSError as e:
                print('blocked')
        try:
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.sendto(b'x', ('8.8.8.8', 53)); print('SENT')
        except OSError as e:
            print('blocked', e.errno)
    """)
    assert r.stdout.split()[:3] == ["blocked"] * 3
    assert r.stdout.split()[3:] == ["blocked", "1"]  # EPERM: no socket to send from


def test_vsock_packet_and_raw_sockets_are_refused(host):
    r = run("""
        import socket
        for family, kind in ((40, socket.SOCK_STREAM), (17, socket.SOCK_RAW), (socket.AF_INET, socket.SOCK_RAW)):
            try:
                socket.socket(family, kind, 0 if family != socket.AF_INET else 1); print('OPENED', family)
            except OSError as e:
                print('blocked', e.errno)
    """)
    assert r.stdout.split() == ["blocked", "1"] * 3  # EPERM: vsock is not namespaced, packet/raw need CAP_NET_RAW


# --- the kernel: namespaces, tracing, keyring, bpf, mounts (the seccomp filter) --------------------------------

SYSCALL = """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
A = 0 if platform.machine() == "x86_64" else 1
def sys_(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr[A]), *[ctypes.c_long(a) for a in args])
    return ctypes.get_errno() if r == -1 else 'ok'
"""


def test_nested_user_namespace_is_refused(host):
    r = run(SYSCALL + """
print(sys_((272, 97), 0x10000000))                     # unshare(CLONE_NEWUSER)
print(sys_((272, 97), 0x10000000 | 0x20000))           # ... and a mount namespace: "root" inside
print(sys_((56, 220), 0x10000000 | 17, 0, 0, 0, 0))    # clone(CLONE_NEWUSER | SIGCHLD)
print(sys_((56, 220), 0x40000000 | 17, 0, 0, 0, 0))    # clone(CLONE_NEWNET | SIGCHLD)
import os
try:
    os.unshare(os.CLONE_NEWUSER)                       # Python >= 3.12 has it
    print('ok')
except AttributeError:
    print(1)
except OSError as e:
    print(e.errno)
    """)
    assert r.stdout.split() == ["1"] * 5  # EPERM


def test_ptrace_of_the_parent_and_a_sibling_is_refused(host):
    r = run(SYSCALL + """
import os, time
kid = os.fork()
if kid == 0:
    time.sleep(5); os._exit(0)
print(sys_((101, 117), 16, 1, 0, 0))     # PTRACE_ATTACH to pid 1
print(sys_((101, 117), 16, kid, 0, 0))   # to its own child
print(sys_((101, 117), 0, 0, 0, 0))      # PTRACE_TRACEME
print(sys_((310, 270), kid, 0, 0, 0, 0, 0))  # process_vm_readv
os.kill(kid, 9)
    """)
    assert r.stdout.split() == ["1"] * 4


def test_kernel_keyring_bpf_and_perf_are_refused(host):
    r = run(SYSCALL + """
print(sys_((250, 219), 0, -3, 1, 0))          # keyctl(KEYCTL_GET_KEYRING_ID, session, create)
print(sys_((248, 217), 0, 0, 0, 0, -3))       # add_key
print(sys_((249, 218), 0, 0, 0, -3))          # request_key
print(sys_((321, 280), 0, 0, 0))              # bpf(BPF_MAP_CREATE)
print(sys_((298, 241), 0, 0, -1, -1, 0))      # perf_event_open
print(sys_((323, 282), 0))                    # userfaultfd
print(sys_((425, 425), 8, 0))                 # io_uring_setup
print(sys_((175, 105), 0, 0, 0))              # init_module
    """)
    assert r.stdout.split() == ["1"] * 8


def test_mount_chroot_and_pivot_root_are_refused(host):
    r = run(SYSCALL + """
import ctypes
b = lambda s: ctypes.cast(ctypes.c_char_p(s), ctypes.c_void_p).value
print(sys_((165, 40), b(b'none'), b(b'/tmp'), b(b'tmpfs'), 0, 0))   # mount
print(sys_((166, 39), b(b'/tmp'), 2))                                # umount2(MNT_DETACH)
print(sys_((161, 51), b(b'/tmp')))                                   # chroot
print(sys_((155, 41), b(b'/tmp'), b(b'/tmp')))                       # pivot_root
print(sys_((308, 268), 0, 0))                                        # setns
    """)
    assert r.stdout.split() == ["1"] * 5


def test_no_capability_no_way_back_to_root(host):
    r = run("""
        import os
        status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())
        print(os.getuid(), os.geteuid())
        for key in ('CapPrm', 'CapEff', 'CapAmb', 'NoNewPrivs', 'Seccomp'):
            print(key, status[key].strip())
        for act in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.setgroups([0])):
            try:
                act(); print('ROOT')
            except PermissionError:
                print('blocked')
    """)
    lines = r.stdout.splitlines()
    uid, euid = lines[0].split()
    assert uid == euid and uid != "0"
    # Inheritable bits may remain (setuid does not clear them); they grant nothing without file capabilities,
    # which no_new_privs and a root without setuid or capability-carrying binaries rule out.
    assert lines[1:6] == ["CapPrm 0000000000000000", "CapEff 0000000000000000", "CapAmb 0000000000000000",
                          "NoNewPrivs 1", "Seccomp 2"]
    assert lines[6:] == ["blocked"] * 3


def test_personality_and_x32_calls_are_refused(host):
    r = run(SYSCALL + """
print(sys_((135, 92), 0x0040000))                      # ADDR_NO_RANDOMIZE
print(sys_((0x40000000 | 39, 0)) if A == 0 else 1)     # the x32 ABI's getpid (x86_64 only)
    """)
    assert r.stdout.split() == ["1", "1"]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="i386 entry point: x86_64 only")
def test_the_32_bit_entry_point_kills_the_process(host):
    # mov eax, 20 (getpid in the i386 table); int 0x80; ret: the filter sees AUDIT_ARCH_I386 and kills (SIGSYS).
    r = run("""
        import ctypes, mmap
        code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        print('pid', ctypes.CFUNCTYPE(ctypes.c_int)(addr)())
    """)
    assert r.killed_by_signal == 31 and "pid" not in r.stdout  # SIGSYS


# --- processes and signals -------------------------------------------------------------------------------------

def test_fork_bomb_is_bounded_and_reaped(host):
    r = run("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """)
    assert r.timed_out  # and the host fixture finds no process left


def test_fork_bomb_hits_the_process_limit(host):
    r = run("""
        import os, time
        kids = 0
        try:
            for _ in range(1000):
                if os.fork() == 0:
                    time.sleep(5); os._exit(0)
                kids += 1
        except OSError as e:
            print('limit', kids, e.errno)
    """, max_processes=8)
    assert r.stdout.startswith("limit") and int(r.stdout.split()[1]) < 8


def test_thread_bomb_hits_the_process_limit(host):
    r = run("""
        import threading, time
        n = 0
        try:
            while True:
                threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); n += 1
        except RuntimeError:
            print('limit', n)
    """)
    assert r.stdout.startswith("limit") and int(r.stdout.split()[1]) < 16


def test_signals_to_the_parent_init_and_host_processes_fail(host):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # its pid is given away
    try:
        first, second = run_tests(f"""
            import os, signal, sys
            if sys.stdin.read() == 'attack':
                for attempt in (lambda: os.kill(os.getppid(), 9), lambda: os.kill(1, signal.SIGSTOP),
                                lambda: os.kill(1, signal.SIGTERM), lambda: os.killpg(os.getpgid(1), 9),
                                lambda: os.kill({bystander.pid}, 9), lambda: os.kill(-1, 9)):
                    try:
                        attempt()
                    except OSError as e:
                        print('blocked', e.errno)
            print('alive')
        """, ["attack", "next"])
        # Pid 1 takes no signal from inside its namespace that it has no handler for, host processes are not
        # in this namespace, and kill(-1) reaches only this uid's processes here: none but the caller.
        assert first.ok and first.stdout.endswith("alive\n")
        assert second.ok and second.stdout == "alive\n"  # the warm interpreter still serves the next test
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("main_exits", ["at_once", "by_timeout"])
def test_detached_daemon_dies_with_its_test(host, main_exits):
    marker = "klear-daemon-" + secrets.token_hex(8)
    r = run(f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', {marker!r}])
            os._exit(0)
        time.sleep(0.2)
        {'time.sleep(60)' if main_exits == 'by_timeout' else 'print("bye")'}
    """)
    assert r.timed_out == (main_exits == "by_timeout")
    assert not any(marker in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
                   for p in filter(str.isdigit, os.listdir("/proc")) if os.path.exists(f"/proc/{p}/cmdline"))


def test_busy_children_die_with_their_test(host):
    r = run("""
        import os
        for _ in range(4):
            if os.fork() == 0:
                while True:
                    pass
        print('parent leaves')
    """)
    assert r.ok and r.stdout == "parent leaves\n"


PEEK_OTHER_PROCESSES = """
    import os, sys
    n = int(sys.stdin.read())
    if n:  # the first test: print n bytes on each stream, which the zygote reads
        os.write(1, b'x' * n)
        os.write(2, b'y' * n)
    else:  # the second: every counter of every other process it can read
        seen = {}
        for p in sorted(x for x in os.listdir('/proc') if x.isdigit() and int(x) != os.getpid()):
            try:
                seen[p] = int(open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[7])  # minflt
            except OSError as e:
                seen[p] = type(e).__name__
        print(seen)
"""


def test_no_process_a_test_can_read_counts_what_the_previous_test_printed(host):
    """The zygote reads every output, and its page faults, resident size and context switches grew with it
    (1,360 against 4,328 page faults in `/proc/1/stat` after 0 and 3 MB): pid 1's /proc entry is hidden. The
    forker, the one other process a test sees, never reads an output: its counts stay within a few faults."""
    after = {}
    for first in (0, 3 << 20):
        r = run_tests(PEEK_OTHER_PROCESSES, [str(first), "0"], max_output_bytes=4 << 20)
        after[first] = eval(r[1].stdout)  # noqa: S307 (a dict of ints and exception names, from our own program)
    quiet, loud = after[0], after[3 << 20]
    assert "1" not in quiet or not isinstance(quiet["1"], int), quiet  # the zygote's stat: not there to read
    assert quiet.keys() == loud.keys() and len(quiet) <= 2, (quiet, loud)
    for pid, faults in quiet.items():
        if isinstance(faults, int):
            assert abs(loud[pid] - faults) <= 16, (pid, faults, loud[pid])  # 3 MB would be ~750 pages read


def test_a_test_cannot_poison_the_next(host):
    program = """
        import json, os, sys, time
        if sys.stdin.read() == 'poison':
            json.dumps = lambda *a, **k: 'POISONED'                 # a module the warm interpreter imported
            open('/tmp/answer.txt', 'w').write('42')                # a file for the next test to find
            os.makedirs('/dev/shm/x', exist_ok=True)
            try:
                open('/tmp/main.py', 'w').write('print(666)')       # the program itself
            except OSError as e:
                print('main.py', e.errno)
            if os.fork() == 0:                                      # a late writer
                time.sleep(0.3)
                print('LATE'); sys.stdout.flush(); os._exit(0)
            print('poisoned')
        else:
            time.sleep(0.4)
            print(json.dumps([1]), sorted(os.listdir('/tmp')), os.listdir('/dev/shm'))
    """
    first, second = run_tests(program, ["poison", "check"])
    assert first.stdout == "main.py 13\npoisoned\n"  # EACCES: root owns it
    assert second.stdout == "[1] ['main.py'] []\n"


def test_forged_frames_do_not_reach_the_host(host):
    results = run_tests("""
        import os, sys
        fake = b'1 0 0 0 0 0 0.0 6 0 0\\nFORGED'
        for fd in range(64):
            try:
                os.write(fd, fake)
            except OSError:
                pass
        print('honest', sys.stdin.read())
    """, ["a", "b"])
    assert [r.stdout.endswith(f"honest {x}\n") for r, x in zip(results, "ab")] == [True, True]
    assert len(results) == 2 and results[1].stdout.count("FORGED") <= 1  # its own stdout, nothing more


def test_infinite_loop_times_out(host):
    r = run("while True:\n    pass\n")
    assert r.timed_out and not r.ok and r.duration_s >= TIMEOUT


def test_sleeping_with_stdout_closed_still_times_out(host):
    r = run("import os, time\nos.close(1); os.close(2)\ntime.sleep(60)\n")
    assert r.timed_out


def test_large_unread_stdin_does_not_hang(host):
    r = run("print('ignored my input')", stdin="1 2 3\n" * 2_000_000)
    assert r.ok and r.stdout == "ignored my input\n"


def test_no_terminal_to_push_input_into(host):
    r = run("""
        import fcntl, os, termios
        for target in (lambda: 0, lambda: os.open('/dev/tty', os.O_RDWR)):
            try:
                fcntl.ioctl(target(), termios.TIOCSTI, b'x'); print('PUSHED')
            except OSError as e:
                print('blocked', e.errno)
    """)
    assert r.stdout.split() == ["blocked", "25", "blocked", "6"]  # ENOTTY (stdin is a file), ENXIO (no tty)


# --- memory and output ---------------------------------------------------------------------------------------

def test_memory_bomb_hits_the_address_space_limit(host):
    r = run("""
        chunks = []
        while True:
            chunks.append(bytearray(50 << 20))
    """, memory_mb=256)
    assert not r.timed_out and r.returncode != 0 and "MemoryError" in r.stderr


def test_one_gigabyte_print_is_cut_at_the_cap(host):
    r = run("""
        import sys
        block = 'x' * (1 << 20)
        for _ in range(1024):
            sys.stdout.write(block)
    """, max_output_bytes=1 << 20)
    assert r.output_limit_exceeded and r.stdout_truncated and len(r.stdout) == 1 << 20


def test_stderr_flood_is_cut_at_the_cap(host):
    r = run("""
        import os
        while True:
            os.write(2, b'e' * 65536)
    """, max_output_bytes=1 << 16)
    # stderr is a log, never a failure: read to its end (here, the CPU limit's) and kept truncated to the cap
    assert r.stderr_truncated and len(r.stderr.encode()) <= 1 << 16 and "[stderr truncated: " in r.stderr
    assert not r.output_limit_exceeded and r.timed_out


def test_too_many_open_files(host):
    r = run("""
        fs = []
        try:
            while True:
                fs.append(open('/dev/null'))
        except OSError as e:
            print(len(fs), e.errno)
    """, max_open_files=32)
    n, errno = map(int, r.stdout.split())
    assert n < 32 and errno == 24  # EMFILE


def test_deep_recursion_is_contained(host):
    # Recursing through eval() recurses in C too: with the recursion limit lifted, the C stack overflows. It
    # takes a fraction of a second of CPU time; the limit is CPU time, so a loaded machine cannot fail it.
    r = run("""
        import sys
        sys.setrecursionlimit(10 ** 8)
        def f(n):
            return eval('f(n + 1)')
        f(0)
    """, timeout_s=10)
    assert not r.timed_out and r.killed_by_signal == 11


def test_segfault_through_ctypes(host):
    r = run("import ctypes\nctypes.string_at(0)\n")
    assert r.returncode == 128 + 11 and r.killed_by_signal == 11


# --- configuration errors and the unsafe opt-in ------------------------------------------------------------------

def test_missing_bwrap_says_how_to_install(monkeypatch):
    monkeypatch.delenv(sandbox.UNSAFE_ENV_VAR, raising=False)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox._bwrap_path.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
            run_python("print(1)")
    finally:
        sandbox._bwrap_path.cache_clear()


def test_namespace_failure_is_reported_with_bwraps_words(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'bubblewrap 0.8.0'; exit 0; }\n"
                    "echo 'bwrap: Creating new namespace failed: Operation not permitted' >&2; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: str(fake))
    sandbox._bwrap_path.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match="namespaces") as e:
            run_python("print(1)")
        assert "Creating new namespace failed" in str(e.value)
    finally:
        sandbox._bwrap_path.cache_clear()


def test_unsafe_mode_warns_on_every_call(monkeypatch):
    monkeypatch.delenv(sandbox.UNSAFE_ENV_VAR, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # even under the filter that shows a warning once per place
        for _ in range(2):
            r = run_python("print(6 * 7)", unsafe_no_sandbox=True, timeout_s=5)
            assert r.stdout == "42\n" and not r.sandboxed
    assert sum(issubclass(w.category, UnsafeSandboxWarning) for w in caught) == 2


# --- the same containment when the caller is not root ------------------------------------------------------------

NON_ROOT_PROBE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from klear_lib.rewards.sandbox import FunctionCall, run_python_tests, wall_limit_s
host_sock, tcp_port, secret_path = sys.argv[2], int(sys.argv[3]), sys.argv[4]
out, overruns = {}, []
def run_python(code, tests=("",), timeout_s=1.0):
    t0 = time.monotonic()
    rs = run_python_tests(code, list(tests), timeout_s=timeout_s)
    overruns.append(time.monotonic() - t0 - len(tests) * wall_limit_s(timeout_s))
    return rs if len(tests) > 1 else rs[0]
r = run_python("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n")
out["fork_bomb"] = r.timed_out
r = run_python("import os; print(os.getuid(), dict(os.environ))")
out["uid_env"] = r.stdout
r = run_python("import socket\nfor a in (%r, ('127.0.0.1', %d)):\n"
               "    try:\n        s = socket.socket(socket.AF_UNIX if isinstance(a, str) else socket.AF_INET)\n"
               "        s.connect(a); print('CONNECTED')\n    except OSError as e: print('blocked', e.errno)"
               % (host_sock, tcp_port))
out["sockets"] = r.stdout.split()
r = run_python("print(open(%r).read())" % secret_path)
out["secret"] = r.stdout + r.stderr
r = run_python(%(syscall)r + "print(sys_((272, 97), 0x10000000), sys_((101, 117), 16, 1, 0, 0), "
               "sys_((250, 219), 0, -3, 1, 0), sys_((321, 280), 0, 0, 0), sys_((165, 40), 0, 0, 0, 0, 0))")
out["seccomp"] = r.stdout.split()
r = run_python("import os\nfor p in ('/proc/1/mem', '/proc/1/fd'):\n    try:\n"
               "        os.listdir(p) if p.endswith('fd') else open(p, 'rb').read(1); print('OPEN')\n"
               "    except OSError as e: print('blocked')")
out["zygote"] = r.stdout.split()
r = run_python("print(open('/proc/1/stat').read()[:20])")
out["zygote_stat"] = r.stderr.splitlines()[-1:]
rs = run_python_tests("import os\nfor _ in range(int(input())):\n    os.waitpid(os.fork() or os._exit(0), 0)\n"
                      "print(os.getpid())", ["5", "0", "3"])
out["pids"] = [r.stdout for r in rs]
rs = run_python("import json, sys\njson.n = getattr(json, 'n', 0) + 1\ndef f(): return json.n\n"
                "if __name__ == '__main__': print(json.n, sys.stdin.read())", ["a", FunctionCall("f"), "b"])
out["isolation"] = [rs[0].stdout, rs[1].value, rs[2].stdout]
# Without root the tests share the zygote's uid and own /tmp and main.py: what they change there is set back, or
# no further test runs.
RESET = ("import os, sys\nw = sys.stdin.read()\n"
         "if w == 'chmod': os.chmod('/tmp', 0o700); os.chmod('/dev/shm', 0o755)\n"
         "if w == 'xattr': os.setxattr('/tmp', 'user.progress', b'42')\n"
         "if w == 'main': os.chmod('/tmp/main.py', 0o644); open('/tmp/main.py', 'a').write('#')\n"
         "print(oct(os.stat('/tmp').st_mode), oct(os.stat('/dev/shm').st_mode), os.listxattr('/tmp'))")
out["reset"] = {w: [(r.returncode, r.stdout, r.stderr[-120:]) for r in run_python(RESET, [w, "look"])]
                for w in ("chmod", "xattr", "main")}
out["overruns"] = overruns
print(json.dumps(out))
""".replace("%(syscall)r", repr(SYSCALL))


def test_non_root_caller_is_contained_too(host):
    """As root, run the sandbox as `nobody` (a user namespace, no uid drop): the other code path."""
    if shutil.which("bwrap") is None:
        pytest.skip(NO_BWRAP)
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to impersonate a non-root caller")
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "env", "-i"]
    python = next((p for p in (os.path.realpath(sys.executable), "/usr/bin/python3")
                   if subprocess.run([*as_nobody, p, "-I", "-c", "import json, selectors"],  # really read from disk
                                     capture_output=True).returncode == 0), None)
    if python is None:
        pytest.skip("no interpreter that nobody can run")
    # nobody may not be able to read the checkout (a fresh clone under a 0700 mktemp dir) or pytest's tmp_path:
    # give it a folder of its own with a copy of the sandbox modules in a package skeleton, a home, and a
    # unix socket it could connect to from outside the sandbox.
    work = Path(tempfile.mkdtemp(prefix="klear-nobody-"))
    server = socket.socket(socket.AF_UNIX)
    try:
        pkg = work / "lib" / "klear_lib" / "rewards"
        pkg.mkdir(parents=True)
        for init in (pkg.parent / "__init__.py", pkg / "__init__.py"):
            init.write_text("")
        for name in ("sandbox", "sandbox_cgroup", "sandbox_exec", "sandbox_json", "sandbox_root", "sandbox_zygote",
                     "seccomp"):
            shutil.copyfile(REPO / "klear_lib" / "rewards" / f"{name}.py", pkg / f"{name}.py")
        home = work / "home"
        home.mkdir()
        (home / "secret.txt").write_text(host.secret)
        for p in [work, *work.rglob("*")]:
            os.chown(p, 65534, 65534)
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        sock = str(work / "host.sock")
        server.bind(sock)
        server.listen(1)
        server.setblocking(False)
        os.chmod(sock, 0o777)
        p = subprocess.run([*as_nobody, f"HOME={home}", "KLEAR_TEST_API_KEY=" + host.secret, python, "-I", "-c",
                            NON_ROOT_PROBE, str(work / "lib"), sock, str(host.tcp_port), str(home / "secret.txt")],
                           capture_output=True, text=True, timeout=120)
        if "namespace" in p.stderr and p.returncode != 0:
            pytest.skip(f"unprivileged user namespaces are not allowed here: {p.stderr[-300:]}")
        assert p.returncode == 0, p.stderr
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
        shutil.rmtree(work)
    out = json.loads(p.stdout)
    PROGRAMS.extend(out["overruns"])
    assert max(out["overruns"]) <= SLACK
    assert out["fork_bomb"]
    assert out["uid_env"].startswith("65534 ") and host.secret not in out["uid_env"]
    assert out["sockets"] == ["blocked", "1", "blocked", "1"]  # EPERM: no socket at all
    assert host.secret not in out["secret"] and "FileNotFoundError" in out["secret"]  # $HOME is not there
    assert out["seccomp"] == ["1"] * 5  # EPERM: the filter holds without root too
    assert out["zygote"] == ["blocked", "blocked"]  # the non-dumpable warm interpreter
    assert out["zygote_stat"][0].startswith("FileNotFoundError"), out["zygote_stat"]  # its counters hidden
    assert len(set(out["pids"])) == 1 and out["pids"][0].strip().isdigit(), out["pids"]  # the pid counter set back
    assert out["isolation"] == ["1 a\n", 1, "1 b\n"]
    clean = "0o41777 0o41777 []\n"
    assert out["reset"]["chmod"][1][:2] == [0, clean]  # the modes set back
    for what in ("xattr", "main"):
        if "not supported" in out["reset"][what][0][2]:
            continue  # no user xattrs on this kernel's tmpfs (before Linux 6.6): nothing to leave
        returncode, stdout, stderr = out["reset"][what][1]
        assert (returncode, stdout) == (1, "") and stderr.startswith("not run: the sandbox could not be reset"), what
