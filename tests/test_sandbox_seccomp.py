"""The sandbox's seccomp filter: its decisions (on a small classic-BPF interpreter written here), its syscall
numbers (against the kernel headers where installed), and its effect in the real kernel through bwrap."""

from __future__ import annotations

import errno
import re
import shutil
import struct
import textwrap
from pathlib import Path

import pytest

from klear_lib.rewards import sandbox, seccomp
from klear_lib.rewards.sandbox import run_python

ARCHES = ["x86_64", "aarch64"]
EPERM = seccomp.RET_ERRNO | errno.EPERM
ENOSYS = seccomp.RET_ERRNO | errno.ENOSYS
ALLOW, KILL = seccomp.RET_ALLOW, seccomp.RET_KILL_PROCESS
# (x86_64, aarch64) numbers of calls every program makes: read, write, openat, mmap, execve, wait4, exit_group.
COMMON = {"read": (0, 63), "write": (1, 64), "openat": (257, 56), "mmap": (9, 222), "execve": (59, 221),
          "wait4": (61, 260), "exit_group": (231, 94)}
CLONE_NEW = {"NEWNS": 0x20000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000, "NEWIPC": 0x08000000,
             "NEWUSER": 0x10000000, "NEWPID": 0x20000000, "NEWNET": 0x40000000}
THREAD_FLAGS = 0x3D0F00  # what glibc's pthread_create passes: VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|*TID
SIGCHLD = 17  # fork() is clone(SIGCHLD)


def bpf_run(program: bytes, nr: int, arch: str, args=(0,) * 6, data_arch: str | None = None) -> int:
    """Run a classic-BPF seccomp program on one syscall the way the kernel does; its return value. `data_arch`:
    the architecture the call claims (default `arch`). Knows the instructions `seccomp.build_filter` emits (load
    word absolute, jeq/jge/jset against a constant, return)."""
    audit_arch = seccomp.AUDIT_ARCH.get(data_arch or arch, data_arch)  # a name, or a raw AUDIT_ARCH value
    data = struct.pack("<iIQ6Q", nr, audit_arch, 0, *args)  # struct seccomp_data
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == seccomp.LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code in (seccomp.JEQ, seccomp.JGE, seccomp.JSET):
            taken = {seccomp.JEQ: acc == k, seccomp.JGE: acc >= k, seccomp.JSET: bool(acc & k)}[code]
            pc += 1 + (jt if taken else jf)
        elif code == seccomp.RET:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")


@pytest.mark.parametrize("arch", ARCHES)
def test_every_listed_syscall_is_denied_and_common_ones_pass(arch):
    prog = seccomp.build_filter(arch)
    assert len(prog) % 8 == 0
    i = ARCHES.index(arch)
    denied = seccomp.denied_syscalls(arch)
    assert {"unshare", "setns", "ptrace", "mount", "umount2", "pivot_root", "chroot", "keyctl", "add_key",
            "request_key", "bpf", "perf_event_open", "kexec_load", "init_module", "finit_module", "delete_module",
            "userfaultfd", "process_vm_readv", "process_vm_writev", "io_uring_setup", "io_uring_enter",
            "io_uring_register"} <= set(denied)
    for name, nr in denied.items():
        assert bpf_run(prog, nr, arch) == EPERM, name
    for name, nrs in COMMON.items():
        assert bpf_run(prog, nrs[i], arch) == ALLOW, name


@pytest.mark.parametrize("arch", ARCHES)
def test_clone_is_judged_by_its_flags_and_clone3_falls_back(arch):
    prog, i = seccomp.build_filter(arch), ARCHES.index(arch)
    clone = seccomp.CLONE[i]
    assert bpf_run(prog, clone, arch, (SIGCHLD, 0, 0, 0, 0, 0)) == ALLOW  # fork
    assert bpf_run(prog, clone, arch, (THREAD_FLAGS, 0, 0, 0, 0, 0)) == ALLOW  # a thread
    for name, flag in CLONE_NEW.items():
        assert bpf_run(prog, clone, arch, (flag | SIGCHLD, 0, 0, 0, 0, 0)) == EPERM, name
        assert bpf_run(prog, clone, arch, (flag | (1 << 40), 0, 0, 0, 0, 0)) == EPERM, name  # high bits ignored
    assert bpf_run(prog, seccomp.CLONE3[i], arch) == ENOSYS


