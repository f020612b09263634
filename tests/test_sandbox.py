"""The sandbox's behaviour: one sandbox per sample with a fresh process per test, the frame protocol, the
minimal root, and reaping (no zombie, no stray process after 200 calls under a parent that never reaps)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from klear_lib.rewards import sandbox, sandbox_cgroup, sandbox_root, sandbox_zygote
from klear_lib.rewards.sandbox import FunctionCall, UnsafeSandboxWarning, run_python, run_python_tests

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap is not installed (apt-get install bubblewrap, or `make`)")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- the frame protocol and result assembly ----------------------------------------------------------------------

def test_frames_round_trip_and_a_cut_frame_is_dropped():
    a = sandbox_zygote.encode_frame(0, 256, 0.25, 0.125, b"out\n\nx", b"", b"json [1]\n")
    b = sandbox_zygote.encode_frame(1, 9, 2.0, 1.5, b"1 2 3\n", b"err", b"", timed_out=True, overflow=True,
                                    out_truncated=True, memory_exceeded=True)
    frames = sandbox_zygote.decode_frames(a + b + b[:-2])  # a third frame cut short: not reported
    assert len(frames) == 2
    assert frames[0] == {"i": 0, "status": 256, "timed_out": False, "overflow": False, "out_truncated": False,
                         "err_truncated": False, "result_overflow": False, "memory_exceeded": False,
                         "duration_s": 0.25, "cpu_s": 0.125, "out": b"out\n\nx", "err": b"", "result": b"json [1]\n"}
    assert (frames[1]["i"], frames[1]["timed_out"], frames[1]["overflow"], frames[1]["memory_exceeded"],
            frames[1]["cpu_s"], frames[1]["out"], frames[1]["err"]) == (1, True, True, True, 1.5, b"1 2 3\n", b"err")
    assert sandbox_zygote.decode_frames(b"garbage header\n" + a) == []  # a malformed header ends the stream


def test_results_decode_wait_statuses_and_fill_missing_tests():
    frames = sandbox_zygote.decode_frames(
        sandbox_zygote.encode_frame(0, 3 << 8, 0.1, 0.1, b"", b"", b"json {\"a\": [1, 2]}\n")
        + sandbox_zygote.encode_frame(1, 11, 0.1, 0.1, b"", b"", b"repr {1, 2}\n")
        + sandbox_zygote.encode_frame(2, 0, 0.1, 0.1, b"", b"", b"json [1]\njson [2]\n")
        + sandbox_zygote.encode_frame(3, 0, 0.1, 0.1, b"", b"", b"json [[[" + b"[" * 300 + b"\n"))
    raw = sandbox.Raw(returncode=-9, stdout=b"", stderr=b"killed", timed_out=True)
    r0, r1, r2, r3, r4 = sandbox._results(frames, 5, raw, sandboxed=True)
    assert (r0.returncode, r0.killed_by_signal, r0.returned, r0.value) == (3, None, True, {"a": [1, 2]})
    assert (r1.returncode, r1.killed_by_signal, r1.value, r1.value_is_json) == (128 + 11, 11, "{1, 2}", False)
    assert (r2.returned, r2.value_is_json) == (True, False) and "not one line" in r2.value  # two records: neither
    assert (r3.value_is_json, r3.value) == (False, "result nested 303 deep (more than 200)")
    assert r4.timed_out and "sandbox ended before this test finished: killed" in r4.stderr  # the host's deadline


def test_a_test_must_be_a_string_or_a_function_call():
    with pytest.raises(TypeError, match="stdin string or a FunctionCall, got dict"):
        run_python_tests("print(1)", [{"input": "1"}])
    assert run_python_tests("print(1)", []) == []


# --- one sandbox per sample, a fresh process per test --------------------------------------------------------------

@needs_bwrap
def test_globals_files_and_pids_do_not_carry_over_between_tests():
    # json is imported by the warm interpreter before the fork: a test that mutates it changes its own copy only.
    program = textwrap.dedent("""
        import json, os, sys
        json.seen = getattr(json, "seen", 0) + 1
        with open("/tmp/state", "a") as f:
            f.write(sys.stdin.read())
        os.makedirs("/tmp/d/e", exist_ok=True); os.chmod("/tmp/d", 0o500)  # even a dir it locked itself out of
        print(json.seen, open("/tmp/state").read(), sorted(os.listdir("/tmp")), os.getppid())
    """)
    results = run_python_tests(program, ["a", "b", "c"], timeout_s=5)
    assert [r.stdout.split() for r in results] == [
        ["1", x, "['d',", "'main.py',", "'state']", "1"] for x in "abc"]


@needs_bwrap
def test_hang_crash_flood_and_exit_cost_only_their_own_test():
    program = textwrap.dedent("""
        import os, sys, time
        cmd = sys.stdin.read().strip()
        if cmd == "hang":
            while True:
                pass
        if cmd == "segv":
            import ctypes; ctypes.string_at(0)
        if cmd == "flood":
            while True:
                sys.stdout.write("x" * 65536)
        if cmd == "exit3":
            sys.exit(3)
        if cmd == "sleep":
            time.sleep(0.3)
        print("fine", cmd)
    """)
    t0 = time.monotonic()
    rs = run_python_tests(program, ["a", "hang", "segv", "flood", "exit3", "sleep", "b"], timeout_s=1.0,
                          max_output_bytes=1 << 20)
    wall = time.monotonic() - t0
    assert [r.stdout for r in (rs[0], rs[6])] == ["fine a\n", "fine b\n"]
    assert rs[1].timed_out and 1.0 <= rs[1].cpu_s < 1.2 and rs[1].killed_by_signal == 9  # CPU time: load-proof
    assert rs[2].killed_by_signal == 11 and rs[2].returncode == 139 and not rs[2].timed_out
    assert rs[3].output_limit_exceeded and rs[3].stdout_truncated and len(rs[3].stdout) == 1 << 20
    assert rs[4].returncode == 3 and not rs[4].ok
    assert rs[5].ok and 0.3 <= rs[5].duration_s < 3.0 and rs[5].cpu_s < 0.2  # its own time, fork to exit
    assert wall < rs[1].duration_s + 4.0  # one hang costs one timeout, not one per sibling


@needs_bwrap
def test_a_daemon_left_by_one_test_is_gone_before_the_next():
    program = textwrap.dedent("""
        import os, sys, time
        if sys.stdin.read() == "spawn":
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(60)
                os._exit(0)
            time.sleep(0.1)
        print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
    """)
    first, second = run_python_tests(program, ["spawn", "look"], timeout_s=5)
    assert len(json.loads(first.stdout)) >= 4  # pid 1, the forker, the test, its daemon (its first child may be a
    assert json.loads(second.stdout) == json.loads(first.stdout)[:3]  # zombie); then pid 1, the forker, the test


@needs_bwrap
def test_function_calls_and_stdin_tests_share_one_program():
    program = textwrap.dedent("""
        def double(x):
            return 2 * x
        def pair(x):
            return (x, {"k": x})
        def odd(x):
            return {x}
        class Solution:
            def twice(self, s):
                return s * 2
        if __name__ == "__main__":
            print(double(int(input())))
    """)
    rs = run_python_tests(program, [FunctionCall("double", [21]), FunctionCall("pair", ["a"]), "5",
                                    FunctionCall("odd", [3]), FunctionCall("twice", ["ab"]),
                                    FunctionCall("nothere", [])], timeout_s=5)
    assert (rs[0].returned, rs[0].value, rs[0].stdout) == (True, 42, "")  # the __main__ block stays out
    assert rs[1].value == ["a", {"k": "a"}]  # through JSON: the tuple is a list
    assert (rs[2].stdout, rs[2].returned) == ("10\n", False)  # a stdin test runs the __main__ block
    assert (rs[3].returned, rs[3].value_is_json, rs[3].value) == (True, False, "{3}")
    assert rs[4].value == "abab"
    assert rs[5].returncode == 1 and not rs[5].returned and "NameError: no function 'nothere'" in rs[5].stderr


@needs_bwrap
def test_a_value_leaves_through_json_without_any_process_importing_json():
    """A function-call test's value is encoded as json.dumps would (the zygote's `_json_dumps`), and neither the
    warm interpreter nor the test's process imports json for it (12 ms each): seen from an atexit handler, which
    runs after the value is reported."""
    program = textwrap.dedent("""
        import atexit, sys
        SEEN = 'json' in sys.modules
        atexit.register(lambda: sys.stderr.write(f"{SEEN} {'json' in sys.modules}"))
        def f(x):
            return {"x": x, "l": [1, 2.5, None, True, "\u00e9"], "t": (1,)}
    """)
    rs = run_python_tests(program, [FunctionCall("f", [1]), FunctionCall("f", ["a"])], timeout_s=5)
    assert [(r.returned, r.value, r.stderr) for r in rs] == [
        (True, {"x": x, "l": [1, 2.5, None, True, "\u00e9"], "t": [1]}, "False False") for x in (1, "a")]


def test_the_zygotes_encoder_writes_what_json_dumps_writes():
    dumps = sandbox_zygote._json_dumps()
    assert dumps is not json.dumps  # the C encoder itself (this interpreter has _json)
    cyclic: list = []
    cyclic.append(cyclic)
    values = [0, -1, 10 ** 40, 1.5, float("nan"), float("inf"), -float("inf"), 1e300, True, None, "",
              "a\"\n\u00e9\U0001f600", [], {}, [1, [2, [3]]], (1, "t"), {"k": [1, {"n": None}]},
              {1: "int key", 2.5: "f", False: "b", None: "n"}, "x" * 1000, [0.1] * 5]
    for v in values:
        assert dumps(v) == json.dumps(v), v
    for bad in ({1, 2}, {(1, 2): 3}, cyclic, object(), [b"bytes"]):
        with pytest.raises((TypeError, ValueError)):
            json.dumps(bad)
        with pytest.raises((TypeError, ValueError)):
            dumps(bad)


@needs_bwrap
def test_tracebacks_read_as_pythons_own():
    r = run_python("def f():\n    raise ValueError('boom')\nf()\n")
    assert r.returncode == 1
    assert r.stderr == ('Traceback (most recent call last):\n  File "/tmp/main.py", line 3, in <module>\n'
                        '    f()\n  File "/tmp/main.py", line 2, in f\n    raise ValueError(\'boom\')\n'
                        'ValueError: boom\n')
    # compiled as `python main.py` would: no __future__ flag of the host's or the warm interpreter's code
    r = run_python("def f(x: int): pass\nprint(f.__annotations__)")
    assert r.stdout == "{'x': <class 'int'>}\n"
    r = run_python("print(1\n")
    assert r.returncode == 1 and r.stderr.endswith("SyntaxError: '(' was never closed\n")
    assert run_python("import sys; sys.exit('bye')").stderr == "bye\n"


@needs_bwrap
def test_the_hosts_backstop_ends_a_stuck_sandbox(monkeypatch):
    # The warm interpreter enforces each test's timeout; the host's deadline (startup budget + per-test slack) is
    # the backstop should the sandbox as a whole stall. Shrink it below one test's timeout to see it act.
    monkeypatch.setattr(sandbox, "STARTUP_BUDGET_S", 0.5)
    # budget: 0.5 + 2 x (wall 3 + reset 5 - 7.5) = 1.5 s
    monkeypatch.setattr(sandbox, "PER_TEST_SLACK_S", -7.5)
    already = set(children_of(os.getpid()))  # e.g. multiprocessing's resource tracker from an earlier test
    t0 = time.monotonic()
    program = "import sys, time\nif sys.stdin.read() == 'hang':\n    time.sleep(60)\nprint('ok')"
    first, second = run_python_tests(program, ["quick", "hang"], timeout_s=3.0, wall_timeout_s=3.0)
    assert time.monotonic() - t0 < 2.5
    assert first.ok and first.stdout == "ok\n"  # its frame came before the kill
    assert second.timed_out and second.stderr.startswith("the sandbox ended before this test finished")
    assert set(children_of(os.getpid())) <= already  # bwrap waited for, and the whole sandbox with it


def children_of(parent: int) -> list[int]:
    found = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        if ppid == parent:
            found.append(int(p))
    return found


# --- the minimal root ------------------------------------------------------------------------------------------

@needs_bwrap
def test_the_root_holds_the_interpreter_and_nothing_else():
    info = sandbox_root.interpreter_files(os.path.realpath(sys.executable))
    program = textwrap.dedent("""
        import os, sys
        seen = []
        for top, dirs, files in os.walk("/"):
            if top in ("/proc", "/dev", "/tmp"):
                dirs[:] = []
                continue
            for name in dirs + files:
                path = os.path.join(top, name)
                if os.path.islink(path) or os.path.isfile(path):
                    seen.append(path)
        print("\\n".join(seen))
    """)
    r = run_python(program, timeout_s=20)
    assert r.ok, r.stderr
    visible = r.stdout.split()
    allowed = [*info.directories, *info.files]
    outside = [p for p in visible if not any(sandbox_root.is_under(p, d) for d in allowed)]
    assert all(os.path.islink(p) for p in outside), outside  # the loader's symlinks (/lib64, ...)
    for absent in (REPO, os.path.expanduser("~"), "/etc/passwd", "/etc/shadow", "/run", "/var", "/home"):
        assert [p for p in outside if sandbox_root.is_under(p, absent)] == [], absent
        if not any(sandbox_root.is_under(d, absent) for d in allowed):  # a home may hold the interpreter (pyenv)
            assert [p for p in visible if sandbox_root.is_under(p, absent)] == [], absent
    for hidden in info.hidden:  # the base interpreter's site-packages: present, empty
        assert run_python(f"import os; print(os.listdir({hidden!r}))").stdout == "[]\n"


@needs_bwrap
def test_modules_of_use_only_over_a_socket_are_not_loadable_inside():
    """tkinter's X11 client and nis need a socket, which no program may open: their libraries are not in the root
    (27 fewer files to bind for every sample), so importing them fails as a missing library does; the modules
    a program may use still load."""
    python = os.path.realpath(sys.executable)
    dynload = [p for p in sys.path if os.path.basename(p) == "lib-dynload"]
    present = [m for m in sandbox_root.NOT_SHOWN
               if any(n.split(".")[0] == m for d in dynload for n in os.listdir(d) if n.endswith(".so"))]
    files = sandbox_root.interpreter_files(python).files
    assert not [f for f in files if os.path.basename(f).startswith(("libtk", "libtcl", "libX11", "libnsl"))], files
    program = ("import importlib, sys\nfor m in sys.stdin.read().split():\n    try:\n"
               "        importlib.import_module(m)\n        print(m, 'loaded')\n"
               "    except ImportError:\n        print(m, 'ImportError')\n")
    r = run_python(program, stdin=" ".join(present + ["_ctypes", "_ssl", "_sqlite3", "zlib"]))
    assert r.stdout.split("\n")[:-1] == [f"{m} ImportError" for m in present] + [
        f"{m} loaded" for m in ("_ctypes", "_ssl", "_sqlite3", "zlib")], r.stderr


def test_symlinks_on_the_way_are_recorded(tmp_path):
    (tmp_path / "real" / "lib").mkdir(parents=True)
    (tmp_path / "real" / "lib" / "libx.so").write_text("")
    os.symlink("real", tmp_path / "alias")  # relative, like /lib -> usr/lib
    os.symlink(str(tmp_path / "alias" / "lib" / "libx.so"), tmp_path / "ld.so")  # absolute, through the first
    links = {}
    assert sandbox_root._resolve(str(tmp_path / "ld.so"), links) == str(tmp_path / "real" / "lib" / "libx.so")
    assert links == {str(tmp_path / "ld.so"): str(tmp_path / "alias" / "lib" / "libx.so"),
                     str(tmp_path / "alias"): "real"}
    assert sandbox_root._resolve(str(tmp_path / "missing" / "x"), {}) is None


def test_elf_interpreter_is_read_from_the_program_headers(tmp_path):
    interp = b"/lib/ld-test.so.1\0"
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 32, 64)  # e_phoff: the program headers right after the ELF header
    struct.pack_into("<HH", header, 54, 56, 2)  # e_phentsize, e_phnum
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, 0, 0, 0)  # PT_LOAD, skipped
    pt_interp = struct.pack("<IIQQQQQQ", 3, 4, 64 + 2 * 56, 0, 0, len(interp), len(interp), 1)
    (tmp_path / "elf").write_bytes(bytes(header) + load + pt_interp + interp)
    assert sandbox_root.elf_interpreter(str(tmp_path / "elf")) == "/lib/ld-test.so.1"
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert sandbox_root.elf_interpreter(str(tmp_path / "script")) is None


def _resident_pages(path) -> int:
    """Pages of `path` in the page cache, asked with mincore through a fresh mapping (a second implementation)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # mapped, not touched
        n = -(-len(m) // mmap.PAGESIZE)
        vec = ctypes.create_string_buffer(n)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(len(m)), vec) == 0
        resident = sum(b & 1 for b in vec.raw)
        del addr
        m.close()
    return resident


