"""The sandbox's filesystem: a minimal root holding the interpreter and what it loads, read-only, and nothing else.

bwrap starts from an empty tmpfs root; `root_argv` lists what to put in it. Everything comes from asking the
interpreter itself, once per interpreter and process (`interpreter_files`): it imports every extension module
of its own standard library but those of use only over a socket (`NOT_SHOWN`: tkinter's X11 client, nis) and
reports what it then has mapped (`/proc/self/maps`: libpython, libc, libssl, libffi, locale data, ...), its stdlib
directories, and its site-packages. The root then holds:

    the interpreter binary                  read-only, at its host path (its RUNPATH and prefix search need that)
    each file it maps                       read-only, file by file with the loader's symlinks to it (libz.so.1
                                            -> ...), plus libgcc_s beside libc (glibc dlopens it); a small
                                            directory (a locale's: `SMALL_DIR_FILES`, `SMALL_DIR_BYTES`) whole
    the stdlib directories                  read-only; site-packages, test and config-* hidden (empty tmpfs)
    the ELF interpreter (ld-linux) path     with every symlink on the way (/lib64 -> usr/lib64 -> /lib/...)
    /etc/ld.so.cache                        how the loader finds a library by name
    parent directories                      created empty, mode 0755, so the dropped uid can walk to the binds

Symlinks on the way to any of these are recreated as symlinks, so a path resolves inside as it does on the host
(/lib -> usr/lib on merged-/usr systems). Host directories that hold none of it (/home, /root's other contents,
/etc, /var, /run and its sockets, the repository, datasets) do not exist inside. The caller adds /tmp,
/dev and /proc (see `sandbox._bwrap_argv`).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import mmap
import os
import resource
import stat
import struct
import subprocess
import time
import warnings
from dataclasses import dataclass, field

# Run by the interpreter being sandboxed (stdlib only, no site): load every extension module it ships, then say
# what is mapped. The JSON is the last line, in case a module prints something while loading.
_PROBE = r"""
import json, os, sys, sysconfig
SKIPPED = set(sys.argv[1:])
dynload = [p for p in sys.path if os.path.basename(p) == "lib-dynload"]
for d in dynload:
    for name in sorted(os.listdir(d)):
        if name.endswith(".so") and name.split(".")[0] not in SKIPPED:
            try:
                __import__(name.split(".")[0])
            except BaseException:
                pass
files = set()
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            files.add(parts[5].rstrip("\n"))
paths = sysconfig.get_paths()
print()
print(json.dumps({"executable": os.path.realpath(sys.executable), "files": sorted(files),
                  "stdlib": [paths["stdlib"], paths["platstdlib"]], "site": [paths["purelib"], paths["platlib"]]}))