@pytest.mark.parametrize("arch", ARCHES)
def test_socket_families_and_personalities(arch):
    prog, i = seccomp.build_filter(arch), ARCHES.index(arch)
    for call in (seccomp.SOCKET[i], seccomp.SOCKETPAIR[i]):
        assert bpf_run(prog, call, arch, (1, 5, 0, 0, 0, 0)) == ALLOW  # unix: the zygote's socket pair
        for family in (2, 10, 16, 40, 17, 38, 3):  # inet, inet6, netlink, vsock, packet, alg, ax25
            assert bpf_run(prog, call, arch, (family, 1, 0, 0, 0, 0)) == EPERM
    pers = seccomp.PERSONALITY[i]
    assert bpf_run(prog, pers, arch, (0, 0, 0, 0, 0, 0)) == ALLOW
    assert bpf_run(prog, pers, arch, (0xFFFFFFFF, 0, 0, 0, 0, 0)) == ALLOW  # the query
    assert bpf_run(prog, pers, arch, (0x0040000, 0, 0, 0, 0, 0)) == EPERM  # ADDR_NO_RANDOMIZE


# (x86_64, aarch64): madvise, preadv2, pwritev2, and what the program filter must let through besides COMMON
MADVISE, PREADV2, PWRITEV2, CLONE = (28, 233), (327, 286), (328, 287), (56, 220)
PROGRAM_NEEDS = {"clone": (56, 220), "read": (0, 63), "preadv": (295, 69), "pread64": (17, 67), "munmap": (11, 215),
                 "futex": (202, 98), "eventfd2": (290, 19), "dup3": (292, 24)}


@pytest.mark.parametrize("arch", ARCHES)
def test_the_program_filter_refuses_sockets_page_cache_queries_and_counters_whatever_the_arguments(arch):
    prog, i = seccomp.build_program_filter(arch), ARCHES.index(arch)
    denied = seccomp.program_denied_syscalls(arch)
    assert {"socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "sendto", "sendmsg",
            "sendmmsg", "recvfrom", "recvmsg", "recvmmsg", "getsockopt", "setsockopt", "getsockname", "getpeername",
            "shutdown", "mincore", "cachestat", "fadvise64", "process_madvise", "pipe2", "pidfd_open",
            "sysinfo"} | ({"pipe"} if arch == "x86_64" else set()) == set(denied)
    for name, nr in denied.items():
        for args in ((0,) * 6, (1, 1, 0, 0, 0, 0), (0xFFFFFFFF,) * 6):
            assert bpf_run(prog, nr, arch, args) == EPERM, (name, args)
    for advice, want in ((0, ALLOW), (4, ALLOW), (8, ALLOW), (14, ALLOW), (20, EPERM), (21, EPERM)):
        assert bpf_run(prog, MADVISE[i], arch, (0, 4096, advice, 0, 0, 0)) == want, advice  # DONTNEED, FREE pass
    for call in (PREADV2[i], PWRITEV2[i]):
        assert bpf_run(prog, call, arch, (3, 0, 1, 0, 0, 0)) == ALLOW  # no flags: as preadv
        for flags in (0x8, 0x1, 0x80, 0x8 | (1 << 40)):  # RWF_NOWAIT, RWF_HIPRI, RWF_DONTCACHE, high bits ignored
            want = EPERM if flags & 0xFFFFFFFF else ALLOW
            assert bpf_run(prog, call, arch, (3, 0, 1, 0, 0, flags)) == want, flags
    for flags, want in ((SIGCHLD, ALLOW), (THREAD_FLAGS, ALLOW), (0x01200011, ALLOW),  # fork, a thread, glibc's fork
                        (0x1000 | SIGCHLD, EPERM), (0x1000 | THREAD_FLAGS, EPERM)):  # CLONE_PIDFD: a pidfd's inode
        assert bpf_run(prog, CLONE[i], arch, (flags, 0, 0, 0, 0, 0)) == want, hex(flags)
    for name, nrs in {**COMMON, **PROGRAM_NEEDS}.items():
        if name != "clone":
            assert bpf_run(prog, nrs[i], arch) == ALLOW, name
    assert bpf_run(prog, 39, arch, data_arch="aarch64" if arch == "x86_64" else "x86_64") == KILL