def _evict(paths) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def test_mapped_files_are_read_back_and_locked_ones_cannot_be_evicted(tmp_path):
    paths = []
    for i, size in enumerate((1, 4096, 3 * 4096 + 5, 70_000)):
        paths.append(tmp_path / f"f{i}")
        paths[-1].write_bytes(os.urandom(size))
    os.symlink(paths[0], tmp_path / "link")  # skipped: its target is listed in its own right
    (tmp_path / "empty").touch()  # skipped: nothing to map
    pages = [-(-os.path.getsize(p) // 4096) for p in paths]
    loose = sandbox_root.map_files([*paths, tmp_path / "link", tmp_path / "empty", tmp_path / "missing"],
                                   lock=False)
    try:
        assert (loose.files, loose.bytes, loose.pinned) == (4, sum(map(os.path.getsize, paths)), False)
        assert loose.refresh() == 0
        _evict(paths)
        if sum(map(_resident_pages, paths)) == 0:  # this filesystem lets the host evict (tmpfs would not)
            assert loose.refresh() == sum(pages)  # every page the host took out, read back
            assert list(map(_resident_pages, paths)) == pages
    finally:
        loose.release()
    held = sandbox_root.map_files(paths)
    try:
        if not held.pinned:
            pytest.skip(f"no memory lock for this user here: {held.why}")
        _evict(paths)
        assert list(map(_resident_pages, paths)) == pages and held.refresh() == 0
    finally:
        held.release()
    assert held.maps == [] and not held.pinned


def test_a_refused_memory_lock_falls_back_and_warns(monkeypatch):
    import ctypes
    import errno

    def refuse(addr, length):
        ctypes.set_errno(errno.ENOMEM)
        return -1

    monkeypatch.setattr(sandbox_root._libc(), "mlock", refuse)
    with pytest.warns(sandbox_root.UnpinnedPageCacheWarning, match=r"mlock refused \(ENOMEM; RLIMIT_MEMLOCK .*"
                                                                    r"ulimit -l"):
        held = sandbox_root.resident_files.__wrapped__(os.path.realpath(sys.executable))
    try:
        assert not held.pinned and held.files > 1000 and "the files need" in held.why
    finally:
        held.release()


# --- reaping ---------------------------------------------------------------------------------------------------

# Runs in a child subreaper that never waits for orphans, like pid 1 of a container without an init: every
# process that loses its parent below it stays its child (a zombie once dead). Prints its children and the
# number of its descendants still alive.
REAP_PROBE = r"""
import ctypes, json, os, subprocess, sys, time
assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
n, how = int(sys.argv[1]), sys.argv[2]
if how == "run_python":
    from klear_lib.rewards.sandbox import run_python
    for i in range(n):
        assert run_python("print(%d)" % i, timeout_s=5).stdout == "%d\n" % i
else:  # bwrap's own init, as the sandbox ran before: the control that shows this probe sees zombies
    for _ in range(n):
        userns = ["--unshare-user"] if os.geteuid() != 0 else []
        subprocess.run(["bwrap", *userns, "--unshare-pid", "--ro-bind", "/", "/", "--", "/bin/true"], check=True)
time.sleep(0.2)
stats = {}
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        text = open(f"/proc/{p}/stat").read()
    except (OSError, NotADirectoryError):
        continue
    head, tail = text.rsplit(")", 1)
    stats[int(p)] = (head.split("(", 1)[1], tail.split()[0], int(tail.split()[1]))  # comm, state, ppid
children = [(c, s) for pid, (c, s, ppid) in stats.items() if ppid == os.getpid()]
descendants, frontier = [], [os.getpid()]
while frontier:
    kids = [pid for pid, (_, _, ppid) in stats.items() if ppid in frontier]
    descendants += kids
    frontier = kids
print(json.dumps({"children": children, "descendants": len(descendants)}))
"""


@needs_bwrap
def test_200_calls_leave_no_zombie_and_no_stray_process():
    def probe(n, how):
        p = subprocess.run([sys.executable, "-c", REAP_PROBE, str(n), how], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    control = probe(3, "bwrap_init")
    assert control == {"children": [["bwrap", "Z"]] * 3, "descendants": 3}  # the probe does see zombies
    assert probe(200, "run_python") == {"children": [], "descendants": 0}


@needs_bwrap
def test_sandbox_status_reports_how_programs_run():
    status = sandbox.sandbox_status()
    assert status["available"] and status["as_root"] == (os.geteuid() == 0) and 0 < status["call_s"] < 10
    assert (status["uid_inside"] != "0") if status["as_root"] else (status["uid_inside"] == str(os.getuid()))


# --- the unsafe opt-out --------------------------------------------------------------------------------------

def test_unsafe_mode_runs_each_test_in_its_own_process(monkeypatch):
    monkeypatch.delenv(sandbox.UNSAFE_ENV_VAR, raising=False)
    program = "import json, os, sys\njson.n = getattr(json, 'n', 0) + 1\nprint(json.n, sys.stdin.read(), os.getppid())"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rs = run_python_tests(program, ["a", "b"], unsafe_no_sandbox=True, timeout_s=5)
    assert [r.stdout.split()[:2] for r in rs] == [["1", "a"], ["1", "b"]]
    assert not rs[0].sandboxed and rs[0].stdout.split()[2] != "1"  # an ordinary process, not a namespace's pid 1
    assert sum(issubclass(w.category, UnsafeSandboxWarning) for w in caught) == 1


# --- a fresh sandbox for every test ------------------------------------------------------------------------------

def test_emptying_a_directory_survives_deep_trees_long_paths_and_locked_dirs(tmp_path):
    # The walk holds directory descriptors: no recursion (3,000 levels), no path length limit (> PATH_MAX), and it
    # gives back permissions a test took away; a symlink is removed, never followed.
    top = tmp_path / "top"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not mine to remove")
    top.mkdir()
    (top / "main.py").write_text("kept")
    fd = os.open(top, os.O_RDONLY)
    for name, depth in (("d", 3000), ("x" * 200, 30)):
        cur = os.dup(fd)
        for _ in range(depth):
            os.mkdir(name, dir_fd=cur)
            nxt = os.open(name, os.O_RDONLY, dir_fd=cur)
            os.close(cur)
            cur = nxt
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, dir_fd=cur), "w") as f:
            f.write("state")
        os.close(cur)
    os.close(fd)
    (top / "locked").mkdir()
    (top / "locked" / "f").write_text("x")
    os.chmod(top / "locked", 0)
    os.symlink(outside, top / "link")
    assert sandbox_zygote._empty(str(top), str(top / "main.py"))
    assert os.listdir(top) == ["main.py"]
    assert (outside / "keep.txt").read_text() == "not mine to remove"


@needs_bwrap
def test_each_test_finds_the_sandbox_as_the_first_one_did():
    # Files behind a deep tree or a long path, a locked directory, timestamps set by a chosen write: all gone or
    # set back before the next test. SysV IPC and POSIX message queues cannot even be created (EPERM).
    program = textwrap.dedent("""
        import ctypes, os, sys, time
        def stamp(p):
            st = os.stat(p)
            return (st.st_mode, st.st_mtime_ns, st.st_atime_ns)
        print(stamp('/tmp'), stamp('/dev/shm'), stamp('/tmp/main.py'))  # before a listing moves the access times
        print(sorted(os.listdir('/tmp')), os.listdir('/dev/shm'))
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.shmget(0, 4096, 0o1600), libc.msgget(0, 0o1600), libc.semget(0, 1, 0o1600), ctypes.get_errno())
        if sys.stdin.read() == 'poison':
            open('/tmp/main.py').read()  # moves its access time
            os.chdir('/tmp')
            for _ in range(20):  # deeper trees are `_empty`'s test; past the counters' quota the reset refuses
                os.mkdir('d'); os.chdir('d')
            open('state', 'w').write('1')
            os.mkdir('/dev/shm/locked'); open('/dev/shm/locked/f', 'w').write('1'); os.chmod('/dev/shm/locked', 0)
            time.sleep(0.05)
            os.mkdir('/tmp/e'); os.rmdir('/tmp/e')  # /tmp's modification time, at a moment of its choosing
    """)
    first, second = run_python_tests(program, ["poison", "check"], timeout_s=5)
    assert first.ok, first.stderr
    assert second.stdout == first.stdout  # the same listing, modes and timestamps; the same refusals
    assert second.stdout.splitlines()[1:] == ["['main.py'] []", "-1 -1 -1 1"]


@needs_bwrap
def test_every_test_finds_the_same_pids_inode_numbers_and_entry_offsets():
    # The counters emptying /tmp does not set back, read as a program would: its own pid, its children's, the
    # inode number and the directory position of a new file, in /tmp and /dev/shm. Test 0 moves them all by
    # different amounts (k forks, k unnamed files, k renames); test 1 repeats. Before, each of them carried k.
    import ctypes

    program = textwrap.dedent("""
        import ctypes, os, sys
        libc = ctypes.CDLL(None, use_errno=True)
        def position(d):  # the position getdents64 gives the entry just made (as _Counters reads it)
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            buf = ctypes.create_string_buffer(1 << 16)
            n = libc.syscall(GETDENTS64, fd, buf, len(buf))
            os.close(fd)
            out, pos = [], 0
            while pos < n:
                out.append(int.from_bytes(buf.raw[pos + 8:pos + 16], 'little', signed=True))
                pos += int.from_bytes(buf.raw[pos + 16:pos + 18], 'little')
            return out
        k = int(sys.stdin.read())
        seen = [os.getpid()]
        for _ in range(k):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        for d in ('/tmp', '/dev/shm'):
            fd = os.open(d, os.O_TMPFILE | os.O_RDWR)
            seen.append(os.fstat(fd).st_ino)
            os.close(fd)
            open(d + '/f', 'w').close()
            seen.append(position(d))
            for i in range(k):
                os.rename(d + '/f', d + '/g') if i % 2 == 0 else os.rename(d + '/g', d + '/f')
                os.close(os.open(d, os.O_TMPFILE | os.O_RDWR))
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print(seen, pid)
    """).replace("GETDENTS64", str({"x86_64": 217, "aarch64": 61}[os.uname().machine]))
    assert ctypes  # the program needs it inside the sandbox, as the zygote does
    runs = [run_python_tests(program, [first, "0\n"], timeout_s=5) for first in ("0\n", "7\n", "20\n")]
    assert all(r.ok for run in runs for r in run), [r.stderr[-300:] for run in runs for r in run]
    after = [run[1].stdout for run in runs]
    assert after[0] == after[1] == after[2], after  # test 1 finds the same, whatever test 0 moved
    pids = {run[i].stdout.split(",")[0] for run in runs for i in (0, 1)}
    assert len(pids) == 1 or not sandbox._pid_counter_supported(), pids  # every test has the same pid (non-root
    # too: test_sandbox_hostile.test_non_root_caller_is_contained_too)
    # More than the quota in one test: the sandbox is not reset, no further test runs.
    over = run_python_tests("import os, sys\nfor _ in range(int(sys.stdin.read())):\n"
                            "    os.close(os.open('/tmp', os.O_TMPFILE | os.O_RDWR))\n",
                            [str(sandbox_zygote.COUNTER_QUOTA["/tmp"] + 10), "0"], timeout_s=5)
    assert over[0].ok and "not run: the sandbox could not be reset" in over[1].stderr
    assert "more than" in over[1].stderr


def test_the_counters_step_plan_moves_each_counter_by_exactly_what_is_asked():
    """`_Counters.advance` moves entries and inodes mostly together (a symlink made and removed), the rest apart
    (renames: entries, and one inode for the file they rename; unnamed files: inodes); every plan lands both
    exactly, or says it cannot (entries to move and no inode left for the renamed file)."""
    for entries in [None, *range(0, 40)]:
        for inodes in [None, *range(0, 40)]:
            plan = sandbox_zygote._step_plan(entries, inodes)
            if plan is None:
                assert inodes == 0 and entries > 0
                continue
            both, renames, unnamed = plan
            assert min(plan) >= 0
            if entries is not None:
                assert both + renames == entries
            if inodes is not None:
                assert both + (renames > 0) + unnamed == inodes


@needs_bwrap
def test_cpu_time_not_wall_time_decides_a_timeout():
    # A test that sleeps uses no CPU: it meets the wall-clock backstop, not the CPU limit; one that computes meets
    # the CPU limit, however slow the machine is (its cpu_s, not its duration, is at the limit).
    program = "import sys, time\nif sys.stdin.read() == 's':\n    time.sleep(60)\nwhile True:\n    pass\n"
    [sleeper] = run_python_tests(program, ["s"], timeout_s=0.5, wall_timeout_s=1.0)
    [spinner] = run_python_tests(program, ["b"], timeout_s=0.5, wall_timeout_s=60.0)
    assert sleeper.timed_out and sleeper.cpu_s < 0.2 and sleeper.duration_s >= 1.0
    assert spinner.timed_out and 0.5 <= spinner.cpu_s < 1.0  # the per-process RLIMIT_CPU backstop is 2 s
    assert sandbox.wall_limit_s(2.0) == 7.0


# --- per-sample cgroups ----------------------------------------------------------------------------------------

def test_cgroup_setup_can_be_turned_off_and_explains_itself(monkeypatch, tmp_path):
    monkeypatch.setenv(sandbox_cgroup.ENV_VAR, "off")
    assert sandbox_cgroup.setup() is None
    assert sandbox_cgroup.status() == {"mode": "none", "why": "KLEAR_SANDBOX_CGROUP=off"}
    monkeypatch.setenv(sandbox_cgroup.ENV_VAR, str(tmp_path))
    assert sandbox_cgroup.setup() is None
    assert "not a directory of a cgroup v2 hierarchy" in sandbox_cgroup.status()["why"]


def test_cgroup_paths_follow_the_mount_root():
    assert sandbox_cgroup._join(("/sys/fs/cgroup", "/"), "/a/b") == "/sys/fs/cgroup/a/b"
    assert sandbox_cgroup._join(("/sys/fs/cgroup", "/a"), "/a/b") == "/sys/fs/cgroup/b"  # a bind-mounted subtree
    assert sandbox_cgroup._join(("/sys/fs/cgroup", "/x"), "/a/b") is None  # outside what is mounted


@needs_bwrap
def test_a_sample_runs_in_its_own_cgroup_removed_after(monkeypatch):
    monkeypatch.delenv(sandbox_cgroup.ENV_VAR, raising=False)
    host = sandbox_cgroup.setup()
    if host is None:
        pytest.skip(f"no usable cgroup here: {sandbox_cgroup.status()['why']}")
    made = []
    real_init = sandbox_cgroup.SampleCgroup.__init__

    def spy(self, h, memory_bytes):
        real_init(self, h, memory_bytes)
        made.append((list(self.dirs), memory_bytes))

    monkeypatch.setattr(sandbox_cgroup.SampleCgroup, "__init__", spy)
    r = run_python("print(open('/proc/self/cgroup').read())", memory_mb=300, tmpfs_mb=10, max_output_bytes=1 << 20)
    [(dirs, memory_bytes)] = made
    assert memory_bytes == sandbox.sample_memory_default_mb(300, 10, 1 << 20) << 20 == (300 + 20 + 3 + 128) << 20
    assert all(not os.path.exists(d) for d in dirs)  # removed once the sandbox was waited for
    name = os.path.basename(dirs[0])
    inside = r.stdout
    assert r.ok and (name in inside or "0::/\n" in inside)  # v1 shows the path; a v2 cgroup namespace shows /


def test_the_wrapper_puts_the_command_and_what_it_starts_in_every_hierarchy_of_the_sample(monkeypatch):
    """The shell moves itself into each of the sample's cgroups (v1: its one thread, through `tasks`, without the
    kernel's global lock; v2: its pid) before it execs the command: the command and its children are inside."""
    monkeypatch.delenv(sandbox_cgroup.ENV_VAR, raising=False)
    if sandbox_cgroup.setup() is None:
        pytest.skip(f"no usable cgroup here: {sandbox_cgroup.status()['why']}")
    cg = sandbox_cgroup.open_sample(64 << 20)
    try:
        script = "cat /proc/self/cgroup; echo --; sh -c 'cat /proc/self/cgroup' & wait"
        r = subprocess.run(cg.wrap(["/bin/sh", "-c", script]), capture_output=True, text=True, timeout=30)
        name = os.path.basename(cg.dirs[0])
        own, child = r.stdout.split("--\n")
        assert r.returncode == 0, r.stderr
        assert own.count(name) == child.count(name) == len(cg.dirs), r.stdout
    finally:
        cg.close()
    assert all(not os.path.exists(d) for d in cg.dirs)


def test_stale_sample_cgroups_of_dead_processes_are_removed(tmp_path, monkeypatch):
    # A pool worker killed mid-sample leaves its (empty) cgroup; a later process removes it once it is old.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    old = time.time() - 2 * sandbox_cgroup.STALE_S
    for name in (f"klear-sandbox-{dead}-0-aa", f"klear-sandbox-{dead}-1-bb", f"klear-sandbox-{os.getpid()}-0-cc",
                 "other"):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (old, old))
    (tmp_path / f"klear-sandbox-{dead}-1-bb" / "busy").mkdir()  # a cgroup with children is not empty: kept
    os.utime(tmp_path / f"klear-sandbox-{dead}-1-bb", (old, old))
    young = tmp_path / f"klear-sandbox-{dead}-2-dd"
    young.mkdir()  # just made: maybe a process in another PID namespace is setting it up
    sandbox_cgroup._remove_stale(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([f"klear-sandbox-{dead}-1-bb", f"klear-sandbox-{os.getpid()}-0-cc",
                                                   "other", young.name])
