"""Proof by hostile input: programs written to escape or exhaust the code sandbox, each shown contained.

Every test runs one hostile program through `run_python` and asserts three things: the program did not get what
it wanted (host files, secrets, network, surviving processes), the host is unchanged, and the result came back
within `timeout_s + 2` s of wall time. Timeouts are short (2 s) to keep this file fast.
"""

from __future__ import annotations

import json
import os
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

from klear_lib.rewards import sandbox
from klear_lib.rewards.sandbox import SandboxUnavailableError, UnsafeSandboxWarning, run_python

NO_BWRAP = "bubblewrap is not installed (apt-get install bubblewrap, or `make`)"
TIMEOUT = 2.0
SLACK = 2.0  # the brief: every result within timeout_s + 2 s
OVERRUNS: list[float] = []  # wall time minus timeout_s of every run; the worst is printed (pytest -s)


@pytest.fixture(scope="module", autouse=True)
def report_worst_overrun():
    yield
    if OVERRUNS:
        print(f"\nhostile corpus: {len(OVERRUNS)} runs, worst wall time = timeout_s {max(OVERRUNS):+.3f} s")


def run(code: str, **kw):
    """Run a hostile program; assert it came back in time; return the result."""
    if shutil.which("bwrap") is None:
        pytest.skip(NO_BWRAP)
    kw.setdefault("timeout_s", TIMEOUT)
    t0 = time.monotonic()
    r = run_python(textwrap.dedent(code), **kw)
    wall = time.monotonic() - t0
    OVERRUNS.append(wall - kw["timeout_s"])
    assert wall <= kw["timeout_s"] + SLACK, f"took {wall:.2f} s"
    assert r.sandboxed
    return r


def snapshot(d: Path) -> dict:
    """Every file under d with its bytes: the 'host unchanged' check."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def pids_with(marker: str) -> list[int]:
    """Host processes whose command line or name contains `marker`."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            text = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            text += " " + (p / "comm").read_text()
        except OSError:
            continue
        if marker in text:
            found.append(int(p.name))
    return found


@pytest.fixture
def visible_dir():
    """A host directory the sandbox CAN see (not under a masked dir), so that writes meet the read-only bind."""
    masked = sandbox._masked_dirs()
    for base in ("/var/cache", "/opt", "/srv", os.getcwd()):
        base = os.path.realpath(base)
        if os.access(base, os.W_OK) and not any(sandbox._is_under(base, m) for m in masked):
            d = Path(tempfile.mkdtemp(prefix="klear-sandbox-test-", dir=base))
            os.chmod(d, 0o777)  # world-writable on purpose: only the read-only bind may stop the program
            (d / "planted.txt").write_text("original\n")
            os.chmod(d / "planted.txt", 0o666)
            yield d
            shutil.rmtree(d, ignore_errors=True)
            return
    pytest.skip("no writable host directory outside the masked ones")


# --- resource exhaustion ---------------------------------------------------------------------------------------

def test_fork_bomb_is_bounded_and_reaped():
    marker = "klear-forkbomb-" + secrets.token_hex(8)
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run(f"""
        import os, sys
        os.execv(sys.executable, [sys.executable, '-c', {bomb!r}, {marker!r}])  # the marker is in every copy's argv
    """)
    assert r.timed_out
    assert pids_with(marker) == []  # every forked copy died with the sandbox


def test_fork_bomb_hits_the_process_limit():
    r = run("""
        import os, sys
        kids = 0
        try:
            for _ in range(1000):
                if os.fork() == 0:
                    import time; time.sleep(5); os._exit(0)
                kids += 1
        except OSError as e:
            print('limit', kids, e.errno)
    """, max_processes=8)
    assert r.stdout.startswith("limit")
    assert int(r.stdout.split()[1]) < 8


def test_thread_bomb_hits_the_process_limit():
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


def test_infinite_loop_times_out():
    r = run("while True:\n    pass\n")
    assert r.timed_out and not r.ok and r.duration_s >= TIMEOUT


