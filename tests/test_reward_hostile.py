"""The code reward's hostile corpus: what a policy could write to be paid without solving its problem.

Each probe is a candidate "solution" that does not solve its problem, written as a policy would find it: it
forges or poisons its result (the judge family), carries work from one test to the next (state), holds more
memory than one process may (memory), or burns the CPU to starve a neighbour (cpu). Problems have random secret
expected outputs (nothing can pass them) or, for the state family, an answer that costs about twice the CPU-time
limit of one test (nothing can pass a test without help from an earlier one).

Every probe is scored the three ways training scores it: ``score_code``; ``RewardPool`` + ``MemoPool`` + the TRL
reward wrapper, as the RL units build them (``train.code_jobs``); and verl's ``compute_score``. Each must score
no more than an honest wrong answer to the same problem in the same mode, and nothing may raise. The ``host``
fixture of ``test_sandbox_hostile`` (the host's files, processes, sockets) checks the host unchanged after each
test. The figures the probes measure (memory held, an honest sample's score beside a neighbour) are asserted
here; ``pytest -s`` prints them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field

import pytest
from test_sandbox_hostile import _cmdline, descendants, host_unchanged

from klear_lib.integrations import verl_reward
from klear_lib.rewards import sandbox, sandbox_cgroup, sandbox_json, sandbox_root
from klear_lib.rewards.code import MODES, failure_score, parse_tests, score_code
from klear_lib.rewards.pool import RewardPool
from klear_lib.rewards.pool_wrappers import MemoPool, make_trl_reward_func
from klear_lib.rewards.sandbox import run_python_tests

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

# >>> probes (stdlib only from here to the end marker: a script may exec this part against another version)


def respond(program: str) -> str:
    return f"<think>a plan</think>\n```python\n{textwrap.dedent(program)}\n```\n"


N_TESTS = 4
CHAIN_N = 2_300_000  # sha256 iterations: 0.6-0.9 s of CPU, about twice the state family's limit
STATE_TIMEOUT_S = 0.35
SEED = secrets.token_bytes(32)


def chain(seed: bytes, n: int) -> str:
    h = seed
    for _ in range(n):
        h = hashlib.sha256(h).digest()
    return h.hex()


def problems(chain_hex: str) -> dict[str, list[dict]]:
    """Each problem's tests: secret random answers, or the costly chain (computed by the caller once), or the costly
    search, or a relay (each test's answer is the next one's input; the last one's a secret)."""
    relay = [secrets.token_hex(8) for _ in range(N_TESTS + 1)]
    return {
        "stdio": [{"input": f"{i}\n", "output": secrets.token_hex(8)} for i in range(N_TESTS)],
        "call": [{"fn_name": "f", "args": [i], "expected": secrets.randbelow(10 ** 9)} for i in range(N_TESTS)],
        "bigcall": [{"fn_name": "f", "args": [i], "expected": secrets.randbits(17_000)} for i in range(N_TESTS)],
        "chain": [{"input": f"{i}\n", "output": f"{chain_hex}{i}"} for i in range(N_TESTS)],
        "search": [{"input": f"{i}\n", "output": f"{SEARCH_X} {i}"} for i in range(N_TESTS)],
        "search2": [{"input": f"{i}\n", "output": f"{SEARCH_X} {i}"} for i in range(2)],  # issue 45's: cheaper
        "relay": [{"input": f"{relay[i]}\n", "output": relay[i + 1]} for i in range(N_TESTS)],
    }


HONEST_WRONG = {"stdio": "print(0)", "call": "def f(i):\n    return 0", "bigcall": "def f(i):\n    return i",
                "chain": "print(0)", "search": "print(0)", "search2": "print(0)", "relay": "print(0)"}


# Finds the old harness's per-test nonce in its frames (a local of the function that called ours), so that a
# forged record carries it; with no nonce to find, the record is written bare.
FIND_NONCE = """
import os, sys
def tag():
    frame = sys._getframe()
    while frame is not None:
        if 'nonce' in frame.f_locals:
            return str(frame.f_locals['nonce']) + ' '
        frame = frame.f_back
    return ''
"""

# The state family: continue a hash chain from saved progress, save progress as it goes, print the answer.
CHAIN_PROGRAM = """
import hashlib, sys
N, SEED = {n}, bytes.fromhex('{seed}')
{channel}
try:
    k, h = load()
except Exception:
    k, h = 0, SEED
while k < N:
    stop = min(N, k + 20000)
    while k < stop:
        h = hashlib.sha256(h).digest()
        k += 1
    try:
        save(k, h)
    except Exception:
        pass
print(h.hex() + sys.stdin.read().strip())
"""

LIBC = """
import ctypes, ctypes.util
libc = ctypes.CDLL(None, use_errno=True)
def pack(k, h):
    return k.to_bytes(8, 'little') + h
def unpack(b):
    return int.from_bytes(b[:8], 'little'), bytes(b[8:40])
"""

CHANNELS = {
    "sysv_shm": LIBC + """
libc.shmat.restype = ctypes.c_void_p
ID = libc.shmget(0x4B4C, 64, 0o1600)  # IPC_CREAT | 0600
if ID < 0:
    raise SystemExit
ADDR = libc.shmat(ID, None, 0)
def load():
    b = ctypes.string_at(ADDR, 40)
    if b[:8] == bytes(8):
        raise LookupError
    return unpack(b)
def save(k, h):
    ctypes.memmove(ADDR, pack(k, h), 40)
""",
    "sysv_msg": LIBC + """
ID = libc.msgget(0x4B4D, 0o1600)
class Msg(ctypes.Structure):
    _fields_ = [('mtype', ctypes.c_long), ('text', ctypes.c_ubyte * 40)]
def take():
    m, last = Msg(), None
    while libc.msgrcv(ID, ctypes.byref(m), 40, 0, 0o4000) == 40:  # IPC_NOWAIT
        last = bytes(m.text)
    return last
def load():
    b = take()
    if b is None:
        raise LookupError
    save(*unpack(b))
    return unpack(b)
def save(k, h):
    take()
    m = Msg(1, (ctypes.c_ubyte * 40)(*pack(k, h)))
    libc.msgsnd(ID, ctypes.byref(m), 40, 0o4000)
""",
    "sysv_sem": LIBC + """
ID = libc.semget(0x4B4E, 40, 0o1600)
Vals = ctypes.c_ushort * 40
def load():
    v = Vals()
    if libc.semctl(ID, 0, 13, v) < 0 or not any(v):  # GETALL
        raise LookupError
    return unpack(bytes(list(v)))
def save(k, h):
    libc.semctl(ID, 0, 17, Vals(*pack(k, h)))  # SETALL
""",
    "posix_mq": LIBC + """
class Attr(ctypes.Structure):
    _fields_ = [('flags', ctypes.c_long), ('maxmsg', ctypes.c_long), ('msgsize', ctypes.c_long),
                ('curmsgs', ctypes.c_long), ('pad', ctypes.c_long * 4)]
rt = ctypes.CDLL(ctypes.util.find_library('rt') or None, use_errno=True)
QD = rt.mq_open(b'/klear-progress', 0o4102, 0o600, ctypes.byref(Attr(0, 4, 40, 0)))  # O_RDWR|O_CREAT|O_NONBLOCK
buf = ctypes.create_string_buffer(40)
def take():
    last = None
    while rt.mq_receive(QD, buf, 40, None) == 40:
        last = buf.raw
    return last
def load():
    b = take()
    if b is None:
        raise LookupError
    save(*unpack(b))
    return unpack(b)
def save(k, h):
    take()
    rt.mq_send(QD, pack(k, h), 40, 0)
""",
    # the zygote's memory: each test's stderr passes through it, freed but not cleared, and a process forked
    # from it copied it (a checkpoint in 135 KB of stderr, found again by reading one's own heap)
    "zygote_memory": LIBC + """
import os
def load():
    best = None
    for line in open('/proc/self/maps'):
        f = line.split()
        if 'rw' not in f[1] or (len(f) >= 6 and f[5] != '[heap]'):
            continue
        lo, hi = (int(x, 16) for x in f[0].split('-'))
        data = ctypes.string_at(lo, hi - lo)
        i = data.find(b'KLEAR' b'CKPT')
        while i >= 0:
            try:
                k, h = unpack(bytes.fromhex(data[i + 9:i + 89].decode()))
                if best is None or k > best[0]:
                    best = (k, h)
            except Exception:
                pass
            i = data.find(b'KLEAR' b'CKPT', i + 1)
    if best is None:
        raise LookupError
    return best
def save(k, h):
    if k % 200000 == 0:
        os.write(2, (('KLEAR' 'CKPT' + pack(k, h).hex() + chr(10)) * 1500).encode())
""",
    # /tmp behind 1,100 directories (deeper than the recursion limit: the old sweep died on it)
    "tmp_deep_tree": """
import os
def down(make):
    os.chdir('/tmp')
    for _ in range(1100):
        if make and not os.path.isdir('d'):
            os.mkdir('d')
        os.chdir('d')
def load():
    down(False)
    with open('progress', 'rb') as f:
        b = f.read()
    return int.from_bytes(b[:8], 'little'), b[8:40]
def save(k, h):
    down(True)
    with open('progress.new', 'wb') as f:
        f.write(k.to_bytes(8, 'little') + h)
    os.replace('progress.new', 'progress')
""",
    # a path longer than PATH_MAX (30 names of 200 characters)
    "tmp_long_path": """
import os
def down(make):
    os.chdir('/tmp')
    for _ in range(30):
        if make and not os.path.isdir('x' * 200):
            os.mkdir('x' * 200)
        os.chdir('x' * 200)
def load():
    down(False)
    with open('progress', 'rb') as f:
        b = f.read()
    return int.from_bytes(b[:8], 'little'), b[8:40]
def save(k, h):
    down(True)
    with open('progress', 'wb') as f:
        f.write(k.to_bytes(8, 'little') + h)
""",
    # /dev/shm behind a directory the test took every permission from
    "shm_locked_dir": """
import os
P = '/dev/shm/locked'
def load():
    os.chmod(P, 0o700)
    with open(P + '/progress', 'rb') as f:
        b = f.read()
    os.chmod(P, 0)
    return int.from_bytes(b[:8], 'little'), b[8:40]
def save(k, h):
    if os.path.isdir(P):
        os.chmod(P, 0o700)
    else:
        os.mkdir(P)
    with open(P + '/progress', 'wb') as f:
        f.write(k.to_bytes(8, 'little') + h)
    os.chmod(P, 0)
""",
}


# The counter family: find the secret x in 8 chunks of SEARCH_SIZE candidates, x in the last one: about twice the
# state family's limit of CPU. Progress is a small number (chunks done, or "x is in chunk c"), so a channel of a
# few bits per test is enough to resume: the pid counter, the tmpfs inode counter, a directory's entry offsets,
# TCP's TIME_WAIT sockets. A value is read only inside a window of the channel's residues mod 256 (160..175), so
# that what a fresh sandbox shows is never taken for progress.
SEARCH_SIZE = 160_000
SEARCH_X = 7 * SEARCH_SIZE + secrets.randbelow(SEARCH_SIZE)


def search_target(seed: bytes, x: int) -> str:
    return hashlib.sha256(seed + x.to_bytes(8, "little")).hexdigest()[:16]


SEARCH_PROGRAM = """
import hashlib, os, sys
SEED, TARGET, CHUNKS, SIZE = bytes.fromhex('{seed}'), '{target}', 8, {size}
{channel}
def scan(c):
    for x in range(c * SIZE, (c + 1) * SIZE):
        if hashlib.sha256(SEED + x.to_bytes(8, 'little')).hexdigest()[:16] == TARGET:
            return x
    return None
try:
    v = load()
except Exception:
    v = 0
x = scan(v - 8) if v >= 8 else None
c = v
while x is None and c < CHUNKS:
    x = scan(c)
    if x is None:
        c += 1
        try:
            save(c)
        except Exception:
            pass
if x is not None and v < 8:
    try:
        save(8 + c)
    except Exception:
        pass
print(x, sys.stdin.read().strip())
"""

# A counter read by making a fresh object (`fresh()`: its number): the next test decodes 0-15 from the number's low
# byte, and a test that saves moves the counter on until the next fresh object, `ahead` numbers on, shows its value.
BY_A_FRESH_NUMBER = """def load():
    r = fresh() % 256
    if not 160 <= r < 176:
        raise LookupError
    return r - 160
def save(v):
    for _ in range(600):
        if (fresh() + {ahead}) % 256 == 160 + v:
            return
"""

COUNTER_CHANNELS = {
    # the pid counter: the next test's pid is the last child's + 1 (nothing forks between tests)
    "pid_counter": """
def load():
    r = os.getpid() % 256
    if not 160 <= r < 176:
        raise LookupError
    return r - 160
def save(v):
    for _ in range(600):
        p = os.fork()
        if p == 0:
            os._exit(0)
        os.waitpid(p, 0)
        if (p + 1) % 256 == 160 + v:
            return
""",
    # the /tmp tmpfs inode counter, moved by unnamed files (the zygote's stdin file for the next test takes one)
    "tmpfs_inode_counter": """
def fresh():
    fd = os.open('/tmp', os.O_TMPFILE | os.O_RDWR)
    ino = os.fstat(fd).st_ino
    os.close(fd)
    return ino
""" + BY_A_FRESH_NUMBER.format(ahead=2),
    # /tmp's entry offsets, moved by renames, read with getdents64 as a listing's positions
    "dir_offset_counter": LIBC + """
NR = {'x86_64': 217, 'aarch64': 61}[os.uname().machine]
def fresh():
    open('/tmp/p', 'w').close()
    fd = os.open('/tmp', os.O_RDONLY | os.O_DIRECTORY)
    buf = ctypes.create_string_buffer(1 << 16)
    n = libc.syscall(NR, fd, buf, len(buf))
    os.close(fd)
    pos, before, found = 0, 0, 0
    while pos < n:
        off = int.from_bytes(buf.raw[pos + 8:pos + 16], 'little', signed=True)
        if buf.raw[pos + 19:pos + 21] == b'p\\0':
            found = max(x for x in (before, off) if x < 2 ** 31 - 1)
        before, pos = off, pos + int.from_bytes(buf.raw[pos + 16:pos + 18], 'little')
    os.unlink('/tmp/p')
    return found
""" + BY_A_FRESH_NUMBER.format(ahead=1),
    # TCP's TIME_WAIT: a loopback connection closed by its client keeps the client's port for 60 s
    "tcp_time_wait": """
import socket
def load():
    ports = []
    for line in open('/proc/net/tcp').read().splitlines()[1:]:
        f = line.split()
        if f[3] == '06':  # TIME_WAIT
            ports.append(int(f[1].split(':')[1], 16) - 40000)
    v = max([p for p in ports if 0 <= p < 16] or [-1])
    if v < 0:
        raise LookupError
    return v
def save(v):
    srv = socket.socket()
    srv.bind(('127.0.0.1', 0))
    srv.listen(1)
    c = socket.socket()
    c.bind(('127.0.0.1', 40000 + v))
    c.connect(srv.getsockname())
    s, _ = srv.accept()
    c.close()
    s.close()
    srv.close()
""",
}

# Issue 45: what a test could move before the program's own seccomp filter (no socket, no page-cache query).
# A counter of the sample's network namespace, moved by sending UDP datagrams over the loopback to a socket of our
# own (no ICMP answer, one packet each); read from /proc/net as the next test finds it.
NET_COUNTER = """
import socket
RX = None
def bump():
    global RX
    if RX is None:
        RX = socket.socket({family}, socket.SOCK_DGRAM)
        RX.bind(({loopback!r}, 0))
    socket.socket({family}, socket.SOCK_DGRAM).sendto(b'x', RX.getsockname())
def field(path, row, name):
    lines = [line.split() for line in open(path).read().splitlines()]
    for head, values in zip(lines, lines[1:]):
        if head[0] == row and values[0] == row:
            return int(values[head.index(name)])
    raise LookupError
def count():
    return {count}
def load():
    r = count() % 256
    if not 160 <= r < 176:
        raise LookupError
    return r - 160
def save(v):
    for _ in range(600):
        if count() % 256 == 160 + v:
            return
        bump()
"""
NET_CHANNELS = {
    "net_snmp_udp_out_datagrams": dict(family="socket.AF_INET", loopback="127.0.0.1",
                                       count="field('/proc/net/snmp', 'Udp:', 'OutDatagrams')"),
    "net_snmp6_udp6_out_datagrams": dict(
        family="socket.AF_INET6", loopback="::1",
        count="int(dict(l.split() for l in open('/proc/net/snmp6'))['Udp6OutDatagrams'])"),
    "net_netstat_out_octets": dict(family="socket.AF_INET", loopback="127.0.0.1",  # 29 bytes a datagram
                                   count="field('/proc/net/netstat', 'IpExt:', 'OutOctets') // 29"),
    "net_dev_loopback_tx_packets": dict(
        family="socket.AF_INET", loopback="127.0.0.1",
        count="[int(l.split(':')[1].split()[9]) for l in open('/proc/net/dev') if l.strip().startswith('lo:')][0]"),
}
COUNTER_CHANNELS.update({name: NET_COUNTER.format(**kw) for name, kw in NET_CHANNELS.items()})
# Counters of the whole machine moved by what every program does (the review of issue 45): pipefs numbers each
# pipe's inode from one counter; /proc/stat counts forks since boot; pidfs numbers every pid the kernel allocates.
# Before: exact from one test to the next (6-7 numbers of the zygote's own between them).
COUNTER_CHANNELS.update({
    "pipe_inode_counter": """
def fresh():
    r, w = os.pipe()
    ino = os.fstat(r).st_ino
    os.close(r)
    os.close(w)
    return ino
""" + BY_A_FRESH_NUMBER.format(ahead=7),
    "fork_counter": """
def fresh():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    for line in open('/proc/stat'):
        if line.startswith('processes'):
            return int(line.split()[1])
""" + BY_A_FRESH_NUMBER.format(ahead=3),
    "pidfd_inode_counter": """
def fresh():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    fd = os.pidfd_open(pid)
    ino = os.fstat(fd).st_ino
    os.close(fd)
    os.waitpid(pid, 0)
    return ino
""" + BY_A_FRESH_NUMBER.format(ahead=3),
})
ISSUE_45 = {*NET_CHANNELS, "ipv6_flow_label", "socket_cookie", "page_cache", "pipe_inode_counter", "fork_counter",
            "pidfd_inode_counter"}  # two tests a sample: test 0 -> 1
COUNTER_CHANNELS.update({
    # IPv6 flow labels: a label taken with IPV6_FLOWLABEL_MGR lingers in the namespace's table for seconds after
    # its socket closes, listed in /proc/net/ip6_flowlabel (20 bits a label; the review sent 768 bits a test)
    "ipv6_flow_label": """
import socket, struct
def load():
    labels = [int(l.split()[0], 16) for l in open('/proc/net/ip6_flowlabel').read().splitlines()[1:]]
    v = [x - 0xA0 for x in labels if 0xA0 <= x < 0xB0]
    if not v:
        raise LookupError
    return max(v)
def save(v):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    req = bytes(15) + b'\\1' + struct.pack('>I', 0xA0 + v) + struct.pack('<BBHHHI', 0, 255, 1, 0, 6, 0)  # to ::1
    s.setsockopt(41, 32, req)  # IPPROTO_IPV6, IPV6_FLOWLABEL_MGR
    s.close()
""",
    # socket cookies: SO_COOKIE numbers sockets from one counter of the whole kernel (across samples too)
    "socket_cookie": """
import socket
def fresh():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    c = int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 57, 8), 'little')  # SO_COOKIE
    s.close()
    return c
""" + BY_A_FRESH_NUMBER.format(ahead=1),
})

# The page cache: the sandbox shows host files read-only, and whether a page of one is in memory is the whole
# machine's. A sender reads the files of the bits it sets; a receiver asks which are resident (mincore, else the
# time a read takes). A marker file (always read by the sender) and a control file (never read) make a message:
# the marker resident, the control not. Files: the stdlib's idlelib, which no program imports, chosen by the seed.
PAGE_CACHE = """
import ctypes, mmap, os, random, time
libc = ctypes.CDLL(None, use_errno=True)
IDLE = os.path.join(os.path.dirname(os.__file__), 'idlelib')
NAMES = sorted(n for n in os.listdir(IDLE) if n.endswith('.py') and os.path.getsize(os.path.join(IDLE, n)) > 8192)
FILES = [os.path.join(IDLE, n) for n in random.Random(SEED).sample(NAMES, {nbits} + 2)]
MARK, CONTROL, BITS = FILES[0], FILES[1], FILES[2:]
def resident(path):
    with open(path, 'rb') as f:
        try:
            m = mmap.mmap(f.fileno(), 4096, access=mmap.ACCESS_COPY)  # mapped, not touched
            vec = ctypes.create_string_buffer(1)
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(m))), 4096, vec) == 0:
                return vec.raw[0] & 1 == 1
        except Exception:
            pass
        t = time.perf_counter()  # mincore refused: the time one page takes to read
        f.read(4096)
        return time.perf_counter() - t < 30e-6
def read_bits():
    if not resident(MARK) or resident(CONTROL):
        raise LookupError
    return sum(1 << i for i, p in enumerate(BITS) if resident(p))
def send_bits(v):
    for p in [MARK] + [p for i, p in enumerate(BITS) if v >> i & 1]:
        with open(p, 'rb') as f:
            f.read()
"""
# Sent inverted: every file resident (what the sandbox shows) then reads as 0, never as 15 ("x is in chunk 7",
# the truth): a control file read slowly by chance (the timed fallback, on a busy machine) once passed for a message.
COUNTER_CHANNELS["page_cache"] = PAGE_CACHE.format(nbits=4) + """
def load():
    return 15 - read_bits()
def save(v):
    send_bits(15 - v)
"""


# The peek family: test i's answer is test i+1's input; the program looks for the other tests' inputs in the
# harness's frames and globals (before, every test's process held them all).
PEEK_PROGRAM = """
import sys
me = sys.stdin.read()
found, f = None, sys._getframe()
while f is not None and found is None:
    for v in list(f.f_locals.values()) + list(f.f_globals.values()):
        if isinstance(v, dict) and isinstance(v.get('tests'), list):
            v = v['tests']
        if isinstance(v, list) and v and all(isinstance(t, dict) for t in v):
            ins = [t.get('stdin') for t in v]
            if me in ins and ins.index(me) + 1 < len(ins):
                found = ins[ins.index(me) + 1]
    f = f.f_back
print(found.strip() if found else 0)
"""


@dataclass(frozen=True)
class Probe:
    name: str
    family: str
    problem: str
    program: str
    options: dict = field(default_factory=dict)


def probes(seed: bytes) -> list[Probe]:
    forge = FIND_NONCE + """
def f(i):
    os.write(3, (tag() + {line!r}).encode('latin-1'))
    os._exit(0)
"""
    judge = [
        Probe("forged_undecodable_line", "judge", "call", forge.format(line="json [1,\n")),
        Probe("forged_invalid_utf8", "judge", "call", forge.format(line='json "\xff\xfe"\n')),
        Probe("forged_huge_int_line", "judge", "call", forge.format(line="json " + "7" * 5000 + "\n")),
        Probe("forged_two_records", "judge", "call", FIND_NONCE + """
def f(i):
    for guess in range(50):
        os.write(3, (tag() + 'json %d\\n' % guess).encode())
    return -1
"""),
        Probe("nested_3000_deep", "judge", "call", """
import sys
def f(i):
    sys.setrecursionlimit(100000)
    x = []
    for _ in range(3000):
        x = [x]
    return x
"""),
        Probe("huge_int_return", "judge", "call", "def f(i):\n    return 10 ** 5000 + i\n"),
        Probe("huge_wrong_int_vs_huge_expected", "judge", "bigcall", "def f(i):\n    return 7 ** 6000\n"),
        Probe("nan_inf_return", "judge", "call", "def f(i):\n    return [float('nan'), float('inf'), -0.0][i % 3]\n"),
        Probe("result_over_the_cap", "judge", "call", "def f(i):\n    return 'x' * (5 << 20)\n"),
        Probe("eq_always_true", "judge", "call", """
class Anything(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
    def __repr__(self):
        raise RuntimeError('no repr')
def f(i):
    return {Anything(1): Anything(2)}
"""),
        Probe("forged_frames_on_every_fd", "judge", "stdio", """
import os
fake = b'0 0 0 0 0 0 0 0 0.0 0.0 6 0 0\\nFORGED'
for fd in range(64):
    try:
        os.write(fd, fake)
    except OSError:
        pass
print('honest', input())
"""),
    ]
    state = [Probe(f"state_{name}", "state", "chain",
                   CHAIN_PROGRAM.format(n=CHAIN_N, seed=seed.hex(), channel=textwrap.dedent(code)),
                   {"timeout_s": STATE_TIMEOUT_S}) for name, code in CHANNELS.items()]
    counter = [Probe(f"counter_{name}", "counter", "search2" if name in ISSUE_45 else "search",
                     SEARCH_PROGRAM.format(seed=seed.hex(), target=search_target(seed, SEARCH_X), size=SEARCH_SIZE,
                                           channel=textwrap.dedent(code)),
                     {"timeout_s": STATE_TIMEOUT_S}) for name, code in COUNTER_CHANNELS.items()]
    peek = [Probe("peek_the_next_tests_input", "peek", "relay", PEEK_PROGRAM)]
    memory = [
        Probe("memory_16_processes_x_90_mb", "memory", "stdio", FANOUT, {"memory_mb": 200}),
        Probe("memory_memfd_128_mb", "memory", "stdio", """
import os
fds = []
for _ in range(8):
    fd = os.memfd_create('x')
    os.write(fd, b'\\1' * (16 << 20))
    fds.append(fd)
print('held', len(fds) * 16)
"""),
        Probe("memory_sysv_shm_1_gb", "memory", "stdio", LIBC + """
libc.shmat.restype = ctypes.c_void_p
held = 0
for k in range(4):
    i = libc.shmget(0x4B50 + k, 256 << 20, 0o1600)
    if i < 0:
        break
    a = libc.shmat(i, None, 0)
    ctypes.memset(a, 1, 256 << 20)
    libc.shmdt(ctypes.c_void_p(a))
    held += 256
print('held', held)
"""),
    ]
    cpu = [Probe("cpu_16_busy_processes", "cpu", "stdio", BUSY, {"timeout_s": 0.3})]
    return judge + state + counter + peek + memory + cpu


# Fork 15 children that each touch 90 MB and stay; each time one reports, print how many of those that reported
# are still alive (holding their 90 MB at once), for 2 s at most.
FANOUT = """
import os, time
kids = []
for _ in range(15):
    pid = os.fork()
    if pid == 0:
        block = bytearray(b'\\1') * (90 << 20)
        open('/tmp/held-%d' % os.getpid(), 'w').close()
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
alive, holding, until = set(kids), set(), time.monotonic() + 2
while time.monotonic() < until and len(holding) < len(kids):
    new = {int(n[5:]) for n in os.listdir('/tmp') if n.startswith('held-')} - holding
    if not new:
        time.sleep(0.005)
        continue
    holding |= new
    for p in list(alive):
        if os.waitpid(p, os.WNOHANG)[0]:
            alive.discard(p)  # killed (the memory cap): it holds nothing now
    os.write(1, b'holding %d\\n' % len(holding & alive))
"""

# 16 processes spinning until killed.
BUSY = """
import os
for _ in range(4):
    try:
        os.fork()
    except OSError:
        pass
while True:
    pass
"""

# <<< probes


CHAIN_HEX = chain(SEED, CHAIN_N)
PROBLEMS = problems(CHAIN_HEX)
PROBES = probes(SEED)
MODE_LIST = list(MODES)
REPORT: list[str] = []


@pytest.fixture
def host(tmp_path):
    """The host checked unchanged after the test (`test_sandbox_hostile.host_unchanged`)."""
    with host_unchanged(tmp_path) as h:
        yield h


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if REPORT:
        print("\n" + "\n".join(REPORT))


@pytest.fixture(scope="module")
def honest_wrong():
    """(problem, mode) -> the score of an honest wrong answer (its program is a plain wrong guess)."""
    scores = {}
    for problem, program in HONEST_WRONG.items():
        for mode in MODE_LIST:
            r = score_code(respond(program), PROBLEMS[problem], mode=mode)
            assert r.passed == 0 and r.reason == "none_passed", r
            scores[problem, mode] = r.score
    return scores


def options(probe: Probe) -> dict:
    return {"timeout_s": 1.0, **probe.options}


# --- the problems are fair: they can be passed, and the state probes are exactly too slow -----------------------

def test_the_costly_problem_is_passed_with_time_and_failed_without(host):
    program = CHAIN_PROGRAM.format(n=CHAIN_N, seed=SEED.hex(), channel="def load():\n    raise LookupError\n"
                                   "def save(k, h):\n    pass\n")
    slow = score_code(respond(program), PROBLEMS["chain"][:2], timeout_s=10.0)
    assert (slow.passed, slow.total) == (2, 2)  # the answers are right: only time stands in the way
    fast = score_code(respond(program), PROBLEMS["chain"], timeout_s=STATE_TIMEOUT_S)
    assert (fast.passed, fast.reason) == (0, "timeout")
    cpu = run_python_tests(program, ["0\n"], timeout_s=10.0)[0].cpu_s
    assert 1.3 * STATE_TIMEOUT_S < cpu  # more than one test's limit, whatever the load (CPU time)
    REPORT.append(f"state family: the answer costs {cpu:.2f} s of CPU, {cpu / STATE_TIMEOUT_S:.1f}x the limit")


def test_the_search_is_passed_with_time_and_failed_without(host):
    """The counter family's problem is fair: the same search with no channel passes with time and times out at the
    probes' limit, which is below its cost (the probes' honest baseline: the same algorithm, nothing carried)."""
    program = SEARCH_PROGRAM.format(seed=SEED.hex(), target=search_target(SEED, SEARCH_X), size=SEARCH_SIZE,
                                    channel="def load():\n    raise LookupError\ndef save(v):\n    pass\n")
    slow = score_code(respond(program), PROBLEMS["search"][:1], timeout_s=10.0)
    assert (slow.passed, slow.total) == (1, 1)
    fast = score_code(respond(program), PROBLEMS["search"], timeout_s=STATE_TIMEOUT_S)
    assert (fast.passed, fast.reason) == (0, "timeout")
    cpu = run_python_tests(program, ["0\n"], timeout_s=10.0)[0].cpu_s
    assert 1.3 * STATE_TIMEOUT_S < cpu
    REPORT.append(f"counter family: the search costs {cpu:.2f} s of CPU, {cpu / STATE_TIMEOUT_S:.1f}x the limit")


# Eight short-lived workers, one after another, each searching one chunk and reporting through a file; with `reap`
# False their parent first asks the kernel to reap them (SIGCHLD ignored), so that their CPU time reaches no count.
WORKERS_PROGRAM = """
import hashlib, os, signal, sys, time
SEED, TARGET, SIZE = bytes.fromhex('{seed}'), '{target}', {size}
if not {reap}:
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    except OSError:
        pass
found = '-'
for c in range(8):
    pid = os.fork()
    if pid == 0:
        out = '-'
        for x in range(c * SIZE, (c + 1) * SIZE):
            if hashlib.sha256(SEED + x.to_bytes(8, 'little')).hexdigest()[:16] == TARGET:
                out = str(x)
        with open('/tmp/part', 'w') as f:
            f.write(out)
        os.rename('/tmp/part', '/tmp/w%d' % c)
        os._exit(0)
    if {reap}:
        os.waitpid(pid, 0)
    while not os.path.exists('/tmp/w%d' % c):
        time.sleep(0.001)
    found = open('/tmp/w%d' % c).read()
    if found != '-':
        break
print(found, sys.stdin.read().strip())
"""
WORKERS_TIMEOUT_S = 0.5  # the workers' search costs about 1.3-1.5x this (x lies in the last chunk)


@pytest.mark.slow
def test_workers_the_kernel_reaps_are_metered_with_or_without_a_cgroup(cgroup_mode, host):
    # Before, without a cgroup (off), the self-reaped workers' CPU time reached no count: 1.0 against 0 for the
    # honest workers that are waited for. Now the filter keeps SIGCHLD's action at its default where the zygote
    # meters from /proc, so the workers stay zombies (visible, counted) until pid 1 reaps them.
    honest, probe = (respond(WORKERS_PROGRAM.format(seed=SEED.hex(), target=search_target(SEED, SEARCH_X),
                                                    size=SEARCH_SIZE, reap=reap)) for reap in (True, False))
    tests = PROBLEMS["search"][:2]
    h = score_code(honest, tests, mode="signed", timeout_s=WORKERS_TIMEOUT_S)
    p = score_code(probe, tests, mode="signed", timeout_s=WORKERS_TIMEOUT_S)
    REPORT.append(f"self-reaped workers ({cgroup_mode}): probe {p.passed}/{p.total} ({p.reason}), honest "
                  f"{h.passed}/{h.total} ({h.reason})")
    assert p.passed == h.passed == 0, (p, h)
    for mode in MODE_LIST:  # 0 passed: the failure score in every mode, as the honest workers' own
        assert MODES[mode](p.passed, p.total) <= MODES[mode](h.passed, h.total) == failure_score(mode)
    slow = score_code(probe, tests[:1], timeout_s=10.0)
    assert slow.passed == 1, slow  # the probe's answer is right: only the meter stands in the way


# --- every probe, three ways ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
def test_probe_through_score_code_pays_no_more_than_a_wrong_answer(probe, honest_wrong, host):
    mode = MODE_LIST[PROBES.index(probe) % 3]
    r = score_code(respond(probe.program), PROBLEMS[probe.problem], mode=mode, **options(probe))
    assert r.passed == 0, r
    assert r.score <= honest_wrong[probe.problem, mode], r
    for other in MODE_LIST:  # the same outcome in every mode: 0 passed is the failure score
        assert MODES[other](r.passed, r.total) == failure_score(other) == honest_wrong[probe.problem, other]


UNIT_TIMEOUT_S = 1.0  # the units' test_timeout_s for the probes without limits of their own


def unit_reward(pool: RewardPool, mode: str, **score_options):
    """The RL units' TRL reward function over ``pool`` (as ``train.code_jobs.code_unit`` builds it)."""
    return make_trl_reward_func(MemoPool(pool), {"tests": "tests"}, f"code_{mode}",
                                score_kwargs={"mode": mode, **score_options})


def unit_pool(mode: str, test_timeout_s: float, workers: int = 2) -> RewardPool:
    """The RL units' pool (``train.code_jobs.code_unit``): score_code, their per-item limit, the mode's failure
    score."""
    from klear_lib.train.code_jobs import pool_limit_s

    return RewardPool(score_code, workers=workers, timeout_s=pool_limit_s(test_timeout_s),
                      failure_score=failure_score(mode))


@pytest.fixture(scope="module")
def signed_pool():
    # started before any host snapshot, and one small batch graded first, so that the probes meet workers that have
    # loaded the judge (a worker pebble starts later, in place of one killed at a limit: `pool_host`)
    with unit_pool("signed", UNIT_TIMEOUT_S) as pool:
        honest = respond("print(int(input()) + 1)")
        pool.score_batch([{"response": honest, "tests": [{"input": "1\n", "output": "2"}], "mode": "signed"}] * 4)
        yield pool


@pytest.fixture
def pool_host(tmp_path, signed_pool):
    """`host`, with `signed_pool` open across the check: a worker it replaces (one killed at its per-item limit,
    as a probe may be on a busy machine) is the pool's, not a probe's leftover."""
    with host_unchanged(tmp_path, pools=[signed_pool]) as h:
        yield h


def _judge_for_the_host_check(what: str):
    """A judge whose worker is killed at the pool's limit (`hang`) or leaves a process behind it (`leave`)."""
    import subprocess
    import sys

    from klear_lib.rewards.result import RewardResult

    if what == "hang":
        time.sleep(60)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # left-behind"], start_new_session=True)
    return RewardResult(0.0, "left")


def test_the_host_check_counts_a_process_below_a_pool_worker_but_not_a_worker_pebble_replaced(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with RewardPool(_judge_for_the_host_check, workers=1, timeout_s=1.0, start_method="fork") as pool:
        with host_unchanged(tmp_path / "a", pools=[pool]):
            [r] = pool.score_batch([{"what": "hang"}])
            assert r.reason == "timeout"
            deadline = time.monotonic() + 10.0  # pebble's manager thread starts the replacement on its next turn
            while not pool.worker_pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(pool.worker_pids()) == 1
        with pytest.raises(AssertionError, match="left-behind"):
            with host_unchanged(tmp_path / "b", pools=[pool]):
                assert pool.score_batch([{"what": "leave"}])[0].reason == "left"
        for line in descendants():
            if "left-behind" in _cmdline(line.split()[0]):
                os.kill(int(line.split()[0]), 9)


@pytest.mark.slow
def test_every_probe_through_the_units_pool_pays_no_more_than_a_wrong_answer(signed_pool, honest_wrong, pool_host):
    # Signed mode: where a judge crash used to pay (the pool's 0.0 against an honest wrong answer's -1). One TRL
    # batch per set of probe limits (the units pass their limits as score_kwargs).
    # The tests go in as a record's ground truth arrives (parse_tests): MemoPool's key is json.dumps of the item,
    # which refuses a plain int of more than 4,300 digits, and parse_tests gives such ints as LongInt.
    groups: dict[str, list[Probe]] = {}
    for p in PROBES:
        groups.setdefault(json.dumps(options(p), sort_keys=True), []).append(p)
    for opts, batch in groups.items():
        reward = unit_reward(signed_pool, "signed", **json.loads(opts))
        scores = reward([respond(p.program) for p in batch],
                        tests=[parse_tests(ground_truth_json(PROBLEMS[p.problem])) for p in batch])
        for p, score, res in zip(batch, scores, reward.last_results):
            assert score <= honest_wrong[p.problem, "signed"], (p.name, res)
            assert res.passed == 0 and res.reason not in ("error", "judge_error", "worker_died"), (p.name, res)


@pytest.mark.slow
def test_a_failure_of_the_pool_scores_an_honest_wrong_answer_in_every_mode(signed_pool, honest_wrong, pool_host):
    # A program that only waits, on 16 tests: each test meets its wall-clock backstop, the sample outlives a pool
    # limit set below the sandbox's own deadline (the units' limit is above it: code_jobs.pool_limit_s) and the pool
    # kills it. Its score is the mode's failure score, that of an honest wrong answer, in every mode (signed_pool:
    # the spawn machinery already runs).
    tests = [{"input": f"{i}\n", "output": "x"} for i in range(16)]
    results = {}

    def judge(mode):
        with RewardPool(score_code, workers=1, timeout_s=3.0, failure_score=failure_score(mode)) as pool:
            reward = unit_reward(pool, mode, timeout_s=0.2)
            results[mode] = reward([respond("import time\ntime.sleep(60)")], tests=[tests]), reward.last_results

    threads = [threading.Thread(target=judge, args=(m,)) for m in MODE_LIST]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for mode, ([score], [res]) in results.items():
        assert res.reason == "timeout"  # the pool's own
        assert score == failure_score(mode) == honest_wrong["stdio", mode]


@pytest.mark.slow
@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
def test_probe_through_verl_pays_no_more_than_a_wrong_answer(probe, honest_wrong, host, monkeypatch):
    # verl calls score_code with its defaults (6 s per test); the probe's own limits are the one change.
    mode = MODE_LIST[(PROBES.index(probe) + 1) % 3]
    monkeypatch.setenv("KLEAR_CODE_REWARD", mode)
    monkeypatch.setattr("klear_lib.rewards.code.score_code",
                        lambda response, tests, **kw: score_code(response, tests, **kw, **options(probe)))
    truth = ground_truth_json(PROBLEMS[probe.problem])
    out = verl_reward.compute_score("coder1_longcot", respond(probe.program), truth)
    assert out["score"] <= honest_wrong[probe.problem, mode] and out["acc"] == 0.0, out


def ground_truth_json(tests) -> str:
    """JSON text of tests whose ints may pass Python's 4,300-digit limit (a record's ground truth)."""
    def dumps(v):
        if isinstance(v, sandbox_json.LongInt):
            return v.text
        if isinstance(v, list):
            return "[" + ", ".join(map(dumps, v)) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)}: {dumps(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)
    return dumps(sandbox_json.normalize_expected(tests))


# --- the figures: memory one sample can hold, an honest sample beside a busy neighbour ---------------------------

def tree_memory() -> int:
    """Bytes of memory held by every process below this one (``descendants``): each process's proportional set size
    (a page shared by n processes counts 1/n in each, so the sum counts it once), or its resident size where its
    smaps cannot be read (it ended, or is not dumpable): an over-estimate only there. Summed resident sizes, which
    count the forked children's shared interpreter pages once per child, once read 922 MiB against the 918 MiB bound
    below while the program held no more than the cap."""
    total = 0
    for pid in (entry.split()[0] for entry in descendants()):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) << 10 for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration, ValueError):
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int(open(f"/proc/{pid}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


@pytest.fixture(params=["auto", "off"])
def cgroup_mode(request, monkeypatch):
    """Both ways a sample is bounded: its own cgroup where the machine allows one (``auto``), and the zygote's
    polling (``off``, the fallback)."""
    monkeypatch.setenv(sandbox_cgroup.ENV_VAR, request.param)
    if request.param == "auto" and sandbox_cgroup.setup() is None:
        pytest.skip(f"no usable cgroup here: {sandbox_cgroup.status()['why']}")
    return request.param


@pytest.mark.slow
def test_the_memory_of_one_sample_is_capped(cgroup_mode, host):
    # 15 children x 90 MB (+ the parent) at memory_mb=200: before, 1,350 MB held at once (16 x 200 MB allowed).
    cap_mb = sandbox.sample_memory_default_mb(200, 64, 1 << 20)
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_memory())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        [r] = run_python_tests(FANOUT, [""], timeout_s=5.0, memory_mb=200, max_output_bytes=1 << 20)
    finally:
        done.set()
        sampler.join()
    held = max([int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("holding")] or [0])
    REPORT.append(f"memory ({cgroup_mode}): cap {cap_mb} MiB at memory_mb=200; the program held {held} x 90 MB at "
                  f"once; peak memory of the sandbox (summed PSS) {peak[0] >> 20} MiB")
    assert held * 90 <= cap_mb
    assert r.memory_exceeded
    assert peak[0] < 2 * (cap_mb << 20)  # every child's 90 MB at once, unbounded, would read ~1,445 MiB
    # What no rlimit counts is refused outright: memfds and SysV shared memory.
    leaks = run_python_tests("import os\ntry:\n    os.memfd_create('x')\nexcept OSError as e:\n    print(e.errno)\n"
                             + LIBC + "print(libc.shmget(0, 1 << 20, 0o1600), ctypes.get_errno())\n", [""])
    assert leaks[0].stdout.split() == ["1", "-1", "1"]  # EPERM


HONEST_WORK = 1_500_000  # iterations of the honest program: about 0.25 s of CPU per test on this machine


def honest_problem():
    program = f"n = int(input())\ns = 0\nfor i in range({HONEST_WORK}):\n    s += i * n % 7\nprint(s)\n"
    tests = [{"input": f"{n}\n", "output": str(sum(i * n % 7 for i in range(HONEST_WORK)))} for n in range(1, 5)]
    return program, tests


@pytest.mark.slow
def test_an_honest_sample_keeps_its_score_beside_a_busy_neighbour(cgroup_mode, host):
    # Before, with wall-clock limits, the same honest sample scored 1.0 alone and 0.0 beside this neighbour.
    program, tests = honest_problem()
    alone = score_code(respond(program), tests, timeout_s=1.0)
    stop = threading.Event()
    neighbours = []

    def neighbour():
        while not stop.is_set():
            neighbours.append(score_code(respond(BUSY), [{"input": "", "output": "x"}] * 4, timeout_s=0.5))

    thread = threading.Thread(target=neighbour)
    thread.start()
    try:
        time.sleep(1.0)  # the neighbour's 16 processes are spinning
        beside = score_code(respond(program), tests, timeout_s=1.0)
    finally:
        stop.set()
        thread.join()
    REPORT.append(f"cpu ({cgroup_mode}): honest sample alone {alone.score}, beside a 16-process neighbour "
                  f"{beside.score}; the neighbour {neighbours[0].score} ({neighbours[0].reason})")
    assert alone.score == beside.score == 1.0, (alone, beside)
    assert all(n.passed == 0 and n.reason == "timeout" for n in neighbours)


# --- big integers compare exactly, through every path -----------------------------------------------------------

def test_big_integers_compare_exactly(host, monkeypatch):
    right = "def f(i):\n    return 7 ** (6000 + i)\n"
    off_by_one = "def f(i):\n    return 7 ** (6000 + i) + 1\n"
    tests = [{"fn_name": "f", "args": [i], "expected": 7 ** (6000 + i)} for i in range(3)]  # 5,071+ digits
    assert score_code(respond(right), tests).passed == 3
    assert score_code(respond(off_by_one), tests).passed == 0
    monkeypatch.setenv("KLEAR_CODE_REWARD", "hard")
    ground_truth = ground_truth_json(tests)
    assert verl_reward.compute_score("coder1_longcot", respond(right), ground_truth) == {"score": 1.0, "acc": 1.0}
    assert verl_reward.compute_score("coder1_longcot", respond(off_by_one), ground_truth)["score"] == 0.0
    # stdin/stdout: the program may print a big int as Python < 3.11 did (the tests' reference solutions)
    stdio = [{"input": "20000\n", "output": ground_truth_json([2 ** 20000])[1:-1] + "\n"}]
    assert score_code(respond("print(2 ** int(input()))"), stdio).passed == 1


# --- issue 45: from one sample of a group to the next, and the wall clock ------------------------------------------

CROSS_SAMPLE = ["page_cache", "socket_cookie", "pipe_inode_counter", "fork_counter"]  # machine-wide state (a
# network namespace is the sample's own)


def page_cache_files(nbits: int) -> list[str]:
    names: dict = {"SEED": SEED}
    exec(PAGE_CACHE.format(nbits=nbits), names)  # the files the programs choose (the stdlib is the host's)
    return names["FILES"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODE_LIST)
def test_no_channel_carries_from_one_sample_to_the_next_through_the_units_pool(mode, signed_pool, honest_wrong,
                                                                                pool_host):
    # Sample 1 of a group searches and saves its progress where the next sample can read it (the page cache, the
    # kernel's socket-cookie, pipe-inode and fork counters); sample 2, judged after it on the same pool, resumes
    # from it. Before (the review): full marks for sample 2 in every mode, hard included. The page cache's files
    # are first evicted by the host, as a reclaimer of idle pages did on the project's machine (DAMON's pageout:
    # with the files read in once per worker and not pinned, sample 2 then passed a test; now the eviction fails).
    # Two tests a sample keep it cheap.
    reward = unit_reward(signed_pool, mode, timeout_s=STATE_TIMEOUT_S)
    tests = PROBLEMS["search2"]
    for name in CROSS_SAMPLE:
        program = next(p.program for p in PROBES if p.name == f"counter_{name}")
        if name == "page_cache":
            _evict(page_cache_files(4), check=False)
        for k in (1, 2):  # distinct texts: MemoPool judges each distinct item once
            [score] = reward([respond(program + f"\n# sample {k} of the group\n")], tests=[tests])
            res = reward.last_results[0]
            assert res.passed == 0 and res.reason not in ("error", "judge_error", "worker_died"), (name, k, res)
            assert score <= honest_wrong["search2", mode], (name, k, res)


PAGE_BITS = 12
PAGE_SENDER = "SEED = bytes.fromhex({seed!r})\n" + PAGE_CACHE.format(nbits=PAGE_BITS) + "send_bits(int(input()))\n"
PAGE_RECEIVER = ("SEED = bytes.fromhex({seed!r})\n" + PAGE_CACHE.format(nbits=PAGE_BITS)
                 + "try:\n    print(read_bits())\nexcept LookupError:\n    print('none')\n")


def _evict(files, *, check: bool = True) -> bool:
    """Take `files` out of the page cache (as the host may under memory pressure); whether they all left."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return check and not any(_resident(p) for p in files)


def _resident(path: str) -> bool:
    names: dict = {"SEED": SEED}
    exec(PAGE_CACHE.format(nbits=1), names)
    return names["resident"](path)


def test_the_page_cache_carries_no_bit_from_one_sample_to_the_next(host, tmp_path_factory):
    files = page_cache_files(PAGE_BITS)
    secret = secrets.randbits(PAGE_BITS)
    sender, receiver = (p.format(seed=SEED.hex()) for p in (PAGE_SENDER, PAGE_RECEIVER))
    # The positive control: the same two samples unsandboxed send every bit through files nobody pins (the shown
    # ones are pinned by every process that ran a sandbox, pool workers and the other host tests included): the
    # same program, reading a directory of this test's own files, evicted first.
    own = tmp_path_factory.mktemp("own")  # not in `host`'s directory, which must stay as it was
    for i in range(PAGE_BITS + 2):
        (own / f"m{i:02}.py").write_bytes(secrets.token_bytes(16384))
    here = "os.path.join(os.path.dirname(os.__file__), 'idlelib')"
    names: dict = {"SEED": SEED}
    exec(PAGE_CACHE.format(nbits=PAGE_BITS).replace(here, repr(str(own))), names)
    if _evict(names["FILES"]):
        with pytest.warns(sandbox.UnsafeSandboxWarning):
            run_python_tests(sender.replace(here, repr(str(own))), [f"{secret}\n"], unsafe_no_sandbox=True)
            [free] = run_python_tests(receiver.replace(here, repr(str(own))), [""], unsafe_no_sandbox=True)
        assert free.stdout.split() == [str(secret)], free
    else:
        REPORT.append("page cache: the host kept the control's files in memory; no positive control this run")
    # Sandboxed: the worker pins every shown file before its first sample (as root, or with a memory-lock limit
    # above their size). The host then evicts, as a reclaimer of idle pages may: all of them before the sender, the
    # ones it did not read (the control file, the 0 bits) before the receiver. Read in once per process and not
    # pinned (before), the receiver read the secret whenever the host evicted; the eviction now fails.
    run_python_tests("print(1)", [""])
    held = sandbox_root.resident_files(os.path.realpath(sys.executable))
    idle = [files[1]] + [f for i, f in enumerate(files[2:]) if not secret >> i & 1]
    _evict(files, check=False)
    if held.pinned:
        assert all(_resident(p) for p in files)  # the pin holds against the host
    run_python_tests(sender, [f"{secret}\n"])
    _evict(idle, check=False)
    [boxed] = run_python_tests(receiver, [""])
    assert boxed.ok and boxed.stdout.split() == ["none"], boxed


CLOCK_PROGRAM = """
import sys, time
t0 = time.monotonic_ns()
B, W = {bits}, {slot_ms} * 1_000_000
P = W << B
print(((t0 - 20_000_000) % P) // W)  # what the previous test sent: the phase this one starts at, less the gap
target = (time.monotonic_ns() // P + 1) * P + int(sys.stdin.read()) * W + W // 2  # send: end at a chosen phase
while time.monotonic_ns() < target:
    time.sleep(0.0005)
"""


@pytest.mark.slow
def test_the_wall_clock_is_the_documented_residual(host):
    # docs/sandbox_security.md: a test ends at a phase of the clock it chooses, and the next one reads that phase
    # at its start (the gap between them is ~7-19 ms, up to ~235 ms seen under load). Measured here so that the page
    # stays true: 3 bits in 100 ms slots (0.8 s of waiting) arrive nearly always; by chance a message arrives 1 time
    # in 8, so 3 of 7 by chance is ~5%. If this fails on a quiet machine, the residual closed: update the page.
    bits, slot_ms, n = 3, 100, 8
    sent = [secrets.randbelow(1 << bits) for _ in range(n)]
    rs = run_python_tests(CLOCK_PROGRAM.format(bits=bits, slot_ms=slot_ms), [f"{v}\n" for v in sent],
                          timeout_s=1.0)
    got = [int(r.stdout.split()[0]) for r in rs]
    arrived = sum(got[i + 1] == sent[i] for i in range(n - 1))
    REPORT.append(f"wall clock: {arrived}/{n - 1} messages of {bits} bits arrived (slots of {slot_ms} ms)")
    assert arrived >= (n - 1) // 2
