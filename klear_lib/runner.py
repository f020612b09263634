"""Running a notebook headless: papermill into a fresh run directory, with its record (``params.json``), its
``status.json`` when it is interrupted or fails, a full disk as one line, resume, and the report.

Ctrl-C marks the run ``interrupted`` (``status.json``) and interrupts the kernel's cell; a failed or dead kernel is
recorded there with its cause and the last cell. A full disk is one line too (what failed, the free space, the
``--resume`` command), and a run does not start with less than ``runs.min_free_mb()`` free. Every file written
here is written whole or not at all (``runs.write_atomic``), papermill's ``notebook.ipynb`` included. The kernel and
the units' workers get ``KLEAR_RUN_OWNER`` (this process): they end, and record nothing more, when it dies by any
signal.

Parameters come from ``klear_lib.presets``; ``klear_lib.cli`` is the command line over this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from klear_lib import runs
from klear_lib.presets import (
    RUN_DIR_PARAM,
    KlearError,
    check_types,
    dry_run_config,
    list_notebooks,
    load_params_with_sources,
    notebook_parameters,
    resolve_notebook,
    resolved_workers,
    validate_params,
)

KERNEL_NAME = "python3"
WORKERS_RESOLVED = "workers_resolved"  # params.json: {"workers": 2} for `workers: auto` on 2 cores (presets.AUTO)
REPORT_PREFIX = "00_"  # notebooks named 00_* gather the others' runs: reproduce runs them last, as the report
REPRODUCE_LOG = "reproduce.json"


class NotebookFailed(Exception):
    """A notebook raised while papermill executed it; the partially executed copy is at `output`."""

    def __init__(self, name: str, output: pathlib.Path, cause: BaseException, cell: int | None = None):
        self.name, self.output, self.cause = name, output, cause
        detail = getattr(cause, "evalue", None) or str(cause)
        ename = getattr(cause, "ename", None) or type(cause).__name__
        cell = getattr(cause, "exec_count", None) or cell  # In [N]: report.cell_number, as status.json has it
        where = f" in cell [{cell}]" if cell is not None else ""
        super().__init__(
            f"{name} failed{where}: {ename}: {detail}\n  partially executed notebook: {output}"
        )


@dataclasses.dataclass(frozen=True)
class Layout:
    """The folders klear reads and writes; every one can be overridden on the command line."""

    repo_root: pathlib.Path  # papermill runs notebooks here, so their relative paths resolve
    notebooks_dir: pathlib.Path
    params_dir: pathlib.Path
    output_root: pathlib.Path


def require_notebooks(layout: "Layout") -> None:
    """KlearError unless the notebooks folder exists (klear run outside a checkout, without --repo-root)."""
    if not layout.notebooks_dir.is_dir():
        raise KlearError(f"no notebooks folder at {layout.notebooks_dir}: run klear inside a klear checkout, or pass "
                         "--repo-root (or --notebooks-dir and --params-dir)")


def resolve(spec: str, preset: str, overrides: Sequence[str], layout: Layout, *, dry_run: bool = False):
    notebook = resolve_notebook(spec, layout.notebooks_dir)
    name = notebook.stem
    params, sources = load_params_with_sources(name, preset, overrides, layout.params_dir)
    declared = notebook_parameters(notebook)
    validate_params(params, declared, notebook=name, sources=sources)
    params = check_types(params, declared, notebook=name, sources=sources)
    if dry_run:
        dry_run_config(notebook, params)
    return notebook, name, params



def _warn_if_foreign_kernel() -> None:
    """papermill starts the `python3` kernel; warn if its spec launches another interpreter than this one."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        argv0 = KernelSpecManager().get_kernel_spec(KERNEL_NAME).argv[0]
    except Exception:  # noqa: BLE001 (papermill reports a missing kernel itself)
        return
    # jupyter_client replaces a bare "python"/"python3" with sys.executable.
    if os.path.isabs(argv0) and os.path.realpath(argv0) != os.path.realpath(sys.executable):
        print(
            f"klear: warning: the {KERNEL_NAME!r} kernel runs {argv0}, not {sys.executable}; "
            f"run `{sys.executable} -m ipykernel install --sys-prefix` to use this environment",
            file=sys.stderr,
        )