def test_other_architectures_and_x32_calls_are_refused():
    prog = seccomp.build_filter("x86_64")
    assert bpf_run(prog, 39, "x86_64") == ALLOW  # getpid
    assert bpf_run(prog, 20, "x86_64", data_arch=0x40000003) == KILL  # i386 entry (int 0x80): getpid is 20 there
    assert bpf_run(prog, 172, "x86_64", data_arch="aarch64") == KILL  # another arch's getpid
    assert bpf_run(prog, 0x40000000 | 39, "x86_64") == EPERM  # the x32 ABI's getpid


def test_unknown_machine_is_named(monkeypatch):
    monkeypatch.setattr(seccomp.platform, "machine", lambda: "riscv64")
    with pytest.raises(seccomp.UnsupportedMachineError, match="x86_64, aarch64, not 'riscv64'"):
        seccomp.build_filter()
    if shutil.which("bwrap") is None:
        return
    sandbox._seccomp_filter.cache_clear()
    try:  # the sandbox refuses to run unfiltered, and says how to opt out
        with pytest.raises(sandbox.SandboxUnavailableError, match="not 'riscv64'.*unsafe_no_sandbox=True"):
            run_python("print(1)")
    finally:
        sandbox._seccomp_filter.cache_clear()


@pytest.mark.parametrize("arch, header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                          ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_syscall_numbers_match_the_kernel_headers(arch, header):
    if not Path(header).exists():
        pytest.skip(f"{header} is not installed (package linux-libc-dev)")
    defined = {name: int(nr) for name, nr in re.findall(r"^#define __NR_(\w+)\s+(\d+)\s*$", Path(header).read_text(),
                                                        re.MULTILINE)}
    i = ARCHES.index(arch)
    table = dict(seccomp.denied_syscalls(arch), clone=seccomp.CLONE[i], clone3=seccomp.CLONE3[i],
                 personality=seccomp.PERSONALITY[i], socket=seccomp.SOCKET[i], socketpair=seccomp.SOCKETPAIR[i],
                 madvise=seccomp.MADVISE[i], preadv2=seccomp.PREADV2[i], pwritev2=seccomp.PWRITEV2[i])
    table.update(seccomp.program_denied_syscalls(arch))
    checked = {name: nr for name, nr in table.items() if name in defined}
    # at most a legacy call or two missing from a newer header, and what an older one lacks (cachestat: 6.5), or
    # defines through another macro (fadvise64 on aarch64: __NR3264_fadvise64)
    assert len(checked) >= len(table) - 3
    assert {name: defined[name] for name in checked} == checked


# --- in the kernel, through bwrap ------------------------------------------------------------------------------

# ctypes syscalls; each line prints "name errno". (x86_64, aarch64) numbers for calls glibc has no wrapper for.
KERNEL_PROBE = """
import ctypes, os, platform, socket
libc = ctypes.CDLL(None, use_errno=True)
A = 0 if platform.machine() == "x86_64" else 1
def call(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr[A]), *[ctypes.c_long(a) for a in args])
    print(name, ctypes.get_errno() if r == -1 else "ok")
call("unshare_user", (272, 97), 0x10000000)
call("unshare_net", (272, 97), 0x40000000)
call("clone_newuser", (56, 220), 0x10000000 | 17, 0, 0, 0, 0)
call("clone3", (435, 435), 0, 0)
fd = os.open("/proc/self/ns/uts", os.O_RDONLY)
call("setns", (308, 268), fd, 0)
call("ptrace_traceme", (101, 117), 0, 0, 0, 0)
call("ptrace_attach_1", (101, 117), 16, 1, 0, 0)
call("keyctl", (250, 219), 0, -3, 0, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
call("add_key", (248, 217), 0, 0, 0, 0, -3)
call("bpf", (321, 280), 0, 0, 0)
call("mount", (165, 40), 0, 0, 0, 0, 0)
call("umount2", (166, 39), 0, 0)
call("chroot", (161, 51), 0)
call("pivot_root", (155, 41), 0, 0)
call("perf_event_open", (298, 241), 0, 0, -1, -1, 0)
call("userfaultfd", (323, 282), 0)
call("io_uring_setup", (425, 425), 1, 0)
call("personality_norandom", (135, 92), 0x0040000)
call("process_vm_readv", (310, 270), 1, 0, 0, 0, 0, 0)
call("init_module", (175, 105), 0, 0, 0)
call("kexec_load", (246, 104), 0, 0, 0, 0)
try:
    socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK
    print("vsock ok")
except OSError as e:
    print("vsock", e.errno)
"""


def test_the_kernel_applies_the_filter():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    r = run_python(KERNEL_PROBE, timeout_s=10)
    assert r.ok, r.stderr
    got = dict(line.split() for line in r.stdout.splitlines())
    assert got.pop("clone3") == str(errno.ENOSYS)
    assert got == {name: str(errno.EPERM) for name in got}, got
    assert len(got) == 21


def test_ordinary_programs_still_run_and_a_pipe_is_refused():
    # Threads, fork and wait work. A pipe does not (its inode number comes from a counter of the whole machine:
    # a test could move it for the next to read), so subprocess and multiprocessing fail with PermissionError.
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    program = textwrap.dedent("""
        import multiprocessing, os, subprocess, sys, threading
        box = []
        t = threading.Thread(target=box.append, args=("thread",)); t.start(); t.join()
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        refused = []
        for attempt in (lambda: subprocess.run([sys.executable, "-c", "1"], capture_output=True),
                        lambda: multiprocessing.Pool(2)):
            try:
                attempt()
            except PermissionError as e:
                refused.append(e.errno)
        print(box[0], os.waitpid(pid, 0)[1] >> 8, refused)
    """)
    r = run_python(program, timeout_s=10)
    assert r.ok, r.stderr
    assert r.stdout.split() == ["thread", "7", "[1,", "1]"]


# Every call the program filter refuses, made for real by the program (ctypes, arguments that would otherwise be
# valid where cheap: a pipe's descriptor, a mapped page); each line prints "name errno". Then the calls a program
# needs, which must still work.
PROGRAM_PROBE = """
import ctypes, mmap, os, platform, tempfile
libc = ctypes.CDLL(None, use_errno=True)
A = 0 if platform.machine() == "x86_64" else 1
NRS = {nrs!r}
f = tempfile.TemporaryFile()
r = f.fileno()
page = mmap.mmap(-1, 4096)
addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
vec = ctypes.create_string_buffer(1)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(vec), 1)
ARGS = {{"socket": (2, 1, 0), "socketpair": (1, 1, 0, ctypes.addressof(vec)), "mincore": (addr, 4096, addr),
        "fadvise64": (r, 0, 0, 4), "cachestat": (r, addr, addr, 0), "preadv2_nowait": (r, ctypes.addressof(iov), 1,
        -1, 0, 8), "madvise_pageout": (addr, 4096, 21), "madvise_cold": (addr, 4096, 20), "pipe": (addr,),
        "pipe2": (addr, 0), "pidfd_open": (os.getpid(), 0), "sysinfo": (addr,)}}
for name, nr in sorted(NRS.items()):
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr[A]), *[ctypes.c_long(a) for a in ARGS.get(name, (r, 0, 0, 0, 0, 0))])
    print(name, ctypes.get_errno() if rc == -1 else "ok")
print("madvise_dontneed", libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(4096), 4))
os.write(r, b"x")
print("preadv_plain", os.preadv(r, [bytearray(1)], 0) if hasattr(os, "preadv") else 1)
"""


def test_the_kernel_refuses_every_call_of_the_program_filter_with_eperm():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    calls = {**seccomp.SOCKET_CALLS, **seccomp.RESIDENCY_CALLS, **seccomp.COUNTER_CALLS}
    nrs = {name: nrs for name, nrs in calls.items() if nrs[seccomp._ARCH_INDEX[seccomp.machine()]] is not None}
    nrs.update(preadv2_nowait=seccomp.PREADV2, madvise_pageout=seccomp.MADVISE, madvise_cold=seccomp.MADVISE)
    r = run_python(PROGRAM_PROBE.format(nrs=nrs), timeout_s=10)
    assert r.ok, r.stderr  # refused, not killed: the program went on to the end
    got = dict(line.split() for line in r.stdout.splitlines())
    assert got.pop("madvise_dontneed") == "0" and got.pop("preadv_plain") == "1"  # what malloc and os.preadv use
    assert got == {name: str(errno.EPERM) for name in nrs}, got
    assert len(got) == 25 + (4 if seccomp.machine() == "x86_64" else 3)
    # the positive control: the same program unsandboxed makes most of these calls (a socket, mincore, a pageout,
    # a pipe, a pidfd, sysinfo)
    with pytest.warns(sandbox.UnsafeSandboxWarning):
        free = run_python(PROGRAM_PROBE.format(nrs=nrs), timeout_s=10, unsafe_no_sandbox=True)
    free_got = dict(line.split() for line in free.stdout.splitlines())
    assert free_got["socket"] == free_got["mincore"] == free_got["madvise_pageout"] == "ok", free_got
    assert free_got["pipe2"] == free_got["pidfd_open"] == free_got["sysinfo"] == "ok", free_got


def test_the_zygote_keeps_its_socket_pair_and_the_program_has_none():
    # The forker's unix socket pair was made under the sandbox's filter, before the program's: every test of a
    # sample still runs (the forker passes each one its pipes over it), and no test can make one of its own.
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    program = ("import socket, sys\ntry:\n    socket.socketpair()\n    print('PAIR')\nexcept OSError as e:\n"
               "    print(e.errno, sys.stdin.read())\n")
    results = sandbox.run_python_tests(program, [f"{i}" for i in range(4)], timeout_s=5)
    assert [r.stdout.split() for r in results] == [["1", str(i)] for i in range(4)], results


ORDINARY = textwrap.dedent("""
    import os, sys, threading
    def square(x):
        return x * x
    if __name__ == "__main__":
        n = int(input())
        box = []
        t = threading.Thread(target=lambda: box.append(n + 1)); t.start(); t.join()
        pid = os.fork()
        if pid == 0:
            os._exit(2 * n)
        child = os.waitpid(pid, 0)[1] >> 8
        print(box[0], child, sum(map(square, range(n))))
""")


def test_threads_and_fork_still_score_full_marks():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    from klear_lib.rewards.code import MODES, score_code

    tests = [{"input": f"{n}\n", "output": f"{n + 1} {2 * n} {sum(x * x for x in range(n))}"} for n in (3, 5)]
    response = f"<think>plan</think>\n```python\n{ORDINARY}\n```\n"
    r = score_code(response, tests, mode="signed", timeout_s=10.0)
    assert (r.passed, r.total, r.score) == (2, 2, 1.0), r
    assert [MODES[m](r.passed, r.total) for m in MODES] == [1.0, 1.0, 1.0]
