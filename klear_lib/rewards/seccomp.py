"""The sandbox's seccomp filters: classic-BPF programs, built here in pure Python. Two of them, stacked.

A test program reads input, computes, and writes output; it may start threads, fork, and run the interpreter
again. It never needs to create namespaces, trace or read other processes, mount, talk to the kernel keyring,
load BPF or kernel modules, or use io_uring; nor SysV IPC, POSIX message queues or memfds (the standard library
uses none of them: multiprocessing's shared memory and semaphores are files in /dev/shm), which would let a test
leave state for the next one or hold memory outside its rlimits. Nor does it need a socket of any family, or to
ask the kernel which pages of a file are in memory. Every refusal is EPERM, so that a program that tries gets an
ordinary OSError rather than a kill, and the sandbox no longer depends on the kernel's defaults (as root the
sandbox's unprivileged uid could create user namespaces; see the module docstring of `sandbox`).

`build_filter`: the sandbox's filter, which bwrap loads (`--seccomp FD`) for every process of the sandbox, the
warm interpreter (`sandbox_zygote`) included. In the kernel's `struct seccomp_data` terms (nr at offset 0, arch
at 4, args[i] at 16 + 8 i):

    arch != AUDIT_ARCH of this machine      -> kill the process (32-bit entry points have other numbers)
    nr has the x32 bit (x86_64)             -> EPERM
    nr == clone  and args[0] & CLONE_NEW*   -> EPERM           (fork and threads pass)
    nr == clone3                            -> ENOSYS          (its flags live in memory, out of the filter's
                                                               reach; glibc then falls back to clone)
    nr == socket/socketpair, family not unix -> EPERM          (the zygote's own socket pair: `sandbox_zygote`)
    nr == personality, arg not 0 (Linux) or 0xffffffff (query)          -> EPERM (e.g. ASLR off)
    nr == rt_sigaction, signal SIGCHLD, a new action given -> EPERM   (only in `build_filter(fixed_sigchld=True)`)
    nr in DENIED                            -> EPERM
    otherwise                               -> allow

`build_program_filter`: a second filter that each test's process loads on top of the first just before the
program runs (filters stack: the kernel applies both, and neither can be removed). It is what the program lives
under; the zygote and its forker, which pass descriptors over a unix socket pair, do not. It refuses, whatever
the arguments:

    every socket call (`SOCKET_CALLS`: socket, socketpair, connect, bind, listen, accept/accept4, send*/recv*,
    get/setsockopt, getsockname/getpeername, shutdown). No socket means no packet, so none of the network
    namespace's counters moves (/proc/net/snmp, snmp6, netstat, dev, sockstat), no IPv6 flow label is chosen,
    and no socket cookie (a counter of the whole kernel: SO_COOKIE, socket diagnostics) is drawn. Before
    (issue 45), tests of one sample passed 768 bits through flow labels and counts through the counters, and
    the second sample of a group read the first one's bits from the cookie counter. What needs a socket pair
    stops working: asyncio's event loop, multiprocessing.Pipe() (duplex) and managers.
    the counters of the whole machine a program could move (`COUNTER_CALLS`: pipe, pipe2, pidfd_open, sysinfo;
    clone with CLONE_PIDFD). pipefs numbers pipe inodes from one counter of the machine, pidfs every pid the
    kernel allocates: before, a count arrived exactly from one test to the next, and the pidfd probe's second
    sample of a group scored full marks. subprocess and multiprocessing stop working (they need pipes); threads
    and fork do not.
    the page cache's residency, asked or changed (`RESIDENCY_CALLS`: mincore, cachestat, fadvise64,
    process_madvise; madvise with MADV_COLD or MADV_PAGEOUT; preadv2/pwritev2 with any flag, RWF_NOWAIT and
    RWF_DONTCACHE among them). The files the sandbox shows are all locked in memory before its first test
    (`sandbox_root.resident_files`), so their residency says nothing, and with these refused no program can
    take a page back out of it for the next sample to find missing.

The stacked program's layout: arch check, then one comparison per refused number, then the argument checks of
madvise, clone and preadv2/pwritev2.

`fixed_sigchld` is for a sandbox whose CPU time is summed from /proc (no cgroup counter): a child whose parent
ignores SIGCHLD (or sets SA_NOCLDWAIT) is reaped by the kernel and its CPU time is added to no process, so ten
short-lived workers could search a space needing 1.3x a test's limit unmetered. With SIGCHLD's action fixed at
its default, every child is either waited for (its time reaches its parent's count) or stays a zombie (its time
stays visible in /proc) until pid 1 reaps it. Setting any action of SIGCHLD is refused, handlers included
(the pointer to the new action is all the filter sees); reading it (a NULL new action) passes.

Only the low 32 bits of an argument are compared (the kernel reads clone flags, socket families, personalities,
madvise's advice and preadv2's flags as 32-bit values; a pointer, rt_sigaction's new action, is compared whole,
both halves), and both supported machines are little-endian, where they sit at the lower address.
"""

