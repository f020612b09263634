"""The warm interpreter inside the sandbox: one per sample, it forks one fresh process per test.

Runs as pid 1 of the sandbox's PID namespace, in `python -I -S` (stdlib only: nothing of klear_lib exists inside
the sandbox). `BOOTSTRAP` reads from stdin a marshal of (this module's code or source, the job), and calls
`main(job)`. The job (see `sandbox.run_python_tests`) holds the program, the tests and the limits. `main`
compiles the program once, imports the standard-library modules the program names, and then for each test:

    fork ─ child: stdin/stdout/stderr of its own, rlimits, drop to the sandbox uid, run the program as __main__
         │        (or as module `solution`, then call one function), and exit as the interpreter would
         └ here:  collect the child's output (capped); kill it at the per-test timeout or the output cap; reap
                  it; kill whatever it left behind and empty /tmp; send the test's frame to the host

So a test that mutates globals, kills its process, hangs, leaves daemons or fills /tmp costs only itself. A
frame is a header line of ten numbers followed by the raw stdout, stderr and result bytes it announces.

Pid 1 of a namespace gets no signal from inside it that it has no handler for, so a test cannot kill this
process; as root the tests run under another uid, and otherwise this process makes itself non-dumpable, so
that a test cannot reach its memory or its descriptors (the frame pipe) through /proc either. What a test can
always do is lie about its own result: a function-call test's result is written by code in the test's own
process, behind a per-test nonce that the program could find in its memory.

Without a sandbox (the explicit opt-out) this runs as an ordinary process: each test gets its own session and
its process group is killed, which a setsid() escapes.

Start-up is paid once per sample and this module is on that path: it imports `posix` (built in) rather than
`os` (~1.5 ms), no json/re (~10 ms) unless a function-call test needs json, and the host sends it compiled.
"""

import posix
import resource
import select
import sys
import time

# Read the job, run this module's code (a code object when the host's Python matches, else the source), go; then
# skip the interpreter's teardown (~2 ms of CPU): every frame is written with raw writes, nothing is buffered.
BOOTSTRAP = ("import marshal,posix\nb=b''.join(iter(lambda:posix.read(0,1<<20),b''))\nz,j=marshal.loads(b)\n"
             "g={'__name__':'klear_zygote'}\nexec(z,g)\ng['main'](j)\nposix._exit(0)\n")
FILENAME = "<klear-zygote>"  # this module's frames, compiled under this name, are cut from the program's tracebacks
RESULT_FD = 3  # a function-call test writes "<nonce> json <value>" (or "<nonce> repr <text>") here
SIGKILL = 9
RLIMITS = (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE,
           resource.RLIMIT_NOFILE, resource.RLIMIT_CORE)  # the job's "limits", then 0 for core dumps
# Never imported ahead of the program: they print, or open windows or browsers, when imported.
NO_PREIMPORT = frozenset({"this", "antigravity", "__hello__", "__phello__", "idlelib", "tkinter", "turtle",
                          "turtledemo", "pydoc", "webbrowser"})
_CHUNK = 1 << 16


def encode_frame(i, status, timed_out, overflow, out_truncated, err_truncated, duration_s, out, err, result):
    """One test's frame: a header line (index, wait status, four flags, duration, three lengths), the payloads."""
    head = "%d %d %d %d %d %d %r %d %d %d\n" % (i, status, timed_out, overflow, out_truncated, err_truncated,
                                                duration_s, len(out), len(err), len(result))
    return head.encode() + out + err + result


def decode_frames(data):
    """Every complete frame in `data`, as dicts (the inverse of `encode_frame`)."""
    frames, pos = [], 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return frames
        f = data[pos:nl].split()
        sizes = [int(x) for x in f[7:10]]
        start = nl + 1
        if start + sum(sizes) > len(data):
            return frames
        frame = {"i": int(f[0]), "status": int(f[1]), "timed_out": f[2] == b"1", "overflow": f[3] == b"1",
                 "out_truncated": f[4] == b"1", "err_truncated": f[5] == b"1", "duration_s": float(f[6])}
        for key, size in zip(("out", "err", "result"), sizes):
            frame[key] = data[start:start + size]
            start += size
        frames.append(frame)
        pos = start