def quiet_kernel_manager():
    """jupyter_client's kernel manager with two lines less on every run's terminal: the kernel talks over IPC sockets,
    not TCP, so ipykernel does not warn that it runs "over TCP without encryption"; and shutting the kernel down does
    not interrupt it first (jupyter_client sends SIGINT before every shutdown request, which ipykernel logs as
    "KeyboardInterrupt caught in kernel" after a run that went well). A Ctrl-C of ``klear run`` still interrupts the
    kernel: it reaches the whole process group.

    The sockets get a name of their own in Jupyter's runtime folder (``ipc_prefix``). jupyter_client's default, when
    the manager is made before its connection file is named (as papermill makes it), is ``kernel-ipc-<n>`` in the
    working directory, the lowest ``n`` whose file does not exist yet: two kernels started at once from one folder
    (two ``klear run`` in one checkout, the tests' two workers) took the same sockets, each refused the other's
    messages ("Invalid Signature") and both runs failed after 60 s (2026-12-05)."""
    from jupyter_client.manager import KernelManager
    from traitlets import CaselessStrEnum

    class QuietKernelManager(KernelManager):
        transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

        def _ip_default(self) -> str:
            return ipc_prefix() if self.transport == "ipc" else super()._ip_default()

        async def _async_interrupt_kernel(self) -> None:
            if self.shutting_down:  # set by shutdown_kernel just before its interrupt
                return
            await super()._async_interrupt_kernel()

    return QuietKernelManager


def ipc_prefix() -> str:
    """A path no other kernel uses, for a kernel's IPC sockets (``<prefix>-<n>``): in Jupyter's runtime folder,
    else the temporary folder where that cannot be made (a read-only home)."""
    import tempfile
    import uuid

    from jupyter_core.paths import jupyter_runtime_dir

    name = f"klear-{uuid.uuid4().hex[:16]}-ipc"
    folder = pathlib.Path(jupyter_runtime_dir())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK) and len(str(folder / name)) < 90:  # a socket path holds at most 107 bytes
            return str(folder / name)
    except OSError:
        pass
    return str(pathlib.Path(tempfile.gettempdir()) / name)


class RunInterrupted(Exception):
    """Ctrl-C during `klear run`: the run directory is marked interrupted (``status.json``)."""

    def __init__(self, run_dir: pathlib.Path):
        self.run_dir = run_dir
        super().__init__(f"interrupted; the partial run is in {run_dir} (continue it: klear run --resume {run_dir})")


def _oom_kills() -> int | None:
    """The cgroup's count of processes the kernel killed for want of memory (cgroup v2), or None."""
    try:
        for line in pathlib.Path("/sys/fs/cgroup/memory.events").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _last_cell(output: pathlib.Path) -> dict:
    """The cell papermill was executing (or that failed) in a partially executed notebook: its number (``In [N]``,
    ``report.cell_number``: the one numbering of the CLI, ``status.json`` and the report) and first line."""
    try:
        import nbformat

        nb = nbformat.read(str(output), as_version=4)
    except Exception:  # noqa: BLE001 (a notebook papermill never wrote)
        return {}
    from klear_lib.report import cell_number

    for pos, cell in enumerate(nb.cells):
        state = ((cell.get("metadata") or {}).get("papermill") or {}).get("status")
        if state in ("running", "failed"):
            first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
            return {"cell": cell_number(nb.cells, pos), "cell_source": first[:120], "cell_status": state}
    return {}