from __future__ import annotations

import errno
import platform
import struct

# Denied with EPERM. Numbers: x86_64 from asm/unistd_64.h, aarch64 from asm-generic/unistd.h (None: no such call).
SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    # namespaces (clone is filtered by its flags, clone3 answered ENOSYS: both below)
    "unshare": (272, 97), "setns": (308, 268),
    # other processes' memory and file descriptors
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_getfd": (438, 438),
    # mounts and the root
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    # the kernel keyring
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    # kernel attack surface: BPF, perf, modules, kexec, io_uring, userfaultfd
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    # state that outlives a process and memory no rlimit counts: SysV IPC and POSIX message queues (a test
    # could leave them for the next one), memfds (their pages are outside RLIMIT_AS), secret memory
    "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197),
    "semget": (64, 190), "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192),
    "msgget": (68, 186), "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187),
    "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182), "mq_timedreceive": (243, 183),
    "mq_notify": (244, 184), "mq_getsetattr": (245, 185), "memfd_create": (319, 279), "memfd_secret": (447, 447),
    # system administration, file handles (the "shocker" escape), the clock
    "reboot": (169, 142), "swapon": (167, 224), "swapoff": (168, 225), "acct": (163, 89), "syslog": (103, 116),
    "quotactl": (179, 60), "quotactl_fd": (443, 443), "lookup_dcookie": (212, 18), "vhangup": (153, 58),
    "sethostname": (170, 161), "setdomainname": (171, 162), "fanotify_init": (300, 262),
    "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "clock_adjtime": (305, 266), "adjtimex": (159, 171),
    # x86 only: port I/O, the LDT, obsolete module and sysctl calls
    "iopl": (172, None), "ioperm": (173, None), "modify_ldt": (154, None), "uselib": (134, None),
    "_sysctl": (156, None), "create_module": (174, None), "get_kernel_syms": (177, None),
    "query_module": (178, None), "nfsservctl": (180, None),
}
# Refused to the program (`build_program_filter`), whatever the arguments: (x86_64, aarch64).
SOCKET_CALLS: dict[str, tuple[int, int]] = {
    "socket": (41, 198), "socketpair": (53, 199), "connect": (42, 203), "bind": (49, 200), "listen": (50, 201),
    "accept": (43, 202), "accept4": (288, 242), "sendto": (44, 206), "recvfrom": (45, 207), "sendmsg": (46, 211),
    "recvmsg": (47, 212), "sendmmsg": (307, 269), "recvmmsg": (299, 243), "getsockopt": (55, 209),
    "setsockopt": (54, 208), "getsockname": (51, 204), "getpeername": (52, 205), "shutdown": (48, 210),
}
RESIDENCY_CALLS: dict[str, tuple[int, int]] = {
    "mincore": (27, 232), "cachestat": (451, 451), "fadvise64": (221, 223), "process_madvise": (440, 440),
}
# Kernel-wide counters a program could move for a later one to read (aarch64 has no `pipe`, only `pipe2`): a pipe's
# inode number (pipefs numbers inodes from one counter of the whole machine), a pidfd's (pidfs numbers every pid
# the kernel allocates), sysinfo's process count and load.
COUNTER_CALLS: dict[str, tuple[int | None, int | None]] = {
    "pipe": (22, None), "pipe2": (293, 59), "pidfd_open": (434, 434), "sysinfo": (99, 179),
}
CLONE_PIDFD = 0x1000  # clone's own way to a pidfd (clone3 is ENOSYS for everyone)
MADVISE, PREADV2, PWRITEV2 = (28, 233), (327, 286), (328, 287)
MADV_COLD, MADV_PAGEOUT = 20, 21  # deactivate, reclaim: a file's pages out of the cache
# Filtered by argument: (x86_64, aarch64).
CLONE, CLONE3, PERSONALITY = (56, 220), (435, 435), (135, 92)
RT_SIGACTION = (13, 134)
SIGCHLD = 17  # x86_64 and aarch64 alike
SOCKET, SOCKETPAIR = (41, 198), (53, 199)