def main(job):
    # A bound on this process too (soft: each test sets its own, lower, hard limits): one test's memory, its
    # three capped outputs, and room for compiling the program, so no program can make it eat the host's memory.
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    mine = job["limits"][1] + 4 * job["cap"] + (256 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (mine if hard == resource.RLIM_INFINITY else min(mine, hard), hard))
    host = posix.dup(1)  # frames go here; a child closes it before running anything
    null = posix.open("/dev/null", posix.O_RDWR)
    for fd in (0, 1):  # whatever a pre-imported module prints must not land in the frame stream
        posix.dup2(null, fd)
    posix.close(null)
    if job["sandboxed"] and job["uid"] < 0:
        _make_non_dumpable()
    try:
        code = compile(job["program"], job["path"], "exec", dont_inherit=True)
    except BaseException:  # a SyntaxError: each test compiles again and reports it as Python would
        code = None
    names = _imported_names(job["program"])
    if any("call" in t for t in job["tests"]):
        names.add("json")  # the result's way out
    if job["preimport"]:
        for name in sorted(names & set(getattr(sys, "stdlib_module_names", ())) - NO_PREIMPORT):
            try:
                __import__(name)
            except BaseException:
                pass
    for i, test in enumerate(job["tests"]):
        _write_all(host, _run_test(job, code, test, i))
    posix.close(host)


def _run_test(job, code, test, i):
    """Fork one test, watch it, clean up after it; its frame."""
    cap = job["cap"]
    stdin = _stdin_fd(test.get("stdin", ""))
    pipes = {"out": posix.pipe(), "err": posix.pipe()}
    if "call" in test:
        pipes["result"] = posix.pipe()
    nonce = posix.urandom(16).hex()
    start = time.monotonic()
    pid = posix.fork()
    if pid == 0:
        try:
            _child(job, code, test, stdin, {k: w for k, (_, w) in pipes.items()}, nonce)
        finally:
            posix._exit(70)  # the child never returns into this loop
    posix.close(stdin)
    readers = {}
    for name, (r, w) in pipes.items():
        posix.close(w)
        readers[r] = name
    data = {name: bytearray() for name in pipes}
    pidfd = posix.pidfd_open(pid)
    deadline = start + job["timeout_s"]
    timed_out = overflow = exited = False
    while not (exited or overflow):
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([*readers, pidfd], [], [], left)
        exited = pidfd in ready
        for fd in ready:
            if fd in readers and not _read_some(fd, data[readers[fd]], cap):
                posix.close(fd)
                del readers[fd]
        overflow = any(len(b) > cap for b in data.values())
    if not exited:
        _kill(pid)
    _, status = posix.waitpid(pid, 0)
    duration = time.monotonic() - start
    posix.close(pidfd)
    _sweep(job, pid)
    drain_until = time.monotonic() + 1.0  # every writer is gone now: EOF comes at once
    while readers and time.monotonic() < drain_until:
        ready, _, _ = select.select(list(readers), [], [], max(0.0, drain_until - time.monotonic()))
        for fd in ready:
            if not _read_some(fd, data[readers[fd]], cap):
                posix.close(fd)
                del readers[fd]
    for fd in readers:
        posix.close(fd)
    overflow = overflow or any(len(b) > cap for b in data.values())
    result = b""
    if "result" in data and len(data["result"]) <= cap:
        tag = nonce.encode() + b" "
        lines = [ln for ln in bytes(data["result"]).split(b"\n") if ln.startswith(tag)]
        result = lines[-1][len(tag):] if lines else b""
    return encode_frame(i, status, timed_out, overflow, len(data["out"]) > cap, len(data["err"]) > cap, duration,
                        bytes(data["out"][:cap]), bytes(data["err"][:cap]), result)


def _child(job, code, test, stdin, w, nonce):
    """In the forked child: descriptors, limits, uid, then the program. Never returns."""
    posix.dup2(stdin, 0)
    posix.dup2(w["out"], 1)
    posix.dup2(w["err"], 2)
    if "result" in w:
        posix.dup2(w["result"], RESULT_FD)
    posix.closerange(RESULT_FD + ("result" in w), 1 << 20)  # the frame pipe and every other fd of the zygote
    if not job["sandboxed"]:
        posix.setsid()
    for which, value in zip(RLIMITS, [*job["limits"], 0]):
        resource.setrlimit(which, (value, value))  # hard: the program cannot raise them back
    _drop_uid(job["uid"])
    sys.argv = [job["path"]]
    posix._exit(_run_program(job, code, test, nonce))