def test_sleeping_with_stdout_closed_still_times_out():
    r = run("import os, time\nos.close(1); os.close(2)\ntime.sleep(60)\n")
    assert r.timed_out


def test_memory_bomb_hits_the_address_space_limit():
    r = run("""
        chunks = []
        while True:
            chunks.append(bytearray(50 << 20))
    """, memory_mb=256)
    assert not r.timed_out and r.returncode != 0
    assert "MemoryError" in r.stderr


def test_one_gigabyte_print_is_cut_at_the_cap():
    r = run("""
        import sys
        block = 'x' * (1 << 20)
        for _ in range(1024):
            sys.stdout.write(block)
    """, max_output_bytes=1 << 20)
    assert r.output_limit_exceeded and r.stdout_truncated
    assert len(r.stdout) == 1 << 20


def test_filling_the_disk_stays_in_the_tmpfs():
    before = shutil.disk_usage("/").free
    r = run("""
        import os
        total = 0
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
        print('total', total)
    """, tmpfs_mb=32, max_file_mb=8)
    lines = r.stdout.split("\n")
    assert "/tmp 27" in lines  # EFBIG: one file stops at RLIMIT_FSIZE
    assert "/tmp 28" in lines and "/dev/shm 28" in lines  # ENOSPC: the tmpfs sizes bound the total
    total = int(r.stdout.split("total")[1])
    assert total <= 2 * (32 << 20)
    assert before - shutil.disk_usage("/").free < 32 << 20  # the host's disk did not take it


def test_too_many_open_files():
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


def test_deep_recursion_is_contained():
    # Recursing through eval() recurses in C too: with the recursion limit lifted, the C stack overflows.
    r = run("""
        import sys
        sys.setrecursionlimit(10 ** 8)
        def f(n):
            return eval('f(n + 1)')
        f(0)
    """)
    assert not r.timed_out and r.killed_by_signal == 11  # SIGSEGV: the sandboxed process dies, nothing else


def test_segfault_through_ctypes():
    r = run("import ctypes\nctypes.string_at(0)\n")
    assert r.returncode == 128 + 11 and r.killed_by_signal == 11


# --- the host's files --------------------------------------------------------------------------------------------

def test_writing_and_deleting_host_files_fails(visible_dir, tmp_path):
    (tmp_path / "planted.txt").write_text("original\n")
    before, before_tmp = snapshot(visible_dir), snapshot(tmp_path)
    r = run(f"""
        import os, shutil
        for d in ({str(visible_dir)!r}, {str(tmp_path)!r}):
            for act in (lambda: open(d + '/planted.txt', 'w').write('pwned'),
                        lambda: os.remove(d + '/planted.txt'),
                        lambda: open(d + '/new.txt', 'w').write('pwned'),
                        lambda: shutil.rmtree(d)):
                try:
                    act(); print('DID', d)
                except OSError as e:
                    print('blocked', e.errno)
    """)
    assert "DID" not in r.stdout and r.stdout.count("blocked") == 8
    assert snapshot(visible_dir) == before and snapshot(tmp_path) == before_tmp


def test_subprocess_rm_rf_and_os_system_leave_the_host_alone(visible_dir):
    before = snapshot(visible_dir)
    r = run(f"""
        import os, subprocess
        print(subprocess.run(['rm', '-rf', {str(visible_dir)!r}], capture_output=True).returncode)
        print(os.system('touch {visible_dir}/new.txt; echo pwned > {visible_dir}/planted.txt'))
    """)
    assert r.returncode == 0 and r.stdout.split()[0] != "0"
    assert snapshot(visible_dir) == before and os.listdir(visible_dir) == ["planted.txt"]


def test_cwd_is_private(visible_dir, monkeypatch):
    monkeypatch.chdir(visible_dir)  # the caller's cwd: the program must not get it
    before = snapshot(visible_dir)
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
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["/tmp ['main.py']", "main.py is not mine", "['main.py', 'written.txt']"]
    assert snapshot(visible_dir) == before