"""

# Extension modules whose libraries are not shown: each is of use only over a socket, and the program may open
# none (`seccomp.build_program_filter`). _tkinter talks to an X server (17 libraries: Tk, Tcl, X11, fonts, ...),
# nis to a NIS server (9: Sun RPC, Kerberos, ...). Importing either inside fails with ImportError; fewer files to
# bind (bwrap's mount set-up, ~0.2 ms a file, every sample) and to keep in the page cache.
NOT_SHOWN = ("_tkinter", "nis")
LOADER_CACHE = "/etc/ld.so.cache"
ON_DEMAND = ("libgcc_s.so.1",)  # libraries glibc dlopens later, beside libc
# stdlib directories no program needs, hidden like site-packages: the regression tests (123 MB here) and, by
# prefix, config-* (the static libpython and its Makefile, 44 MB); less to keep in the page cache
HIDDEN_STDLIB = ("test",)
SMALL_DIR_FILES, SMALL_DIR_BYTES = 64, 4 << 20  # a mapped file's directory shown whole below this


@dataclass(frozen=True)
class InterpreterFiles:
    """What an interpreter needs at run time, as host paths."""

    executable: str
    elf_interpreter: str | None  # PT_INTERP of the binary, as written there (e.g. /lib64/ld-linux-x86-64.so.2)
    directories: tuple[str, ...]  # real paths, none inside another
    files: tuple[str, ...]  # real paths of single files to bind (the binary, the loader cache)
    hidden: tuple[str, ...]  # site-packages directories inside `directories`, shown empty


@functools.lru_cache(maxsize=8)
def interpreter_files(python: str) -> InterpreterFiles:
    """Ask `python` (a real path) what it loads; cached per process."""
    out = subprocess.run([python, "-I", "-S", "-c", _PROBE, *NOT_SHOWN], capture_output=True, text=True, env={},
                         timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"could not list what {python} loads (exit status {out.returncode}): "
                           f"{out.stderr.strip()[-500:]}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    executable = info["executable"]
    dirs = {os.path.realpath(d) for d in info["stdlib"] if os.path.isdir(d)}
    mapped = set()
    for f in info["files"]:
        real = os.path.realpath(f)
        if real != executable and os.path.isfile(real) and not real.startswith(("/proc/", "/dev/", "/tmp/")):
            mapped.add(real)
    for d in {os.path.dirname(f) for f in mapped}:  # dlopened on demand (pthread_exit, thread cancellation)
        mapped |= {os.path.realpath(os.path.join(d, n)) for n in ON_DEMAND if os.path.isfile(os.path.join(d, n))}
    for d in {os.path.dirname(f) for f in mapped}:
        if not any(is_under(d, k) for k in dirs) and _small(d):
            dirs.add(d)  # a locale's directory: shown whole (a library directory: only what is mapped from it)
    directories = _outermost(dirs)
    files = [executable, *sorted(mapped)] + ([os.path.realpath(LOADER_CACHE)] if os.path.isfile(LOADER_CACHE) else [])
    files = [f for f in files if not any(is_under(f, d) for d in directories)]
    hidden = sorted({os.path.realpath(s) for s in info["site"] if os.path.isdir(s)
                     and any(is_under(os.path.realpath(s), d) for d in directories)})
    hidden += sorted(os.path.join(d, n) for d in map(os.path.realpath, info["stdlib"]) if os.path.isdir(d)
                     for n in os.listdir(d) if n in HIDDEN_STDLIB or n.startswith("config-")
                     if os.path.isdir(os.path.join(d, n)))
    return InterpreterFiles(executable, elf_interpreter(executable), directories, tuple(files),
                            tuple(sorted(set(hidden))))


def _small(d: str) -> bool:
    """Whether directory `d` holds at most `SMALL_DIR_FILES` files of at most `SMALL_DIR_BYTES` in all."""
    n = size = 0
    for top, _, names in os.walk(d):
        for name in names:
            n += 1
            try:
                size += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
            if n > SMALL_DIR_FILES or size > SMALL_DIR_BYTES:
                return False
    return True


PAGE = mmap.PAGESIZE


@dataclass
class ResidentFiles:
    """Every file the sandbox shows for one interpreter, mapped into this process and, where the kernel allows it,
    locked in memory (`mlock`): a locked page stays in the page cache whatever the host does (memory pressure, a
    proactive reclaimer such as DAMON's pageout, which ran on the project's machine and took pages out between
    samples: a sample's reads were then visible to the next one). `pinned`: all of them locked; otherwise `why`,
    and `refresh` reads back, before each sample, whatever the host took out."""
    files: int
    bytes: int
    seconds: float
    pinned: bool
    why: str = ""
    maps: list = field(default_factory=list, repr=False)  # (address, length) of each mapping, kept for life

    def refresh(self) -> int:
        """Read back every page of a shown file that is no longer resident (only when not `pinned`); how many."""
        if self.pinned:
            return 0
        libc = _libc()
        vec = ctypes.create_string_buffer(1 << 16)
        back = 0
        for addr, length in self.maps:
            pages = -(-length // PAGE)
            for first in range(0, pages, len(vec)):
                n = min(len(vec), pages - first)
                if libc.mincore(addr + first * PAGE, min(length - first * PAGE, n * PAGE), vec) != 0:
                    continue
                for i, b in enumerate(vec.raw[:n]):
                    if not b & 1:
                        ctypes.string_at(addr + (first + i) * PAGE, 1)  # the fault reads the page back in
                        back += 1
        return back

    def release(self) -> None:
        """Unmap every file (which unlocks it); the pages stay cached until the kernel wants the memory. For tests,
        and for a process done with the sandbox (then also `resident_files.cache_clear()`)."""
        libc = _libc()
        for addr, length in self.maps:
            libc.munmap(addr, length)
        self.maps.clear()
        self.pinned = False


@functools.lru_cache(maxsize=1)
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mlock.argtypes = libc.munlock.argtypes = libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def _shown_paths(python: str) -> list[str]:
    info = interpreter_files(python)
    paths = list(info.files) + ([info.elf_interpreter] if info.elf_interpreter else [])
    for d in info.directories:
        for top, subdirs, names in os.walk(d):
            subdirs[:] = [s for s in subdirs if os.path.join(top, s) not in info.hidden]
            paths += [os.path.join(top, n) for n in names]
    return paths


def map_files(paths, *, lock: bool = True) -> ResidentFiles:
    """Map each regular, non-empty file of `paths` read-only and shared, and with `lock` lock it in memory (all or
    none: the first refusal unlocks what was locked, after one try at raising RLIMIT_MEMLOCK's soft limit to its
    hard one); what was not locked is read in (`ResidentFiles.refresh`). Unreadable paths and symlinks are
    skipped (a symlink's target is listed in its own right)."""
    libc = _libc()
    t0 = time.perf_counter()
    out = ResidentFiles(0, 0, 0.0, pinned=lock, why="" if lock else "not asked to lock")
    failed = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                continue
            addr = libc.mmap(None, st.st_size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)
        if addr in (None, ctypes.c_void_p(-1).value):
            continue
        out.maps.append((addr, st.st_size))
        out.files += 1
        out.bytes += st.st_size
        if lock and not failed and libc.mlock(addr, st.st_size) != 0:
            failed = ctypes.get_errno() or errno.ENOMEM
            soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            if soft != hard:  # as far as we may, then once more
                resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
                failed = 0 if libc.mlock(addr, st.st_size) == 0 else ctypes.get_errno() or errno.ENOMEM
    if failed:
        for addr, length in out.maps:
            libc.munlock(addr, length)
        limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
        out.pinned = False
        out.why = (f"mlock refused ({errno.errorcode.get(failed, failed)}; RLIMIT_MEMLOCK "
                   f"{'unlimited' if limit == resource.RLIM_INFINITY else f'{limit >> 20} MiB'}, the files need "
                   f"{-(-out.bytes >> 20)} MiB)")
    out.refresh()  # what is not resident yet, read in (nothing when pinned: mlock faulted every page in)
    out.seconds = time.perf_counter() - t0
    return out


@functools.lru_cache(maxsize=8)
def resident_files(python: str) -> ResidentFiles:
    """Every file the sandbox shows for `python` (a real path), mapped and locked in memory once per process (a
    pool worker does it before its first sample): whether a page is resident then says nothing a program did, in
    this sample or an earlier one, whatever the host evicts. The program cannot take pages out either (its
    seccomp filter refuses fadvise, madvise's COLD and PAGEOUT, preadv2's flags: `seccomp`). Where locking is
    refused (a user without CAP_IPC_LOCK whose `ulimit -l` is below the files' size, about 120 MB), the files
    stay mapped, `UnpinnedPageCacheWarning` says so once, and each sample starts with `refresh`: what the host
    evicts during a sample can then still carry bits from one of its tests to the next."""
    out = map_files(_shown_paths(python))
    if not out.pinned:
        warnings.warn(f"the sandbox could not pin the {out.files} files it shows in the page cache: {out.why}. "
                      f"Each sample now reads back what the host evicted before it starts, but a page the host "
                      f"evicts during a sample can carry bits from one of its tests to the next. Run as root, or "
                      f"raise the memory-lock limit (`ulimit -l` of at least {(out.bytes >> 20) + 16} MiB; memlock "
                      f"in /etc/security/limits.conf).", UnpinnedPageCacheWarning, stacklevel=2)
    return out


class UnpinnedPageCacheWarning(RuntimeWarning):
    """The files the sandbox shows could not be locked in the page cache (`resident_files`)."""


@functools.lru_cache(maxsize=8)
def root_argv(python: str) -> tuple[str, ...]:
    """bwrap arguments that build the minimal root for `python` (a real path), cached per process. Order matters
    to bwrap: parent directories first, then binds, then symlinks, then the hidden site-packages."""
    info = interpreter_files(python)
    binds = [*info.directories, *info.files]
    links: dict[str, str] = {}
    wanted = [*binds, LOADER_CACHE] + ([info.elf_interpreter] if info.elf_interpreter else [])
    for path in wanted:
        real = _resolve(path, links)
        if real is not None and not any(is_under(real, b) for b in binds):
            binds.append(real)  # the loader itself, when it lives outside every bound directory
    bound = set(info.files)
    for d in sorted({os.path.dirname(f) for f in info.files}):  # the names the loader asks for: libz.so.1 -> ...
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if ".so." in e.name and e.is_symlink() and os.path.realpath(e.path) in bound:  # no dev links (.so)
                links[e.path] = os.readlink(e.path)
    links = {link: target for link, target in links.items() if not any(is_under(link, b) for b in binds)}
    parents = sorted({p for path in [*binds, *links] for p in _ancestors(path)} - {"/"})
    parents = [p for p in parents if not any(is_under(p, b) for b in binds)]
    argv: list[str] = []
    for d in parents:
        argv += ["--perms", "0755", "--dir", d]
    for b in sorted(binds):
        argv += ["--ro-bind", b, b]
    for link, target in sorted(links.items()):
        argv += ["--symlink", target, link]
    for h in info.hidden:
        argv += ["--perms", "0555", "--size", "4096", "--tmpfs", h, "--remount-ro", h]
    return tuple(argv)


def elf_interpreter(binary: str) -> str | None:
    """The PT_INTERP path of a 64-bit little-endian ELF binary (None for a static one, or any other format)."""
    with open(binary, "rb") as f:
        head = f.read(64)
        if head[:6] != b"\x7fELF\x02\x01":  # 64-bit, little-endian
            return None
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(phnum):
            p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if p_type == 3:  # PT_INTERP
                f.seek(p_offset)
                return f.read(p_filesz).rstrip(b"\0").decode()
    return None


def _resolve(path: str, links: dict[str, str], depth: int = 0) -> str | None:
    """The real path of `path`, recording in `links` every symlink met on the way (link path -> target text);
    None if it does not exist."""
    if depth > 40:
        return None
    parts = [p for p in path.split("/") if p]
    cur = "/"
    for i, part in enumerate(parts):
        nxt = os.path.join(cur, part)
        if os.path.islink(nxt):
            target = os.readlink(nxt)
            links[nxt] = target
            rest = "/".join(parts[i + 1:])
            joined = os.path.normpath(os.path.join(cur, target, rest) if rest else os.path.join(cur, target))
            return _resolve(joined, links, depth + 1)
        if not os.path.exists(nxt):
            return None
        cur = nxt
    return cur


def _ancestors(path: str) -> list[str]:
    out, cur = [], os.path.dirname(path)
    while cur not in ("/", ""):
        out.append(cur)
        cur = os.path.dirname(cur)
    return out


def _outermost(dirs) -> tuple[str, ...]:
    kept: list[str] = []
    for d in sorted(dirs):  # sorted: a parent comes before its children
        if not any(is_under(d, k) for k in kept):
            kept.append(d)
    return tuple(kept)


def is_under(path: str, d: str) -> bool:
    return path == d or path.startswith(d.rstrip("/") + "/")