def _write_status(run_dir: pathlib.Path, status: dict) -> bool:
    """Write ``status.json`` whole or not at all; False (nothing written) when the disk is full or unwritable:
    the line klear prints says what happened either way."""
    try:
        runs.write_atomic(run_dir / runs.STATUS_FILE,
                          runs.to_json_text({**status, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2) + "\n")
    except OSError:
        return False
    return True


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its children that have ended and been waited for: the
    kernel, once papermill has shut it down, with what it waited for, and what ``_adopting_descendants`` reaped.
    The difference across a run is the run's CPU time; wall-clock alone hides whether a slow run waited or
    worked."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _children() -> set[int] | None:
    """This process's child pids (Linux ``/proc/self/task/*/children``); None where the kernel does not say."""
    try:
        return {int(pid) for task in pathlib.Path("/proc/self/task").iterdir()
                for pid in (task / "children").read_text().split()}
    except (OSError, ValueError):
        return None


def _subreaper(on: bool) -> bool:
    """Linux ``prctl(PR_SET_CHILD_SUBREAPER)``: a descendant orphaned while it is set is reparented to this process
    instead of init. False where it cannot be set."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def _adopting_descendants(wait_s: float = 3.0):
    """Count the CPU time of every process the run started. The units of work run in worker processes that
    multiprocessing's forkserver forks (``klear_lib.experiment``): the forkserver waits for them, so their time is
    in its children's usage, but it outlives the kernel by a moment, and an orphan's usage is lost to this process's
    ``getrusage(RUSAGE_CHILDREN)`` (a 30-minute run of 06 recorded 9 s of CPU). While the notebook runs, this
    process is their subreaper; afterwards it waits up to ``wait_s`` for the processes that came to it, so their
    time (and what they waited for) is counted. Where Linux offers neither, the CPU time is the kernel's alone."""
    before = _children()
    adopted = before is not None and _subreaper(True)
    try:
        yield
    finally:
        if adopted:
            _subreaper(False)
            deadline = time.monotonic() + wait_s
            while (left := (_children() or set()) - before) and time.monotonic() < deadline:
                for pid in left:
                    with contextlib.suppress(ChildProcessError):  # reaped elsewhere (the kernel's own Popen)
                        os.waitpid(pid, os.WNOHANG)
                time.sleep(0.05)


def _finish_record(run_dir: pathlib.Path, clock: float, cpu: float) -> None:
    """Add the end time, the seconds and the CPU seconds to params.json (the report shows every run's time and sums
    them in its card). A resumed run adds what it took before; a run first made before CPU time was recorded gets
    none (its earlier part is not known)."""
    path = run_dir / runs.PARAMS_FILE
    try:
        import json

        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    record["seconds"] = round(record.get("seconds_before", 0.0) + time.monotonic() - clock, 1)
    if record.get("cpu_seconds_before", 0.0) is not None:
        record["cpu_seconds"] = round(record.get("cpu_seconds_before", 0.0) + _cpu_seconds() - cpu, 1)
    try:
        runs.write_atomic(path, runs.to_json_text(record, indent=2) + "\n")
    except OSError:  # a full disk: the record stays as it was at the start (the run's time is not known)
        pass


class DiskFull(NotebookFailed):
    """The disk (or the quota) filled up during ``klear run``: one line saying what failed, the free space, and
    the command that continues the run once there is space (every unit and run-level file written before is
    whole: units are not redone)."""

    def __init__(self, name: str, run_dir: pathlib.Path, cause: BaseException, what: str, *, resumable: bool):
        super().__init__(name, run_dir / runs.NOTEBOOK_FILE, cause)
        then = (f"free some space, then continue the run: klear run --resume {run_dir}" if resumable else
                "nothing ran; free some space and run it again")
        self.line = f"{name}: the disk is full ({what}); {runs.describe_free(run_dir)}; {then}"
        Exception.__init__(self, self.line)

    def __str__(self) -> str:
        return self.line


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FULL_PATH = re.compile(r"(?:No space left on device|Disk quota exceeded): '([^']+)'")


def _disk_full_what(err: BaseException) -> str | None:
    """What the full disk broke, from papermill's error (a cell raised: its text and traceback) or from an OSError
    in this process; None when `err` is not about a full disk."""
    text = _ANSI.sub("", "\n".join([str(getattr(err, "evalue", "") or ""), *(getattr(err, "traceback", None) or []),
                                     str(err)]))
    if not (runs.is_disk_full(err) or runs.is_disk_full(text)):
        return None
    cell = getattr(err, "exec_count", None)
    found = _FULL_PATH.search(text)
    where = f"writing {found.group(1)}" if found else (
        f"writing {err.filename}" if isinstance(err, OSError) and err.filename else "a write failed")
    if cell is not None:
        where += f" in cell [{cell}], {getattr(err, 'ename', None) or type(err).__name__}"
    return where


def _check_free_space(path: pathlib.Path) -> None:
    """KlearError (one line) when the filesystem of `path` has less than ``runs.min_free_mb()`` free."""
    try:
        need = runs.min_free_mb()
    except ValueError as err:
        raise KlearError(str(err)) from None
    free = runs.free_bytes(path)
    if free is not None and free < need * 1e6:
        raise KlearError(f"only {free / 1e6:.1f} MB free on {path}; klear run needs {need:g} MB to start "
                         f"({runs.MIN_FREE_ENV} sets the minimum)")


_ATOMIC_PREFIXES: set[str] = set()


def _write_notebook_atomically(run_dir: pathlib.Path) -> None:
    """papermill rewrites the executed notebook after every cell with a plain ``open(path, "w")``: a full disk
    left it cut mid-string. Its writes under ``run_dir`` go through ``runs.write_atomic`` instead (a papermill
    I/O handler for that path prefix; no fsync, the notebook is rewritten often)."""
    import papermill.iorw as iorw

    prefix = f"{run_dir}{os.sep}"
    if prefix in _ATOMIC_PREFIXES:
        return

    class AtomicLocalHandler(iorw.LocalHandler):
        def write(self, buf, path):
            runs.write_atomic(path, buf, fsync=False)

    iorw.papermill_io.register(prefix, AtomicLocalHandler())
    _ATOMIC_PREFIXES.add(prefix)


@contextlib.contextmanager
def _interrupting_the_kernel():
    """Ctrl-C (SIGINT) of this process reaches the kernel too, as Jupyter's interrupt does: the kernel runs in a
    session of its own (jupyter_client), out of the terminal's reach, and after a Ctrl-C papermill waited for the
    running cell to end before it shut the kernel down (a cell of units: minutes, 2026-12-07). Each child that leads
    its own process group (the kernel) gets SIGINT, then this process raises KeyboardInterrupt as before. Nothing
    changes where SIGINT is ignored (a background job) or outside the main thread."""
    import signal
    import threading

    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        yield
        return

    def interrupt(signum, frame):
        for pid in _children() or ():
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGINT)
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _owning_the_run():
    """``KLEAR_RUN_OWNER`` = this process, for the kernel and its unit workers (``klear_lib.experiment``): they
    end, and record nothing more, when this process dies by any signal."""
    from klear_lib import experiment

    before = os.environ.get(experiment.OWNER_ENV)
    os.environ[experiment.OWNER_ENV] = experiment.process_identity()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(experiment.OWNER_ENV, None)
        else:
            os.environ[experiment.OWNER_ENV] = before