def test_home_directory_secret_is_masked():
    home = Path(os.path.expanduser("~"))
    if not os.access(home, os.W_OK):
        pytest.skip(f"cannot plant a file in {home}")
    secret = secrets.token_hex(16)
    planted = home / f".klear-sandbox-secret-{secret[:8]}"
    planted.write_text(secret)
    try:
        r = run(f"""
            import os, glob
            for p in [{str(planted)!r}] + glob.glob('/root/.*') + glob.glob('/home/*/.*') + glob.glob('/home/*/*'):
                try:
                    print(open(p).read())
                except OSError as e:
                    print('blocked', type(e).__name__)
        """)
        assert secret not in r.stdout + r.stderr
        assert "blocked FileNotFoundError" in r.stdout  # masked: the file is not even there
    finally:
        planted.unlink()


def test_hide_paths_masks_more_directories(visible_dir):
    # The rest of the host is readable by design; where the tests live can be hidden too.
    code = f"print(open({str(visible_dir / 'planted.txt')!r}).read())"
    assert run(code).stdout == "original\n\n"
    r = run(code, hide_paths=(str(visible_dir),))
    assert "FileNotFoundError" in r.stderr and "original" not in r.stdout


def test_etc_shadow_is_unreadable():
    if not os.path.exists("/etc/shadow"):
        pytest.skip("no /etc/shadow")
    r = run("print(open('/etc/shadow').read())")
    assert r.returncode != 0 and "PermissionError" in r.stderr and r.stdout == ""


def test_environment_secrets_do_not_leak(monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("KLEAR_TEST_API_KEY", secret)
    r = run("""
        import os
        print(dict(os.environ))
        for pid in os.listdir('/proc'):
            if pid.isdigit():
                try:
                    print(open(f'/proc/{pid}/environ', 'rb').read())
                except OSError:
                    pass
    """)
    assert r.returncode == 0 and "PATH" in r.stdout
    assert secret not in r.stdout + r.stderr


def test_cannot_become_root_again():
    r = run("""
        import os, subprocess
        print(os.getuid())
        try:
            os.setuid(0); print('ROOT')
        except PermissionError:
            print('blocked')
        print(open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0])
    """)
    uid, verdict, no_new_privs = r.stdout.split()
    assert uid != "0" and verdict == "blocked" and no_new_privs == "1"  # setuid binaries cannot elevate either


# --- network -----------------------------------------------------------------------------------------------------

def test_no_network_to_the_hosts_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        r = run(f"""
            import socket
            for host in ('127.0.0.1', 'localhost', '1.1.1.1'):
                try:
                    socket.create_connection((host, {port} if host != '1.1.1.1' else 53), timeout=1)
                    print('CONNECTED', host)
                except OSError as e:
                    print('blocked', host, e.errno)
        """)
        assert "CONNECTED" not in r.stdout and r.stdout.count("blocked") == 3
        with pytest.raises(BlockingIOError):
            server.accept()  # the server saw no connection
    finally:
        server.close()


# --- processes ---------------------------------------------------------------------------------------------------

def test_killing_the_parent_and_its_group_fails():
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # its pid is given away
    try:
        r = run(f"""
            import os, signal
            for attempt in (lambda: os.kill(os.getppid(), 9), lambda: os.killpg(os.getpgid(os.getppid()), 9),
                            lambda: os.kill({bystander.pid}, 9), lambda: os.kill(1, 9), lambda: os.kill(-1, 9)):
                try:
                    attempt()
                except OSError as e:
                    print('blocked', e.errno)
            print('alive')
        """)
        # Inside, pid 1 is bwrap's init (root-owned, or immune to signals from inside its namespace), the host's
        # processes are not visible, and kill(-1) reaches only this uid's processes in this namespace: none.
        assert r.ok and r.stdout.endswith("alive\n")
        assert bystander.poll() is None  # the host process survived; so did this test process
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("main_exits", ["at_once", "by_timeout"])
def test_detached_daemon_dies_with_the_sandbox(main_exits, visible_dir, tmp_path):
    marker = "klear-daemon-" + secrets.token_hex(8)
    targets = [str(visible_dir / "daemon-was-here"), str(tmp_path / "daemon-was-here")]
    daemon = f"import time; time.sleep(1.5); [open(p, 'w').write('x') for p in {targets!r}]"
    r = run(f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, '-c', {daemon!r}, {marker!r}])
            os._exit(0)
        time.sleep(0.3)
        {'time.sleep(60)' if main_exits == 'by_timeout' else 'print("bye")'}
    """)
    assert r.timed_out == (main_exits == "by_timeout")
    assert pids_with(marker) == []  # gone at once, not merely unable to write
    time.sleep(1.8)  # past the daemon's sleep: had it survived, it would have written by now
    assert not any(os.path.exists(p) for p in targets)


def test_large_unread_stdin_does_not_hang():
    r = run("print('ignored my input')", stdin="1 2 3\n" * 2_000_000)
    assert r.ok and r.stdout == "ignored my input\n"


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
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])  # this file alone: stdlib only
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
run_python = sandbox.run_python
out = {}
r = run_python("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n", timeout_s=2)
out["fork_bomb"] = [r.timed_out, r.duration_s]
r = run_python("import os; print(os.getuid(), dict(os.environ))")
out["uid_env"] = r.stdout
r = run_python("import socket\ntry:\n    socket.create_connection(('127.0.0.1', int(%r)), timeout=1)\n"
               "    print('CONNECTED')\nexcept OSError: print('blocked')" % sys.argv[2])
out["net"] = r.stdout.strip()
r = run_python("print(open(%r).read())" % sys.argv[3])
out["secret"] = r.stdout + r.stderr
print(json.dumps(out))
"""


