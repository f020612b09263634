"""The warm interpreter inside the sandbox: one per sample, it forks one fresh process per test.

Runs as pid 1 of the sandbox's PID namespace, in `python -I -S` (stdlib only: nothing of klear_lib exists inside
the sandbox). `BOOTSTRAP` reads from stdin a marshal of (this module's code or source, the job), and calls
`main(job)`. The job (see `sandbox.run_python_tests`) holds the program, the limits and where each test lies
in the job's descriptor (never a test itself). `main` compiles the program once, imports the standard-library
modules the program names, forks the forker (`_Forker`), and then for each test:

    forker ─ fork ─ fork ─ child: its own test from the job, stdin/stdout/stderr of its own, rlimits, drop to
           │      │              the sandbox uid, run the program as __main__ (or as module `solution`, then
           │      └ exit         call one function); adopted here when the middle process exits
           └ here:  collect the child's output (capped); kill it at its CPU-time limit, its wall-clock backstop,
                    the output cap (stdout, result) or (without a cgroup) the sample's memory cap; reap it;
                    then reset the sandbox for the next test (`_reset`) and send the test's frame to the host

A frame is a header line of thirteen numbers followed by the raw stdout, stderr and result bytes it announces.

Time. A test's limit is CPU time: that of all its processes, from the sample's cgroup when the host gave one
(exact, processes that already exited included), else summed from /proc every `POLL_S` (live processes, and
those reaped by their parents or by this process). A wall-clock backstop (`wall_s`, a few times the limit)
ends a test that waits instead of computing. So a busy neighbour on the machine slows a test down without
failing it.

Memory. With a cgroup the kernel caps the whole sample (every process, tmpfs and pipes included) and this
process only reads the cgroup's OOM count to say which test ran into it. Without one, it sums every process's
resident memory and the two tmpfs' usage every `POLL_S` and kills the test past `mem_cap` (so a sample holds
about `mem_cap` plus what can be allocated in one poll interval). Each test's processes have the highest OOM
score, so that the kernel, should it have to choose, takes them before this process.

Fresh state (`_reset`, after every test but the last, when nothing can follow). Everything the test left running is
killed; /tmp and /dev/shm are emptied by a walk that holds directory descriptors (no recursion, no path length
limit, permissions a test took away given back) and bounded in time; the two directories and /tmp/main.py are
checked to be as they were (mode, extended attributes, main.py untouched) and their timestamps are set back; no
SysV IPC object may exist (the seccomp filter refuses to create them and POSIX message queues; this checks); no
socket may be left in the network namespace (TCP keeps a closed connection's ports in TIME_WAIT for 60 s: a 40-byte
checkpoint in 40 connections; /proc/net/sockstat counts them); and the counters emptying cannot set back are moved
on to a fixed place (`_Counters`: the inode numbers of each tmpfs and the entry offsets of each directory, at most
`COUNTER_QUOTA` per test). Before each test's fork the sandbox's last pid is set back (ns_last_pid, through a
descriptor the host opened, with CAP_CHECKPOINT_RESTORE), so every test has the same pid and its children's pids
depend on its own forks only. If any of that fails, no further test runs: each reports that the sandbox could not
be reset. Each test's process reads its own test from its section of the job (this process never reads one), so no
test holds another's input.

What a test can still pass to the next: timing (its own duration, through every clock: about 8 bits a test).
Not the counters the kernel keeps for the whole machine: each test's process stacks the program's seccomp filter
(`_ProgramFilter`), which refuses every socket call, pipes and pidfds (their inode numbers are counters of the
machine) and sysinfo, and the host masks /proc's global files (/proc/stat's fork count, loadavg, /proc/sys);
docs/sandbox_security.md. Not this process's
memory, where every test's output passes: tests are forked by a process that never sees one (`_Forker`); nor this
process's counters (page faults, resident size, context switches grow with every output it reads): the host
hides /proc/1.

Pid 1 of a namespace gets no signal from inside it that it has no handler for, so a test cannot kill this
process; as root the tests run under another uid, and otherwise this process makes itself non-dumpable, so
that a test cannot reach its memory or its descriptors (the frame pipe) through /proc either.

Results. A function-call test's return value leaves the test's process as one record on a pipe of its own
(`RESULT_FD`): ``json <text>`` or ``repr <text>``, one line. The program runs in that process and can write
there too; what it gains is nothing it could not return: the record is its own test's value only, the host
decodes it as hostile input (`sandbox_json`), and an extra write makes the record malformed (a wrong answer).
Ints print and serialize without Python's 4,300-digit limit inside the sandbox (as in Python before 3.11);
the test's CPU time pays for it.

Without a sandbox (the explicit opt-out) this runs as an ordinary process: each test gets its own session and
its process group is killed, which a setsid() escapes; only the test's main process is metered.

Start-up is paid once per sample and this module is on that path: it imports `posix` (built in) rather than
`os` (~1.5 ms), no json/re (12 ms): a function-call test's value is encoded by the C encoder json.dumps uses
(`_json_dumps`), made once per sample; the host sends this module compiled.
"""

import posix
import resource
import select
import sys
import time

# Read the job, run this module's code (a code object when the host's Python matches, else the source), go; then
# skip the interpreter's teardown (~2 ms of CPU): every frame is written with raw writes, nothing is buffered.
# The head (its length first, in HEAD_DIGITS digits) holds no test: each test's process reads its own section.
HEAD_DIGITS = 12
BOOTSTRAP = ("import marshal,posix\nn=int(posix.pread(0,12,0))\nb=b''\nwhile len(b)<n:\n"
             " c=posix.pread(0,n-len(b),12+len(b))\n if not c:break\n b+=c\nz,j=marshal.loads(b)\ndel b,c\n"
             "g={'__name__':'klear_zygote'}\nexec(z,g)\ng['main'](j)\nposix._exit(0)\n")