CLONE_NEW_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
ALLOWED_FAMILIES = (1,)  # AF_UNIX: the zygote's socket pair (the program may use none: `build_program_filter`)
ALLOWED_PERSONALITIES = (0x0, 0xFFFFFFFF)  # PER_LINUX, and the query personality(0xffffffff)
X32_SYSCALL_BIT = 0x40000000

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # EM_X86_64 / EM_AARCH64 | 64-bit | little-endian
_ARCH_INDEX = {"x86_64": 0, "aarch64": 1}

# Return values (linux/seccomp.h).
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
# Classic BPF opcodes (linux/filter.h): load word absolute, jumps against a constant, return a constant.
LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
NR, ARCH, ARG0, ARG1, ARG2, ARG5 = 0, 4, 16, 24, 32, 56  # offsets in struct seccomp_data
_INSN = struct.Struct("<HBBI")  # struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}


class UnsupportedMachineError(RuntimeError):
    """No syscall table for this machine."""


def machine() -> str:
    """This machine in the tables' terms ("x86_64" or "aarch64")."""
    m = platform.machine().lower()
    m = {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)
    if m not in _ARCH_INDEX:
        raise UnsupportedMachineError(
            f"the sandbox's seccomp filter has syscall numbers for {', '.join(_ARCH_INDEX)}, not {m!r}")
    return m


def denied_syscalls(arch: str | None = None) -> dict[str, int]:
    """Name -> number of every syscall denied outright on `arch` (default: this machine)."""
    i = _ARCH_INDEX[arch or machine()]
    return {name: nrs[i] for name, nrs in SYSCALLS.items() if nrs[i] is not None}


def program_denied_syscalls(arch: str | None = None) -> dict[str, int]:
    """Name -> number of every syscall `build_program_filter` refuses outright on `arch` (default: this
    machine)."""
    i = _ARCH_INDEX[arch or machine()]
    calls = {**SOCKET_CALLS, **RESIDENCY_CALLS, **COUNTER_CALLS}
    return {name: nrs[i] for name, nrs in calls.items() if nrs[i] is not None}


def build_program_filter(arch: str | None = None) -> bytes:
    """The filter each test's process stacks on the sandbox's own just before the program runs (module
    docstring), for `arch` (default: this machine), as packed `sock_filter`s."""
    arch = arch or machine()
    i = _ARCH_INDEX[arch]
    prog: list[tuple] = [
        (LD_W_ABS, ARCH, None, None),
        (JEQ, AUDIT_ARCH[arch], None, "kill"),
        (LD_W_ABS, NR, None, None),
        (JEQ, MADVISE[i], "madvise", None),
        (JEQ, CLONE[i], "clone", None),
        (JEQ, PREADV2[i], "rwf", None),
        (JEQ, PWRITEV2[i], "rwf", None),
    ]
    prog += [(JEQ, nr, "eperm", None) for nr in sorted(program_denied_syscalls(arch).values())]
    prog += [(RET, RET_ALLOW, None, None)]
    labels = {"madvise": len(prog)}
    prog += [(LD_W_ABS, ARG2, None, None), (JEQ, MADV_COLD, "eperm", None), (JEQ, MADV_PAGEOUT, "eperm", "allow")]
    labels["clone"] = len(prog)
    prog += [(LD_W_ABS, ARG0, None, None), (JSET, CLONE_PIDFD, "eperm", "allow")]
    labels["rwf"] = len(prog)
    prog += [(LD_W_ABS, ARG5, None, None), (JEQ, 0, "allow", "eperm")]  # preadv2/pwritev2: no flag at all
    return _finish(prog, labels)