def _run_program(job, code, test, nonce):
    """Run the program in this process as `python main.py` would; the exit status."""
    name = "solution" if "call" in test else "__main__"  # as `solution`, an `if __name__ == "__main__":` stays out
    module = type(sys)(name)
    module.__file__ = job["path"]
    module.__builtins__ = sys.modules["builtins"]
    sys.modules[name] = module
    try:
        if code is None:
            code = compile(job["program"], job["path"], "exec", dont_inherit=True)
        exec(code, module.__dict__)
        if "call" in test:
            _report(_call(module.__dict__, test["call"], test["args"]), nonce)
        status = 0
    except SystemExit as e:
        status = _exit_status(e.code)
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == FILENAME:
            tb = tb.tb_next  # from the program's first frame on, as Python prints it
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        status = 1
    return _finish(status)


def _call(namespace, name, args):
    fn = namespace.get(name)
    if fn is None and isinstance(namespace.get("Solution"), type):
        fn = getattr(namespace["Solution"](), name, None)
    if fn is None:
        raise NameError(f"no function {name!r} in the program")
    return fn(*args)


def _report(value, nonce):
    import json  # imported by the zygote already when the job has a function-call test
    try:
        payload = "json " + json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        payload = "repr " + repr(value)[:300]
    _write_all(RESULT_FD, f"{nonce} {payload}\n".encode())


def _exit_status(code):
    """SystemExit's code as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _finish(status):
    """What interpreter shutdown does before exiting: join non-daemon threads, run atexit, flush stdio."""
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = status or 120  # the interpreter's status when flushing stdout fails at exit
    return status


def _sweep(job, pid):
    """Kill whatever the test left running and empty the writable directories, so the next test starts clean."""
    if not job["sandboxed"]:
        try:
            posix.killpg(pid, SIGKILL)
        except OSError:
            pass
        return
    _reap()
    if _other_pids() or _leftover_files(job):
        helper = posix.fork()
        if helper == 0:
            try:
                _drop_uid(job["uid"])  # as the test's uid: allowed to signal its processes and delete its files
                for _ in range(3):  # kill(-1): everything this uid may signal here, except pid 1 and the caller
                    _kill(-1)
                for path in _leftover_files(job):
                    _remove(path)
            finally:
                posix._exit(0)
        posix.waitpid(helper, 0)
    until = time.monotonic() + 2.0
    while _other_pids() and time.monotonic() < until:  # orphans come to pid 1: reap them as they die
        _reap()
        time.sleep(0.001)


def _reap():
    while True:
        try:
            pid, _ = posix.waitpid(-1, posix.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _other_pids():
    me = posix.getpid()
    return [p for p in posix.listdir("/proc") if p.isdigit() and int(p) != me]


def _leftover_files(job):
    found = []
    for d in job["clean"]:
        found += [p for p in (d + "/" + n for n in posix.listdir(d)) if p != job["path"]]
    return found


def _remove(path):
    try:
        if posix.lstat(path).st_mode & 0o170000 == 0o040000:  # a directory, not a link to one
            posix.chmod(path, 0o700)  # a test may have taken its own permissions away
            for name in posix.listdir(path):
                _remove(path + "/" + name)
            posix.rmdir(path)
        else:
            posix.unlink(path)
    except OSError:
        pass


def _drop_uid(uid):
    if uid >= 0 and posix.getuid() == 0:
        posix.setgroups([])
        posix.setresgid(uid, uid, uid)
        posix.setresuid(uid, uid, uid)  # clears every capability: real, effective and saved uid are all non-zero


def _kill(pid):  # ESRCH (nothing left to kill) and EPERM are both fine here
    try:
        posix.kill(pid, SIGKILL)
    except OSError:
        pass


def _make_non_dumpable():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _imported_names(source):
    """First module name of every `import x` / `from x import` line (`import a, b` yields a only)."""
    names = set()
    for line in source.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("import", "from"):
            names.add(words[1].split(".")[0].split(",")[0])
    return names


def _stdin_fd(text):
    if not text:
        return posix.open("/dev/null", posix.O_RDONLY)
    fd = posix.memfd_create("stdin")
    _write_all(fd, text.encode())
    ro = posix.open(f"/proc/self/fd/{fd}", posix.O_RDONLY)  # the test may read its input, not rewrite it
    posix.close(fd)
    return ro


def _read_some(fd, buf, cap):
    """Read what is there into `buf`, keeping at most cap + 1 bytes (one past the cap says it was exceeded);
    False at end of file."""
    chunk = posix.read(fd, _CHUNK)
    if not chunk:
        return False
    buf += chunk[:cap + 1 - len(buf)]
    return True


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view):]