FILENAME = "<klear-zygote>"  # this module's frames, compiled under this name, are cut from the program's tracebacks
RESULT_FD = 3  # a function-call test's result record: "json <value>\n" or "repr <text>\n"
SIGKILL = 9
POLL_S = 0.01  # how often a running test's CPU time (and, without a cgroup, the sample's memory) is read
REAP_S = 2.0  # how long the processes a test left may take to die once killed
RLIMITS = (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE,
           resource.RLIMIT_NOFILE, resource.RLIMIT_CORE)  # the job's "limits", then 0 for core dumps
# Never imported ahead of the program: they print, or open windows or browsers, when imported.
NO_PREIMPORT = frozenset({"this", "antigravity", "__hello__", "__phello__", "idlelib", "tkinter", "turtle",
                          "turtledemo", "pydoc", "webbrowser"})
_CHUNK = 1 << 16
ERR_TAIL = 4096  # the last bytes of a truncated stderr, kept after the mark (a traceback's last lines)
_FLAGS = ("timed_out", "overflow", "out_truncated", "err_truncated", "result_overflow", "memory_exceeded")


def encode_frame(i, status, duration_s, cpu_s, out, err, result, **flags):
    """One test's frame: a header line (index, wait status, the six `_FLAGS`, duration, CPU time, three lengths),
    then the payloads."""
    head = "%d %d %s %r %r %d %d %d\n" % (i, status, " ".join("1" if flags.get(f) else "0" for f in _FLAGS),
                                         duration_s, cpu_s, len(out), len(err), len(result))
    return head.encode() + out + err + result


def decode_frames(data):
    """Every complete frame in `data`, as dicts (the inverse of `encode_frame`); stops at anything malformed."""
    frames, pos = [], 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return frames
        f = data[pos:nl].split()
        try:
            sizes = [int(x) for x in f[10:13]]
            frame = {"i": int(f[0]), "status": int(f[1]), "duration_s": float(f[8]), "cpu_s": float(f[9])}
        except (ValueError, IndexError):
            return frames
        frame.update((name, flag == b"1") for name, flag in zip(_FLAGS, f[2:8]))
        start = nl + 1
        if len(f) != 13 or min(sizes) < 0 or start + sum(sizes) > len(data):
            return frames
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
    job["job_fd"] = posix.dup(0)  # the tests' sections: each test's process reads its own, then closes it
    job["zygote_pid"] = posix.getpid()
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
    if any(t["kind"] == "call" for t in job["tests"]):  # the tests' index: where each lies and its kind
        global _DUMPS
        _DUMPS = _json_dumps()  # the result's way out, made once here rather than by every test
    if job["preimport"]:
        for name in sorted(names & set(getattr(sys, "stdlib_module_names", ())) - NO_PREIMPORT):
            try:
                __import__(name)
            except BaseException:
                pass
    meter = Meter(job)
    state = _State(job)
    why = state.counters.start() or state.reset_times()  # the counters first: their files move the timestamps
    if not job["sandboxed"]:
        _make_subreaper()  # each test is handed to this process by the forker: it must come here, not to init
    if job.get("program_filter"):
        global _PROGRAM_FILTER
        _PROGRAM_FILTER = _ProgramFilter(job["program_filter"])  # every test's process loads it (`_child`)
    forker = _Forker(job, code)  # forks every test; from here on this process holds what tests wrote
    meter.forker = forker.pid
    if job["sandboxed"]:  # what a reset must find: the forker's socket pair alone (no wait here: bwrap's netlink
        try:  # socket may still count; gone by the reset)
            state.net = dict(_socket_counts(job), **{"sockets used": 2})
        except OSError as e:
            why = why or f"the sandbox's sockets could not be counted ({e})"
    tests = job["tests"]
    for i, test in enumerate(tests):
        if why:  # the sandbox is not as the first test found it: no further test runs in it
            msg = f"not run: the sandbox could not be reset after test {i - 1}: {why}\n".encode()
            _write_all(host, encode_frame(i, 1 << 8, 0.0, 0.0, b"", msg, b""))
            continue
        frame, why = _run_test(job, forker, test, i, meter)
        _write_all(host, frame)
        if i + 1 < len(tests) and not why:  # after the last test nothing needs resetting: the sandbox ends with it
            why = _reset(job, state)
    forker.close()
    posix.close(host)


def _run_test(job, forker, test, i, meter):
    """Start one test (through the forker), watch it, kill what it left; (its frame, '' or why no further test
    may run). `test` says where the test lies and its kind."""
    cap = job["cap"]
    pipes = {"out": posix.pipe(), "err": posix.pipe()}
    if test["kind"] == "call":
        pipes["result"] = posix.pipe()
    meter.start()
    start = time.monotonic()
    try:
        pid = forker.start(i, [w for _, w in pipes.values()], job["reset_s"])
    except OSError as e:
        for r, w in pipes.values():
            posix.close(r)
            posix.close(w)
        why = f"the test could not be started ({e})"
        return encode_frame(i, 1 << 8, 0.0, 0.0, b"", f"not run: {why}\n".encode(), b""), why
    readers = {}
    for name, (r, w) in pipes.items():
        posix.close(w)
        readers[r] = name
    data = {name: bytearray() for name in pipes}
    data["err"] = _Stderr(cap)  # stderr is the log, not the answer: truncated past the cap, never a failure
    pidfd = posix.pidfd_open(pid)
    deadline = start + job["wall_s"]
    timed_out = overflow = exited = memory = False
    polled = start  # a test that ends within its first POLL_S (most do) is metered once, at its end
    while not (exited or overflow):
        now = time.monotonic()
        if now - polled >= POLL_S:
            polled = now
            cpu, memory = meter.poll(pid)
            if cpu > job["timeout_s"]:
                timed_out = True
                break
            if memory:
                break
        if now >= deadline:
            timed_out = True
            break
        ready, _, _ = select.select([*readers, pidfd], [], [], min(deadline - now, POLL_S))
        exited = pidfd in ready
        for fd in ready:
            if fd in readers and not _read_some(fd, data[readers[fd]], cap):
                posix.close(fd)
                del readers[fd]
        overflow = len(data["out"]) > cap or len(data.get("result", b"")) > cap
    if not exited:
        _kill(pid)
    _, status, usage = posix.wait4(pid, 0)
    duration = time.monotonic() - start
    posix.close(pidfd)
    cpu, over = meter.finish(pid, usage)
    timed_out = timed_out or cpu > job["timeout_s"]
    memory = memory or over
    if job["sandboxed"]:  # what the test left: now, so that its output pipes reach EOF at once
        _kill_leftovers(job)
    else:
        _killpg(pid)
    drain_until = time.monotonic() + 1.0  # every writer is gone now (or soon): EOF comes at once
    while readers and time.monotonic() < drain_until:
        ready, _, _ = select.select(list(readers), [], [], max(0.0, drain_until - time.monotonic()))
        for fd in ready:
            if not _read_some(fd, data[readers[fd]], cap):
                posix.close(fd)
                del readers[fd]
    for fd in readers:
        posix.close(fd)
    overflow = overflow or len(data["out"]) > cap
    result = bytes(data.get("result", b""))
    frame = encode_frame(i, status, duration, cpu, bytes(data["out"][:cap]), data["err"].kept(),
                         result[:cap], timed_out=timed_out, overflow=overflow, out_truncated=len(data["out"]) > cap,
                         err_truncated=data["err"].size > cap, result_overflow=len(result) > cap,
                         memory_exceeded=memory)
    return frame, ""