LOCK_FILE = ".klear-run.lock"  # held (flock) by the one process running a run directory; holds its pid


@contextlib.contextmanager
def own_run_dir(run_dir: pathlib.Path):
    """Make ``run_dir`` this process's for the block: an exclusive ``flock`` on ``<run_dir>/.klear-run.lock``, which
    the kernel frees when the process ends however it ends. A second ``klear run --resume`` of the same folder is
    refused (KlearError naming the owner's pid) before it reads or writes anything there, so only the owner ever
    writes ``status.json`` and ``params.json`` (two resumes at once left a finished run marked ``failed``). A folder
    that cannot be written is one line with its path."""
    import fcntl

    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise KlearError(f"cannot write in {run_dir}: {err.strerror or err}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise KlearError(f"{run_dir} is being run by another process (pid {holder}): wait for it to end, or stop "
                             f"it, then resume: klear run --resume {run_dir}") from None
        with contextlib.suppress(OSError):  # the pid is for the message only: a full disk does not stop the run here
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def run_notebook(
    spec: str | None,
    preset: str,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    layout: Layout,
    progress_bar: bool = True,
    resume: str | os.PathLike | None = None,
    executor: str | None = None,
    ray_address: str | None = None,
    dry_run: bool = True,
) -> pathlib.Path:
    """Execute a notebook with a preset into a new run directory and return it; NotebookFailed if it raised
    (DiskFull, one line, when the disk filled up), RunInterrupted on Ctrl-C. ``resume``: run again into that run
    directory, with the notebook, preset and parameters its ``params.json`` recorded (``spec``, ``preset`` and
    ``overrides`` must not be given); the units of work it finished are not redone (``klear_lib.experiment``).
    Refused (KlearError) with less than ``runs.min_free_mb()`` free on the output root, and while another process
    runs the same run directory (``own_run_dir``). ``executor`` (``local``, ``ray``) and ``ray_address`` reach the
    kernel's units as ``KLEAR_EXECUTOR``/``KLEAR_RAY_ADDRESS`` (``klear_lib.experiment.run_jobs``). ``dry_run``
    False: the notebook's config cells are not run first (``klear reproduce`` ran them all in one process)."""
    owner = contextlib.ExitStack()
    if resume is not None:
        _check_free_space(pathlib.Path(resume))
        owner.enter_context(own_run_dir(pathlib.Path(resume).resolve()))  # before anything in it is touched
        run_dir, notebook, name, params, record = _resume_record(pathlib.Path(resume), layout)
        preset = record.get("preset", preset)
    else:
        notebook, name, params = resolve(spec, preset, overrides, layout, dry_run=dry_run)
        _check_free_space(layout.output_root)
        try:
            run_dir = runs.create_run_dir(layout.output_root, name).resolve()
        except OSError as err:
            raise KlearError(f"cannot create a run directory under {layout.output_root}: "
                             f"{err.strerror or err}") from None
        owner.enter_context(own_run_dir(run_dir))
        record = {"notebook": name, "notebook_path": str(notebook), "preset": preset, "params": params,
                  RUN_DIR_PARAM: str(run_dir), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with owner:
        return _execute(notebook, name, params, record, run_dir, layout, resume=resume, progress_bar=progress_bar,
                        executor=executor, ray_address=ray_address)


def _execute(notebook: pathlib.Path, name: str, params: Mapping[str, Any], record: dict, run_dir: pathlib.Path,
             layout: Layout, *, resume, progress_bar: bool, executor: str | None,
             ray_address: str | None) -> pathlib.Path:
    """``run_notebook`` once the run directory is this process's (``own_run_dir``): the record, then papermill."""
    import papermill

    output = run_dir / runs.NOTEBOOK_FILE
    try:  # the worker counts this machine gives (`auto`: its cores), beside the values as given: a resume re-resolves
        record = {**record, WORKERS_RESOLVED: resolved_workers(params)}
    except ValueError as err:
        raise KlearError(f"{name}: {err}") from None
    try:
        runs.write_atomic(run_dir / runs.PARAMS_FILE, runs.to_json_text(record, indent=2) + "\n")
    except OSError as err:
        what = _disk_full_what(err)
        if what is None:
            raise KlearError(f"cannot write {run_dir / runs.PARAMS_FILE}: {err.strerror or err}") from None
        if resume is None:
            with contextlib.suppress(OSError):
                (run_dir / LOCK_FILE).unlink()
                run_dir.rmdir()  # nothing was written in it
        raise DiskFull(name, run_dir, err, what, resumable=resume is not None) from None
    (run_dir / runs.STATUS_FILE).unlink(missing_ok=True)
    _warn_if_foreign_kernel()
    _write_notebook_atomically(run_dir)
    clock, cpu, oom_before = time.monotonic(), _cpu_seconds(), _oom_kills()
    # The kernel inherits these: the notebook's preset.json names klear as its launcher and compares the parameters
    # with the presets klear read them from (klear_lib.notebook.start_run).
    kernel_env = contextlib.ExitStack()
    kernel_env.enter_context(_environ({"KLEAR_LAUNCHER": "klear run", "KLEAR_PARAMS_DIR": str(layout.params_dir),
                                       **({"KLEAR_EXECUTOR": executor} if executor else {}),
                                       **({"KLEAR_RAY_ADDRESS": ray_address} if ray_address else {})}))
    try:
        with _owning_the_run(), _adopting_descendants(), _interrupting_the_kernel():
            papermill.execute_notebook(
                str(notebook),
                str(output),
                parameters={**params, RUN_DIR_PARAM: str(run_dir)},
                kernel_name=KERNEL_NAME,
                kernel_manager_class=quiet_kernel_manager(),
                progress_bar=progress_bar,
                stdout_file=sys.stderr,  # stream the notebook's own progress lines (a long cell shows where it is)
                cwd=str(layout.repo_root),
            )
    except KeyboardInterrupt:
        _write_status(run_dir, {"status": "interrupted", "cause": "Ctrl-C (SIGINT)", **_last_cell(output)})
        _finish_record(run_dir, clock, cpu)
        raise RunInterrupted(run_dir) from None
    except Exception as err:  # PapermillExecutionError, or a dead kernel: both leave `output` behind
        full = _disk_full_what(err)
        if full is not None:
            _write_status(run_dir, {"status": "failed", "cause": "the disk is full", "error": full,
                                    **_last_cell(output)})
            _finish_record(run_dir, clock, cpu)
            raise DiskFull(name, run_dir, err, full, resumable=True) from None
        dead = type(err).__name__ == "DeadKernelError" or "kernel died" in str(err).lower()
        oom_after = _oom_kills()
        status = {"status": "failed", "cause": "the kernel died" if dead else "a cell raised",
                  "error": f"{getattr(err, 'ename', None) or type(err).__name__}: "
                           f"{getattr(err, 'evalue', None) or str(err).strip().splitlines()[-1][:300]}",
                  **_last_cell(output)}
        if dead and oom_before is not None and oom_after is not None and oom_after > oom_before:
            status["cause"] = "the kernel died: out of memory (the cgroup's oom_kill count rose)"
        _write_status(run_dir, status)
        _finish_record(run_dir, clock, cpu)
        raise NotebookFailed(name, output, err, cell=status.get("cell")) from err
    finally:
        kernel_env.close()
    _finish_record(run_dir, clock, cpu)
    return run_dir


@contextlib.contextmanager
def _environ(values: Mapping[str, str]):
    """Set environment variables for the duration of a block, then put back what was there."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _resume_record(run_dir: pathlib.Path, layout: Layout):
    """What an interrupted run was: its notebook, its parameters (as recorded), its params.json record."""
    import json

    run_dir = run_dir.resolve()
    path = run_dir / runs.PARAMS_FILE
    if not path.is_file():
        raise KlearError(f"--resume {run_dir}: no {runs.PARAMS_FILE} there (not a run directory klear run made)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        name, params = record["notebook"], dict(record["params"])
    except (ValueError, KeyError, TypeError) as err:
        raise KlearError(f"--resume {run_dir}: {runs.PARAMS_FILE} is unreadable ({err})") from None
    notebook = resolve_notebook(name, layout.notebooks_dir)
    record["seconds_before"] = float(record.get("seconds", 0.0))
    had_cpu = "cpu_seconds" in record or "seconds" not in record  # else its earlier CPU time was never recorded
    record["cpu_seconds_before"] = float(record.get("cpu_seconds", 0.0)) if had_cpu else None
    record.setdefault("resumed", []).append(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    metrics = run_dir / runs.METRICS_FILE
    if metrics.is_file():  # the notebook writes it again (units of work rebuild it from their own files)
        os.replace(metrics, run_dir / f"{runs.METRICS_FILE}.before-resume")
    return run_dir, notebook, name, params, record


def prepare_notebook(
    spec: str,
    preset: str,
    out: str | os.PathLike,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    layout: Layout,
    run_dir: str | os.PathLike | None = None,
) -> pathlib.Path:
    """Write `out`: the notebook with the preset's parameters injected, not executed (for nbval).

    `run_dir` defaults to a folder named after the notebook beside `out`; it is created.
    """
    import papermill

    notebook, name, params = resolve(spec, preset, overrides, layout)
    out = pathlib.Path(out).resolve()
    run_dir = pathlib.Path(run_dir).resolve() if run_dir else out.parent / name
    out.parent.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(
        str(notebook),
        str(out),
        parameters={**params, RUN_DIR_PARAM: str(run_dir)},
        kernel_name=KERNEL_NAME,
        prepare_only=True,
        progress_bar=False,
    )
    return out


def report_contract(run_dir: pathlib.Path) -> list[str]:
    missing = runs.check_run_dir(run_dir, runs.RUN_CONTRACT + (runs.NOTEBOOK_FILE,))
    if missing:
        print(f"klear: warning: {run_dir} lacks {', '.join(missing)} (see klear_lib.runs)", file=sys.stderr)
    return missing


def write_reproduce_log(layout: Layout, log: dict) -> None:
    """outputs/reproduce.json, rewritten after every notebook (a crash of reproduce itself keeps what ran)."""
    layout.output_root.mkdir(parents=True, exist_ok=True)
    runs.write_atomic(layout.output_root / REPRODUCE_LOG, runs.to_json_text(log, indent=2) + "\n")


def make_report(layout: Layout, preset: str = "tiny", *, progress_bar: bool = True) -> pathlib.Path:
    """Write ``<output root>/report.html`` from every run directory under the output root, and its card beside it
    (``report.md``).

    Through the ``00_report`` notebook when the notebooks folder has one with this preset (its executed copy
    lands in its own run directory); directly through ``klear_lib.report`` otherwise, or if that notebook fails.
    """
    from klear_lib import report

    out = layout.output_root / "report.html"
    nb = next((p for p in list_notebooks(layout.notebooks_dir) if p.stem.startswith(REPORT_PREFIX)), None)
    if nb is not None and (layout.params_dir / nb.stem / f"{preset}.yaml").is_file():
        try:
            run_notebook(str(nb), preset, {"output_root": str(layout.output_root), "report_path": str(out)},
                         layout=layout, progress_bar=progress_bar)
        except NotebookFailed as err:
            print(f"klear: {err}\nklear: writing the report without the notebook", file=sys.stderr)
        else:
            if out.is_file():
                report.write_card(layout.output_root)
                return out
    out = report.render_report(layout.output_root, out)
    report.write_card(layout.output_root)
    return out