def test_non_root_caller_is_contained_too(visible_dir):
    """As root, run the sandbox as `nobody` (a user namespace, no uid drop): the other code path."""
    if shutil.which("bwrap") is None:
        pytest.skip(NO_BWRAP)
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to impersonate a non-root caller")
    python = next((p for p in (os.path.realpath(sys.executable), "/usr/bin/python3")
                   if subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "env", "-i",
                                      p, "-I", "-c", "import json, selectors"],  # not frozen: really read from disk
                                     capture_output=True).returncode == 0), None)
    if python is None:
        pytest.skip("no interpreter that nobody can run")
    home = visible_dir / "home"  # outside /root and /home: masked only because it is the caller's $HOME
    home.mkdir(mode=0o755)
    os.chown(home, 65534, 65534)
    secret = secrets.token_hex(16)
    (home / "secret.txt").write_text(secret)
    os.chown(home / "secret.txt", 65534, 65534)
    # nobody may not be able to read the checkout (a fresh clone under a 0700 mktemp dir): give it a copy
    module_copy = visible_dir / "sandbox_module.py"
    shutil.copyfile(sandbox.__file__, module_copy)
    os.chmod(module_copy, 0o644)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    try:
        p = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "env", "-i",
                            f"HOME={home}", "KLEAR_TEST_API_KEY=" + secret, python, "-I", "-c", NON_ROOT_PROBE,
                            str(module_copy), str(server.getsockname()[1]), str(home / "secret.txt")],
                           capture_output=True, text=True, timeout=60)
        if "namespace" in p.stderr:
            pytest.skip(f"unprivileged user namespaces are not allowed here: {p.stderr[-300:]}")
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["fork_bomb"][0] and out["fork_bomb"][1] <= 2 + SLACK
        assert out["uid_env"].startswith("65534 ") and secret not in out["uid_env"]
        assert out["net"] == "blocked"
        assert secret not in out["secret"] and "FileNotFoundError" in out["secret"]  # $HOME is masked
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