class _Forker:
    """The process that forks every test, itself forked from this one before the first test: so a test's process
    is a copy of a process that never held anything a test wrote.

    This process reads each test's output; what it frees it does not clear, and a process forked from it copies
    its memory: test 1 found test 0's stdout there, byte for byte, by reading its own heap. The forker only
    ever receives, over a socket pair, a test's index and the write ends of its pipes (SCM_RIGHTS), sets the
    last pid back (as root, or with CAP_CHECKPOINT_RESTORE: the pids it sees are then the same for every
    test), forks an intermediate that forks the test and exits, and reaps that intermediate (status 0). The
    test is then an orphan, adopted by this process (pid 1, or a subreaper unsandboxed), which waits for it,
    meters it and kills what it leaves; the intermediate reports the test's pid here, the forker "ok" after."""

    def __init__(self, job, code):
        import _socket

        self.socket = _socket
        mine, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        pid = posix.fork()
        if pid == 0:
            try:
                mine.close()
                theirs.send(b"ready")  # its copy of this end closed: the socket counts are now the sandbox's own
                _forker_loop(job, code, theirs)
            except BaseException:  # the sandbox's stderr says why; the tests left report "the forker is gone"
                import traceback
                posix.write(2, traceback.format_exc().encode())
            finally:
                posix._exit(0)
        theirs.close()
        self.sock, self.pid = mine, pid
        if not select.select([mine], [], [], job["reset_s"])[0] or mine.recv(16) != b"ready":
            raise OSError(0, "the forker did not start")
        global _FORKER_PID
        _FORKER_PID = pid

    def start(self, i, fds, timeout_s):
        """Start test `i` with `fds` (the write ends of its pipes, in order); its pid, once it is this process's
        child. OSError if the forker does not answer within `timeout_s`."""
        s = self.socket
        self.sock.sendmsg([b"%d" % i], [(s.SOL_SOCKET, s.SCM_RIGHTS,
                                         b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds))])
        deadline = time.monotonic() + timeout_s
        answers = []
        while len(answers) < 2:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise OSError(0, "the forker did not answer")
            msg = self.sock.recv(64)
            if not msg:
                raise OSError(0, "the forker is gone")
            answers.append(msg)
        if answers[1] != b"ok" or int(answers[0]) <= 0:
            raise OSError(0, f"the forker said {answers!r}")
        return int(answers[0])

    def close(self):
        self.sock.close()  # the forker reads the end of its socket and exits
        try:
            posix.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


_FORKER_PID = -1


def _forker_loop(job, code, sock):
    """The forker's life (`_Forker`): one test per message until the socket closes."""
    import _socket

    space = _socket.CMSG_SPACE(3 * 4)
    while True:
        msg, ancillary, _, _ = sock.recvmsg(32, space)
        if not msg:
            return
        fds = []
        for level, kind, data in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [int.from_bytes(data[k:k + 4], sys.byteorder, signed=True)
                        for k in range(0, len(data) - len(data) % 4, 4)]
        test = job["tests"][int(msg)]
        w = dict(zip(["out", "err", "result"] if test["kind"] == "call" else ["out", "err"], fds))
        if job["pid_fd"] >= 0:  # every test gets the same pids (`_reset` checked that no process is left)
            posix.pwrite(job["pid_fd"], b"%d" % posix.getpid(), 0)
        middle = posix.fork()
        if middle == 0:
            try:
                middle = posix.getpid()
                pid = posix.fork()
                if pid == 0:
                    try:
                        _child(job, code, test, w, middle)
                    finally:
                        posix._exit(70)  # the child never returns into this loop
                sock.send(b"%d" % pid)
            finally:
                posix._exit(0)
        for fd in fds:
            posix.close(fd)
        posix.waitpid(middle, 0)
        sock.send(b"ok")