def build_filter(arch: str | None = None, *, fixed_sigchld: bool = False) -> bytes:
    """The filter for `arch` (default: this machine) as packed `sock_filter`s, ready for `--seccomp FD`;
    `fixed_sigchld`: also refuse to change SIGCHLD's action (module docstring)."""
    arch = arch or machine()
    i = _ARCH_INDEX[arch]
    eperm = RET_ERRNO | errno.EPERM
    # (opcode, k, jump-if-true label, jump-if-false label); a label None means "next instruction".
    prog: list[tuple] = [
        (LD_W_ABS, ARCH, None, None),
        (JEQ, AUDIT_ARCH[arch], None, "kill"),
        (LD_W_ABS, NR, None, None),
    ]
    if arch == "x86_64":
        prog.append((JGE, X32_SYSCALL_BIT, "eperm", None))
    prog += [
        (JEQ, CLONE[i], "clone", None),
        (JEQ, CLONE3[i], "enosys", None),
        (JEQ, SOCKET[i], "socket", None),
        (JEQ, SOCKETPAIR[i], "socket", None),
        (JEQ, PERSONALITY[i], "personality", None),
    ]
    if fixed_sigchld:
        prog.append((JEQ, RT_SIGACTION[i], "sigaction", None))
    prog += [(JEQ, nr, "eperm", None) for nr in sorted(denied_syscalls(arch).values())]
    prog += [(RET, RET_ALLOW, None, None)]
    labels = {"clone": len(prog)}
    prog += [(LD_W_ABS, ARG0, None, None), (JSET, CLONE_NEW_FLAGS, "eperm", "allow")]
    labels["socket"] = len(prog)
    prog += [(LD_W_ABS, ARG0, None, None)] + [(JEQ, f, "allow", None) for f in ALLOWED_FAMILIES]
    prog += [(RET, eperm, None, None)]
    labels["personality"] = len(prog)
    prog += [(LD_W_ABS, ARG0, None, None)] + [(JEQ, p, "allow", None) for p in ALLOWED_PERSONALITIES]
    prog += [(RET, eperm, None, None)]
    if fixed_sigchld:  # SIGCHLD with a new action (either half of the pointer non-zero): EPERM
        labels["sigaction"] = len(prog)
        prog += [(LD_W_ABS, ARG0, None, None), (JEQ, SIGCHLD, None, "allow"),
                 (LD_W_ABS, ARG1, None, None), (JEQ, 0, None, "eperm"),
                 (LD_W_ABS, ARG1 + 4, None, None), (JEQ, 0, "allow", "eperm")]
    return _finish(prog, labels)


def _finish(prog: list[tuple], labels: dict[str, int]) -> bytes:
    """`prog` with the shared return instructions appended, assembled."""
    rets = (("allow", RET_ALLOW), ("eperm", RET_ERRNO | errno.EPERM), ("enosys", RET_ERRNO | errno.ENOSYS),
            ("kill", RET_KILL_PROCESS))
    for name, ret in rets:
        labels[name] = len(prog)
        prog.append((RET, ret, None, None))
    return b"".join(_assemble(pc, insn, labels) for pc, insn in enumerate(prog))


def _assemble(pc: int, insn: tuple, labels: dict[str, int]) -> bytes:
    code, k, jt, jf = insn

    def offset(label):  # cBPF jumps are forward only, relative to the next instruction, 8 bits
        if label is None:
            return 0
        off = labels[label] - pc - 1
        assert 0 <= off <= 255, f"jump from {pc} to {label} is {off} instructions, out of cBPF's 0..255"
        return off

    return _INSN.pack(code, offset(jt), offset(jf), k)