class _Libc:
    """The few libc functions this module calls (syscall, prctl, capset), through `_ctypes` itself: `import ctypes`
    costs 3.5 ms a sample (its module defines every C type and imports struct), `_ctypes` 0.5 ms. Every argument
    is passed as a C long (an address for a pointer), every result read as one, errno kept as ctypes'
    use_errno keeps it. Made on first use."""

    def __init__(self):
        import _ctypes

        class Long(_ctypes._SimpleCData):  # as ctypes.c_long: a result converted to an int
            _type_ = "l"

        class Char(_ctypes._SimpleCData):  # as ctypes.c_char: an array of them has .raw
            _type_ = "c"

        class Function(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = Long

        class Library:  # what a function is looked up in: this process's own symbols (RTLD_NOW)
            _handle = _ctypes.dlopen(None, 2)

        self._ctypes, self._long, self._char = _ctypes, Long, Char
        self._functions = {name: Function((name, Library())) for name in ("syscall", "prctl", "capset")}

    def check(self, name, *args):
        """`name(*args)`'s result; OSError with errno when it is negative."""
        result = self._functions[name](*[self._long(a) for a in args])
        if result < 0:
            raise OSError(self._ctypes.get_errno(), f"{name}{args[:1]} failed")
        return result

    def memory(self, data):
        """(a buffer of `data` bytes, or of that many zero bytes, its address): kept by the caller as long as
        the address is used."""
        buf = (self._char * (data if isinstance(data, int) else len(data)))()
        if not isinstance(data, int):
            buf.raw = data
        return buf, self._ctypes.addressof(buf)


class _LazyLibc:
    def __getattr__(self, name):
        global _LIBC
        _LIBC = _Libc()
        return getattr(_LIBC, name)


_LIBC = _LazyLibc()


class _ProgramFilter:
    """The program's seccomp filter (`seccomp.build_program_filter`, built by the host), ready in memory before
    the forker forks, so that each test's process only makes one prctl call to stack it on the sandbox's."""

    def __init__(self, code):
        self.code = _LIBC.memory(bytes(code))  # struct sock_filter[]
        # struct sock_fprog: the filter's length (u16, then padding to the pointer's alignment), its address
        self.prog = _LIBC.memory((len(code) // 8).to_bytes(2, sys.byteorder) + bytes(6)
                                 + self.code[1].to_bytes(8, sys.byteorder))

    def load(self):
        """Stack the filter on this process (no_new_privs is set: bwrap set it for its own filter). Raises
        OSError if the kernel refuses: the test then never runs its program."""
        _LIBC.check("prctl", 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS (already set by bwrap: a no-op, kept explicit)
        _LIBC.check("prctl", 22, 2, self.prog[1], 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog


_PROGRAM_FILTER = None


def _make_subreaper():
    _LIBC.check("prctl", 36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _child(job, code, test, w, middle):
    """In the forked child: its own test (read from its section of the job), descriptors, limits, uid, then the
    program. Never returns."""
    import marshal  # built in

    until = time.monotonic() + REAP_S
    while time.monotonic() < until:  # the middle process exits and the forker reaps it: the program finds the
        try:                         # zygote its parent and no trace of how it was started
            if posix.getppid() == job["zygote_pid"]:
                posix.kill(middle, 0)  # ProcessLookupError once reaped (a zombie still answers)
        except ProcessLookupError:
            break
        except OSError:
            pass
        time.sleep(0.0002)
    test = marshal.loads(_pread_all(job["job_fd"], test["at"], test["size"]))
    stdin = _stdin_fd(test.get("stdin", ""), job["stdin_dir"])
    posix.dup2(stdin, 0)
    posix.dup2(w["out"], 1)
    posix.dup2(w["err"], 2)
    if "result" in w:
        posix.dup2(w["result"], RESULT_FD)
    posix.closerange(RESULT_FD + ("result" in w), 1 << 20)  # the frame pipe and every other fd of the zygote
    if not job["sandboxed"]:
        posix.setsid()
    try:  # first in line for the kernel's OOM killer (raising one's own score needs no privilege)
        fd = posix.open("/proc/self/oom_score_adj", posix.O_WRONLY)
        posix.write(fd, b"1000")
        posix.close(fd)
    except OSError:
        pass
    for which, value in zip(RLIMITS, [*job["limits"], 0]):
        resource.setrlimit(which, (value, value))  # hard: the program cannot raise them back
    _drop_uid(job["uid"])
    if job["sandboxed"] and job["uid"] < 0 and job["pid_fd"] >= 0:
        _drop_capabilities()  # non-root: the test keeps the zygote's uid, not its CAP_CHECKPOINT_RESTORE
    if _PROGRAM_FILTER is not None:
        _PROGRAM_FILTER.load()  # last: no socket, no page-cache query from here on (`seccomp`)
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # see the module docstring: big ints as in Python < 3.11
    sys.argv = [job["path"]]
    posix._exit(_run_program(job, code, test))


def _run_program(job, code, test):
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
            _report(_call(module.__dict__, test["call"], test["args"]))
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


def _report(value):
    """Write the call's result record (one line; see the module docstring)."""
    try:
        record = b"json " + _DUMPS(value).encode()  # ASCII, no raw newline
    except BaseException:  # not JSON (a set, a cycle, too deep): its repr, which wrong-answers
        try:
            text = str.replace(repr(value)[:300], "\n", "\\n")
        except BaseException:
            text = "<a value without a repr>"
        record = b"repr " + text.encode("utf-8", "backslashreplace")
    _write_all(RESULT_FD, record + b"\n")


def _json_dumps():
    """`json.dumps` at its defaults, without importing json (12 ms: re, enum, functools, ...): the C encoder that
    json.dumps itself runs (`json.encoder.JSONEncoder.encode` with `_json.make_encoder`), made with the same
    arguments; json.dumps itself where `_json` is missing or takes other arguments."""
    try:
        import _json

        make, text = _json.make_encoder, _json.encode_basestring_ascii
        make({}, _not_serializable, text, None, ": ", ", ", False, False, True)
    except BaseException:
        import json
        return json.dumps

    def dumps(value):
        if isinstance(value, str):
            return text(value)
        chunks = make({}, _not_serializable, text, None, ": ", ", ", False, False, True)(value, 0)
        if not isinstance(chunks, (list, tuple)):
            chunks = list(chunks)
        return "".join(chunks)

    return dumps


def _not_serializable(o):  # JSONEncoder.default
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


_DUMPS = None


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


# --- metering: CPU time of a test, memory of the sample ----------------------------------------------------------

class Meter:
    """A running test's CPU seconds (every process of it) and whether the sample passed its memory cap."""

    def __init__(self, job):
        self.sandboxed = job["sandboxed"]
        self.cpu_fd, self.cpu_v = job["cpu_fd"], job["cpu_v"]  # the cgroup's CPU counter (-1: none)
        self.oom_fd = job["oom_fd"]  # the cgroup's memory events (-1: none, then `mem_cap` is polled)
        self.mem_cap, self.dirs = job["mem_cap"], job["clean"]
        self.tick = posix.sysconf("SC_CLK_TCK")
        self.page = posix.sysconf("SC_PAGE_SIZE")
        self.me = posix.getpid()
        self.forker = -1  # the forker (`_Forker`): not a test's process

    def start(self):
        self.peak = 0.0
        self.oom0 = self._ooms()
        if self.cpu_fd >= 0:
            self.base = self._cgroup_cpu() - _self_cpu()
        else:
            self.base = _children_cpu()

    def poll(self, pid):
        """(CPU seconds so far, whether the sample is over its memory cap)."""
        if self.cpu_fd >= 0:
            cpu = self._cgroup_cpu() - _self_cpu() - self.base  # less this process's own polling and reading
            ticks, rss = (0, 0) if not self.mem_cap else self._processes(pid)
        else:
            ticks, rss = self._processes(pid)
            cpu = _children_cpu() - self.base + ticks / self.tick
        self.peak = max(self.peak, cpu)
        return self.peak, bool(self.mem_cap) and rss * self.page + self._tmpfs_used() > self.mem_cap

    def finish(self, pid, usage):
        """After the test's main process is reaped (`usage`: its rusage): (CPU seconds, whether it ran out of
        memory: the cgroup's OOM killer acted, or the polled cap was passed)."""
        cpu, over = self.poll(pid)
        if not self.sandboxed:
            cpu = max(cpu, usage.ru_utime + usage.ru_stime)
        return cpu, over or self._ooms() > self.oom0

    def _processes(self, pid):
        """Clock ticks (utime, stime and those of reaped children) and resident pages of the test's live
        processes: every process of the namespace but this one, in pid order (a parent before the children it
        may reap meanwhile, so a race loses a child's time for one poll instead of counting it twice)."""
        if self.sandboxed:
            pids = sorted(int(p) for p in posix.listdir("/proc") if p.isdigit() and int(p) not in (self.me,
                                                                                                   self.forker))
        else:
            pids = [pid]
        ticks = rss = 0
        for p in pids:
            try:
                fd = posix.open(f"/proc/{p}/stat", posix.O_RDONLY)
                try:
                    fields = posix.read(fd, 4096).rsplit(b")", 1)[1].split()
                finally:
                    posix.close(fd)
                ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
                rss += int(fields[21])
            except (OSError, IndexError, ValueError):  # gone meanwhile
                pass
        return ticks, rss

    def _tmpfs_used(self):
        used = 0
        for d in self.dirs:
            st = posix.statvfs(d)
            used += (st.f_blocks - st.f_bfree) * st.f_frsize
        return used

    def _cgroup_cpu(self):
        text = posix.pread(self.cpu_fd, 4096, 0)
        if self.cpu_v == 1:
            return int(text) / 1e9  # cpuacct.usage: nanoseconds
        return int(text.split(b"usage_usec", 1)[1].split()[0]) / 1e6  # cpu.stat: microseconds

    def _ooms(self):
        if self.oom_fd < 0:
            return 0
        text = posix.pread(self.oom_fd, 4096, 0)  # memory.events (v2) or memory.oom_control (v1)
        return int(text.split(b"oom_kill ", 1)[1].split()[0]) if b"oom_kill " in text else 0


def _self_cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _children_cpu():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


# --- a fresh sandbox for every test ----------------------------------------------------------------------------

class _State:
    """What the next test must find: the timestamps of the writable directories and of main.py, main.py's
    inode change time (any chmod or write moves it), the socket tables as the sandbox began, the counters of
    the two tmpfs (`_Counters`)."""

    def __init__(self, job):
        self.job = job
        self.when = time.time_ns()
        self.paths = [*job["clean"], job["path"]] if job["sandboxed"] else []
        self.ctime = None
        self.net = {}  # the socket counts once the forker runs (`main`)
        self.counters = _Counters(job["clean"])

    def reset_times(self):
        """Set the timestamps back (a test could leave a chosen time in them); '' or what failed."""
        try:
            for p in self.paths:
                posix.utime(p, ns=(self.when, self.when), follow_symlinks=False)
            if self.paths:
                self.ctime = posix.lstat(self.job["path"]).st_ctime_ns
        except OSError as e:
            return f"could not reset the timestamps ({e})"
        return ""


PER_NAMESPACE = ("used", "inuse", "tw")  # sockstat's counts of the reader's network namespace
SOCKETS_SETTLE_S = 0.2
# Inodes and directory entries a test may make in each writable directory (`_Counters`): /dev/shm holds
# multiprocessing's semaphores (two entries and one inode each: a Pool, a Queue, a Lock, an Event and a
# Semaphore make 16 of them), /tmp a program's own files. Bytes are the tmpfs size's to limit; the count only has
# to lie past what an honest program makes (a file per case, per chunk, per temporary directory: tens, a few
# hundred at most), because a test past it ends the sample (no further test runs). Every test pays for the whole
# quota: 512 inodes and 512 entries in /tmp, 96 of each in /dev/shm, moved mostly two at a time (a symbolic
# link made and removed: `_Counters.advance`), 5.5 ms a test on the project's 2-core machine (8.5 ms when inodes
# and entries were moved apart).
COUNTER_QUOTA = {"/tmp": 512, "/dev/shm": 96}
DEFAULT_QUOTA = 32  # any other writable directory (none today)


def _settled_socket_counts(job, want):
    """`_socket_counts`, read again for up to `SOCKETS_SETTLE_S` while it differs from `want`: a closed socket
    leaves the count after an RCU grace period (bwrap's netlink socket at the start, a test's socket pair)."""
    until = time.monotonic() + SOCKETS_SETTLE_S
    while True:
        counts = _socket_counts(job)
        if all(counts.get(k) == v for k, v in want.items()) or time.monotonic() > until:
            return counts
        time.sleep(0.002)


def _socket_counts(job):
    """The sandbox network namespace's own socket counts (/proc/net/sockstat and sockstat6: sockets in use, per
    protocol, and TCP's TIME_WAIT), by name; none unsandboxed. The socket tables themselves (/proc/net/tcp, ...)
    would say the same, but reading one walks the whole machine's hash table: 7 ms, against 0.02 ms. Read through
    the forker's /proc entry (the same network namespace): /proc/net is /proc/self/net, and this process's own
    entry, /proc/1, is hidden from the tests. OSError when the IPv4 counts cannot be read (the reset then fails:
    a check that cannot look is no check)."""
    if not job["sandboxed"]:
        return {}
    counts = {}
    for name in ("sockstat", "sockstat6"):
        try:
            fd = posix.open(f"/proc/{_FORKER_PID}/net/{name}", posix.O_RDONLY)
        except OSError:
            if name == "sockstat":
                raise
            continue  # no IPv6 in this kernel
        try:
            text = posix.read(fd, 1 << 16).decode()
        finally:
            posix.close(fd)
        for line in text.splitlines():
            proto, _, fields = line.partition(":")
            words = fields.split()
            for name, value in zip(words[::2], words[1::2]):
                if name in PER_NAMESPACE:  # the others (orphans, memory, allocated) are the whole machine's
                    counts[f"{proto} {name}"] = int(value)
    return counts


class _Counters:
    """The two counters of a tmpfs that emptying it does not set back, made the same for every test.

    A tmpfs numbers its inodes from a counter of its own (Linux >= 5.9), and a directory numbers its entries
    from another (the offsets `getdents` reports; Linux >= 6.6). A test that makes k files (even unnamed ones:
    O_TMPFILE) moves the first, one that makes or renames k entries moves the second, and the next test reads
    k from the first number it gets: the issue measured a program resuming a costly answer from that (0.5
    against 0). Neither can go back, but both can go forward: after each test, this process reads how far the
    test moved each one and moves it on to exactly its `COUNTER_QUOTA` + 1 past where the test found it, so every
    test starts from the same place whatever the one before did. A test that moved one by more than the quota
    leaves the sandbox not reset (no further test runs). Where a counter does not count (an older kernel: the
    check at the start sees it stand still), there is nothing to set back. The first counter is read from an
    unnamed file's inode number; the second from the positions of a listing (`_offset`). Both are moved
    together where they can be: a name made and removed takes one of each."""

    GETDENTS64 = {"x86_64": 217, "aarch64": 61}

    def __init__(self, dirs):
        self.dirs = list(dirs)
        self.inode = {}  # dir -> what the next inode number must be at the start of the next test (or None)
        self.entry = {}  # dir -> the same for the next directory entry's offset (or None)
        if self.dirs:
            # getdents64: the listing's positions, which the os module does not show
            self.getdents64 = self.GETDENTS64.get(posix.uname().machine, -1)
            self.buf = _LIBC.memory(1 << 16)

    def start(self):
        """Read where both counters stand and whether they count; '' or what failed."""
        if self.dirs and self.getdents64 < 0:
            return "no getdents64 number for this machine"
        try:
            for d in self.dirs:
                a, b = self._offset(d), self._offset(d)
                self.entry[d] = b + 1 if b == a + 1 else None
                a, b = self._inode(d), self._inode(d)
                self.inode[d] = b + 1 if b == a + 1 else None
        except OSError as e:
            return f"could not read the counters of the writable directories ({e})"
        return ""

    def advance(self):
        """Move both counters of every directory to exactly `COUNTER_QUOTA` + 1 past where this test found them;
        '' or why not. Where both count, most of the way is made by steps that move both at once (a name made and
        removed: one inode and one entry), the rest by steps that move one only (`_step_plan`)."""
        try:
            for d in self.dirs:
                quota = COUNTER_QUOTA.get(d, DEFAULT_QUOTA)
                found = {"entries": self.entry[d], "inodes": self.inode[d]}
                # Where each counter stands: the entry's reading makes (and removes) a named file, which takes one
                # inode too, so it comes first and the inode's reading sees what it took.
                now = {"entries": self._offset(d) if found["entries"] is not None else None,
                       "inodes": self._inode(d) if found["inodes"] is not None else None}
                moves = {}
                for name in found:
                    if found[name] is None:
                        continue
                    if now[name] >= found[name] + quota:
                        return f"the test made more than {quota - 1} {name} in {d}"
                    if now[name] < found[name]:
                        return f"the counter of {name} in {d} is not where the test found it"
                    # what must move before the checking readings: the entry's check takes one inode too
                    moves[name] = found[name] + quota - now[name] - 1 - (
                        name == "inodes" and found["entries"] is not None)
                plan = _step_plan(moves.get("entries"), moves.get("inodes"))
                if plan is None:
                    return f"the test made more than {quota - 1} inodes in {d}"
                both, entries_only, inodes_only = plan
                self._both_steps(d, both)
                self._rename_steps(d, entries_only)
                self._inode_steps(d, inodes_only)
                for name, read, where in (("entries", self._offset, self.entry), ("inodes", self._inode, self.inode)):
                    if where[d] is None:
                        continue
                    target = where[d] + quota
                    if read(d, target) != target:
                        return f"could not set the counter of {name} in {d} to its place"
                    where[d] = target + 1
        except OSError as e:
            return f"could not set back the counters of the writable directories ({e})"
        return ""

    @staticmethod
    def _both_steps(d, n):
        """n new entries in `d` and n new inodes: a symbolic link made and removed, n times (two calls a step,
        where an entry and an inode apart take three)."""
        path = d + "/.klear-pad-s"
        for _ in range(n):
            posix.symlink(".", path)
            posix.unlink(path)

    @staticmethod
    def _inode(d, at_least=0):
        """The inode number of a new unnamed file in `d` (it takes one number)."""
        fd = posix.open(d, posix.O_TMPFILE | posix.O_EXCL | posix.O_RDWR, 0o600)
        try:
            return posix.fstat(fd).st_ino
        finally:
            posix.close(fd)

    @staticmethod
    def _inode_steps(d, n):
        for _ in range(n):
            posix.close(posix.open(d, posix.O_TMPFILE | posix.O_EXCL | posix.O_RDWR, 0o600))

    @staticmethod
    def _rename_steps(d, n):
        """n new entries in `d` and no new inode: one file renamed back and forth (each rename adds an entry)."""
        if n <= 0:
            return
        a, b = d + "/.klear-pad-a", d + "/.klear-pad-b"
        posix.close(posix.open(a, posix.O_CREAT | posix.O_EXCL | posix.O_WRONLY, 0o600))
        try:  # the creation took one entry and one inode: the inode counter's own padding accounts for it
            for k in range(n - 1):
                posix.rename(*((a, b) if k % 2 == 0 else (b, a)))
        finally:
            posix.unlink(a if n % 2 else b)

    def _offset(self, d, at_least=0):
        """Where a new entry of `d` lands in its directory, read by making one (removed after) and listing the
        directory with getdents64: the larger of the position the listing gives just before it and the one it
        gives after it (which of the two follows the counter depends on the kernel's listing order; a position
        of 2**31 - 1 or more is the end of the listing)."""
        name = b".klear-probe"
        path = d + "/.klear-probe"
        posix.close(posix.open(path, posix.O_CREAT | posix.O_EXCL | posix.O_WRONLY, 0o600))
        fd = posix.open(d, posix.O_RDONLY | posix.O_DIRECTORY)
        try:
            n = _LIBC.check("syscall", self.getdents64, fd, self.buf[1], len(self.buf[0]))
            raw, pos, before = self.buf[0].raw[:n], 0, 0
            while pos < n:  # struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name
                off = int.from_bytes(raw[pos + 8:pos + 16], "little", signed=True)
                reclen = int.from_bytes(raw[pos + 16:pos + 18], "little")
                if raw[pos + 19:pos + reclen].split(b"\0", 1)[0] == name:
                    return max(x for x in (before, off) if x < (1 << 31) - 1)
                before, pos = off, pos + reclen
            raise OSError(0, f"the probe was not listed in {d}")
        finally:
            posix.close(fd)
            posix.unlink(path)


def _step_plan(entries, inodes):
    """How `_Counters.advance` moves a directory's counters by `entries` and `inodes` (None: that one does not
    count): (steps moving both, entry-only steps, inode-only steps), or None when it cannot (the entry-only steps
    make one file first, which takes an inode that is not there to take). Entry-only steps (`_rename_steps`) take
    one inode in all, whatever their number."""
    if entries is None:
        return 0, 0, inodes or 0
    if inodes is None:
        return 0, entries, 0
    if entries <= inodes:
        return entries, 0, inodes - entries
    if inodes < 1:
        return None
    return inodes - 1, entries - inodes + 1, 0


def _kill_leftovers(job):
    """Kill every process the test left (as its uid, which may signal them), and wait until they are gone."""
    _reap()
    if not _other_pids():
        return
    helper = posix.fork()
    if helper == 0:
        try:
            _drop_uid(job["uid"])
            for _ in range(3):
                if job["uid"] >= 0:  # kill(-1): everything this uid may signal here, except pid 1 and the caller
                    _kill(-1)
                else:  # the tests share the forker's uid: every process but it, pid 1 and this one, one by one
                    for p in _other_pids():
                        if int(p) != 1:
                            _kill(int(p))
        finally:
            posix._exit(0)
    posix.waitpid(helper, 0)
    until = time.monotonic() + REAP_S
    while _other_pids() and time.monotonic() < until:  # orphans come to pid 1: reap them as they die
        _reap()
        time.sleep(0.001)


def _reset(job, state):
    """Make the sandbox what the first test found (module docstring); '' or what could not be made so."""
    if not job["sandboxed"]:
        return ""
    if _other_pids():
        return "processes the test left did not die"
    if _leftover_files(job):
        helper = posix.fork()
        if helper == 0:
            ok = False
            try:
                _drop_uid(job["uid"])  # as the test's uid: allowed to delete its files
                ok = all(_empty(d, job["path"]) for d in job["clean"])
            finally:
                posix._exit(0 if ok else 1)
        fd = posix.pidfd_open(helper)
        done, _, _ = select.select([fd], [], [], job["reset_s"])
        posix.close(fd)
        if not done:
            _kill(helper)
        posix.waitpid(helper, 0)
        if not done:
            return f"emptying {' and '.join(job['clean'])} took more than {job['reset_s']:g} s"
        left = _leftover_files(job)
        if left:
            return f"{left[0]} could not be removed"
    for d in job["clean"]:
        st = posix.lstat(d)
        if st.st_mode & 0o7777 != 0o1777:
            posix.chmod(d, 0o1777)  # the owner's right (non-root mode: the tests' uid owns them)
    for p in state.paths:
        try:
            attrs = posix.listxattr(p, follow_symlinks=False)
        except OSError:  # no extended attributes on this filesystem
            attrs = []
        if attrs:
            return f"the test set extended attributes on {p}"
    st = posix.lstat(job["path"])
    if st.st_ctime_ns != state.ctime or st.st_mode & 0o7777 != 0o444:
        return f"the test changed {job['path']}"
    for kind in ("shm", "msg", "sem"):
        try:
            fd = posix.open(f"/proc/sysvipc/{kind}", posix.O_RDONLY)
        except OSError:  # a kernel without SysV IPC
            continue
        try:
            lines = posix.read(fd, 1 << 16).count(b"\n")
        finally:
            posix.close(fd)
        if lines > 1:
            return f"SysV {kind} objects exist"
    try:
        net = _settled_socket_counts(job, state.net)  # sockets kept after their processes died (TIME_WAIT: 60 s)
    except OSError as e:
        return f"the sandbox's sockets could not be counted ({e})"
    for key, n in net.items():
        if n != state.net.get(key):
            return f"the test left sockets behind ({key}: {state.net.get(key)} before, {n} now; TIME_WAIT or others)"
    return state.counters.advance() or state.reset_times()


def _empty(top, keep):
    """Remove everything inside directory `top` but `keep`, without recursion and through descriptors (no path
    grows), giving back permissions a test took away; False if anything could not be removed."""
    try:
        fd = posix.open(top, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW)
    except OSError:
        return False
    stack = [[n for n in posix.listdir(fd) if top + "/" + n != keep]]  # the names left to remove, per level
    try:
        while stack:
            names = stack[-1]
            if not names:  # this level is empty: up, and remove it from its parent
                stack.pop()
                if stack:
                    parent = posix.open("..", posix.O_RDONLY | posix.O_DIRECTORY, dir_fd=fd)
                    posix.close(fd)
                    fd = parent
                    posix.rmdir(stack[-1].pop(), dir_fd=fd)
                continue
            name = names[-1]
            st = posix.lstat(name, dir_fd=fd)
            if st.st_mode & 0o170000 != 0o040000:  # not a directory (a link to one included)
                posix.unlink(name, dir_fd=fd)
                names.pop()
                continue
            if st.st_mode & 0o700 != 0o700:
                posix.chmod(name, 0o700, dir_fd=fd)  # a test may have taken its own permissions away
            child = posix.open(name, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW, dir_fd=fd)
            posix.close(fd)
            fd = child
            stack.append(posix.listdir(fd))
    except OSError:
        return False
    finally:
        posix.close(fd)
    return True


def _reap():
    while True:
        try:
            pid, _ = posix.waitpid(-1, posix.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _other_pids():
    """Every process here but this one and the forker."""
    me = posix.getpid()
    return [p for p in posix.listdir("/proc") if p.isdigit() and int(p) not in (me, _FORKER_PID)]


def _leftover_files(job):
    found = []
    for d in job["clean"]:
        found += [p for p in (d + "/" + n for n in posix.listdir(d)) if p != job["path"]]
    return found


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


def _killpg(pid):
    try:
        posix.killpg(pid, SIGKILL)
    except OSError:
        pass


def _make_non_dumpable():
    _LIBC.check("prctl", 4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def _imported_names(source):
    """First module name of every `import x` / `from x import` line (`import a, b` yields a only)."""
    names = set()
    for line in source.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("import", "from"):
            names.add(words[1].split(".")[0].split(",")[0])
    return names


def _pread_all(fd, at, size):
    data = b""
    while len(data) < size:
        chunk = posix.pread(fd, size - len(data), at + len(data))
        if not chunk:
            raise OSError(0, "the job ended early")
        data += chunk
    return data


def _drop_capabilities():
    """Empty the capability sets of this process (capset, version 3): a non-root test keeps the zygote's uid."""
    header = _LIBC.memory((0x20080522).to_bytes(4, sys.byteorder) + bytes(4))  # version 3, this process
    data = _LIBC.memory(bytes(24))  # two of {effective, permitted, inheritable} (u32 each), all zero
    _LIBC.check("capset", header[1], data[1])


def _stdin_fd(text, where):
    """The test's stdin: /dev/null, or an unnamed read-only file in `where` (O_TMPFILE with O_EXCL: it can never
    be given a name; the sandbox refuses memfd_create, whose pages no rlimit counts)."""
    if not text:
        return posix.open("/dev/null", posix.O_RDONLY)
    try:
        fd = posix.open(where, posix.O_TMPFILE | posix.O_EXCL | posix.O_RDWR, 0o444)
    except OSError:  # a filesystem without O_TMPFILE (only met unsandboxed)
        fd = posix.memfd_create("stdin")
    _write_all(fd, text.encode())
    ro = posix.open(f"/proc/self/fd/{fd}", posix.O_RDONLY)  # the test may read its input, not rewrite it
    posix.close(fd)
    return ro


def _read_some(fd, buf, cap):
    """Read what is there into `buf`, keeping at most cap + 1 bytes (one past the cap says it was exceeded);
    False at end of file. `buf` is a bytearray, or a `_Stderr` (which keeps what it keeps)."""
    chunk = posix.read(fd, _CHUNK)
    if not chunk:
        return False
    if isinstance(buf, _Stderr):
        buf.add(chunk)
    else:
        buf += chunk[:cap + 1 - len(buf)]
    return True


class _Stderr:
    """A test's stderr, read to its end however long (a program that logs a lot must not block on a full pipe,
    nor fail: stderr is not its answer) and kept within `cap` bytes: whole when it fits, else its head, a mark
    saying how many bytes were left out, and its last `ERR_TAIL` bytes (at most a quarter of the cap)."""

    def __init__(self, cap):
        self.cap, self.size = cap, 0
        self.tail_max = min(ERR_TAIL, cap // 4)
        self.head, self.tail = bytearray(), bytearray()

    def add(self, chunk):
        self.size += len(chunk)
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[:-self.tail_max or len(self.tail)]

    def kept(self):
        """The bytes the frame carries: at most `cap`."""
        if self.size <= self.cap:
            return bytes(self.head)
        tail = bytes(self.tail[len(self.tail) - self.tail_max:]) if self.tail_max else b""
        room = self.cap - len(tail) - 80  # the mark is shorter than 80 bytes
        left_out = self.size - max(0, room) - len(tail)
        mark = b"\n[stderr truncated: %d of its %d bytes left out here]\n" % (left_out, self.size)
        return (bytes(self.head[:max(0, room)]) + mark + tail)[-self.cap:]


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[posix.write(fd, view):]
