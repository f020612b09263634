"""Units of work on a Ray cluster: ``run_jobs(..., executor="ray")`` (``klear run NB --executor ray``), so that a
sweep spans machines. Ray places and runs the units; everything a run directory holds is what the local pool writes.

Same records. Each unit is a Ray task (a streaming generator) that runs the unit in a worker process of its own on
its node, started and watched as the local pool's workers are (``experiment``'s worker set-up: its torch threads, the
driver's ``KLEAR_*``/``HF_*``/tracker variables, a process group ended with everything it started as soon as the
Ray worker above it is gone). The unit writes its records into a node-local file; the task sends the new complete
lines to the driver every ``POLL_S`` seconds, and the driver appends them to ``units/<job>.jsonl``, where
``UnitProgress`` reads them as it reads a local unit's. Only the driver writes in the run directory's ``units/``,
and it writes a done mark only while the run's owner (``KLEAR_RUN_OWNER``) lives, as the local pool does: a unit
can never be recorded after the driver died.

Files. Where every node sees the driver's run directory at the same path (a shared filesystem: ``KLEAR_RAY_FILES``
``shared``, or ``auto`` when a probe file written by the driver is seen by every node), units read their starts and
write their artefacts in place. Elsewhere (``ship``): the paths in a job's arguments under the output root are
rewritten to a mirror of it in the node's scratch folder (``KLEAR_RAY_SCRATCH``, default ``<tmp>/klear-ray``);
the files they name (a start or base model: a whole cache entry, checked against its manifest's sha256 on arrival,
``cache.install_entry``; a data file, checked against its sha256) travel through Ray's object store, once per run
and node (a node keeps its mirror, so the next unit there finds them); every file the unit wrote under the mirror
(cache entries, tracker folders, records beside the run) comes back with its result and is written at the same
place under the driver's output root (cache entries again checked against their manifests).

Needs and failure. A unit asks Ray for ``threads`` CPUs, ``KLEAR_RAY_UNIT_MEMORY_MB`` of memory (default 2048) and
one GPU when its config says ``use_cpu: false`` (the ``gpu`` presets); ``Job.needs`` overrides any of them. A unit
whose node or worker is lost fails with one line naming it and runs again from its start (its partial records
dropped), at most ``KLEAR_RAY_RETRIES`` times (default 2); a unit that raises fails the run as a local unit does.
Ctrl-C, a dead owner, or the driver's death cancel every task of the run: the first two through ``ray.cancel``,
the last through Ray itself, which ends a dead driver's workers on every node; the units' processes follow within
``experiment.WATCH_S``.

``experiment.run_jobs`` hands this module what it needs of it (``UnitKit``: the worker set-up, the records' paths,
the owner check), so that neither imports the other.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import os
import shutil
import socket
import sys
import tempfile
import traceback
import types
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from klear_lib import cache, runs

Job = Any  # klear_lib.experiment.Job (not imported: experiment imports this module)

ADDRESS_ENV = "KLEAR_RAY_ADDRESS"  # the cluster to join (default "auto": the running one, else a local one)
FILES_ENV = "KLEAR_RAY_FILES"  # "auto" (default), "shared" (every node sees the run directory) or "ship"
SCRATCH_ENV = "KLEAR_RAY_SCRATCH"  # on a node: where units work when files are shipped
RETRIES_ENV = "KLEAR_RAY_RETRIES"  # how often a unit whose node was lost runs again (default 2)
MEMORY_ENV = "KLEAR_RAY_UNIT_MEMORY_MB"  # the memory a unit asks Ray for (default 2048)
FORWARD = ("KLEAR_", "HF_", "TRACKIO_", "WANDB_", "TOKENIZERS_")  # the driver's variables a unit sees
POLL_S = 0.5
WORK_PREFIX = ".ray-"  # <run dir>/.ray-<token>/: the probe, and the units' own record files (beside units/, as a
# local unit's: a unit finds its run directory two levels above its records, experiment.unit_tracking_dir)


def require_ray():
    """The ``ray`` module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("executor 'ray' needs Ray: pip install 'ray==2.60.0' (the 'ray' extra)") from None
    return ray


LOOPBACK = "127.0.0.1"  # the address of every port of a local cluster this module starts
QUIET = {"logging_level": "ERROR", "log_to_driver": False, "configure_logging": True}


@contextlib.contextmanager
def _on_loopback():
    """Ray's single-machine addressing for the ``ray.init`` inside: a loopback address stays loopback.

    Ray 2.60 binds its servers (GCS, the raylet's node and object managers, core workers, the autoscaler's metrics,
    the agents, the dashboard) to 127.0.0.1 exactly when the node's address is 127.0.0.1, and to every interface
    otherwise; but ``ray.init`` rewrites a loopback address (``_node_ip_address``, or the host of ``address``) to the
    machine's routable one (``services.resolve_ip_for_localhost``), except where clusters are off
    (``ray_constants.ENABLE_RAY_CLUSTER``, from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``: off on macOS and Windows,
    where Ray keeps local clusters on loopback). Turned off here and put back after: Ray reads it at the call (so
    this works where Ray was imported first), and the rest of the process (a real cluster joined later) is
    unchanged."""
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def start_local(ray, **init):
    """Start a Ray cluster of this machine alone (``ray.init(address="local", **init)``; it ends with this process)
    whose every port listens on 127.0.0.1 only (``_on_loopback``), without a dashboard. Token authentication is
    Ray's default for a new local cluster (``RAY_AUTH_MODE`` unset: a token in ``~/.ray/auth_token``, made if
    missing); ``RAY_AUTH_MODE=disabled`` turns it off."""
    with _on_loopback():
        ray.init(address="local", _node_ip_address=LOOPBACK, include_dashboard=False, **{**QUIET, **init})
    got = ray.util.get_node_ip_address()
    if got != LOOPBACK:  # a later Ray that resolves it otherwise: never a cluster open to the network by surprise
        ray.shutdown()
        raise RuntimeError(f"the local Ray cluster got the node address {got}, not {LOOPBACK}: its ports would "
                           f"listen on every interface (Ray {ray.__version__}); not started")
    return ray


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 else address.rsplit("]:", 1)[0].lstrip("[")
    return host in ("127.0.0.1", "localhost", "::1")


def connect(address: str | None = None):
    """Join the cluster at ``address`` (default ``$KLEAR_RAY_ADDRESS``, else ``auto``); with ``auto`` and no cluster
    running, or ``local``, start a local one on loopback (``start_local``), which ends with this process. An address
    on loopback (``127.0.0.1:6379``) is joined there, not at the machine's routable address, as Ray would. Once per
    process: later calls reuse the connection."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    address = address or os.environ.get(ADDRESS_ENV) or "auto"
    if address == "local":
        return start_local(ray)
    try:
        with _on_loopback() if _is_loopback(address) else contextlib.nullcontext():
            ray.init(address=address, **QUIET)
    except ConnectionError as err:
        if address != "auto" or "Could not find any running Ray instance" not in str(err):
            raise  # several clusters on this machine, for one: name one with --ray-address
        start_local(ray)  # a new cluster, not another one found
    return ray


def unit_needs(job: Job, threads: int) -> dict:
    """What ``job`` asks Ray for: ``threads`` CPUs, memory, a GPU for a config with ``use_cpu: false``; ``Job.needs``
    (``num_cpus``, ``num_gpus``, ``memory`` in bytes, ``resources``) overrides."""
    try:
        memory = int(float(os.environ.get(MEMORY_ENV, 2048)) * 2**20)
    except ValueError:
        raise ValueError(f"{MEMORY_ENV}={os.environ[MEMORY_ENV]!r}: expected megabytes, e.g. 2048") from None
    needs: dict[str, Any] = {"num_cpus": threads, "memory": memory}
    config = job.kwargs.get("config") if isinstance(job.kwargs, dict) else None
    if isinstance(config, dict) and config.get("use_cpu") is False:
        needs["num_gpus"] = 1
    needs.update(job.needs or {})
    return needs


def remap(obj: Any, old: str, new: str) -> Any:
    """``obj`` with every string that is the path ``old`` or lies under it rewritten to lie under ``new``."""
    if isinstance(obj, str):
        if obj == old or obj.startswith(old.rstrip("/") + "/"):
            return new + obj[len(old):]
        return obj
    if isinstance(obj, dict):
        return {k: remap(v, old, new) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(remap(v, old, new) for v in obj)
    return obj


def _strings(obj: Any):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def share_root(run_dir: Path, run_root: Path) -> Path:
    """The folder whose paths are mirrored on nodes without the driver's disk: the output root (it holds every
    notebook's run directories and ``.cache/``) when ``run_dir`` lies in a notebook's run directory ``run_root``,
    else ``run_dir``'s parent."""
    if (run_root / runs.CONFIG_FILE).is_file():
        return run_root.parent.parent
    return run_dir.parent


# ---- on a node ---------------------------------------------------------------------------------------------------

def _mirror(node_id: str, root: str) -> Path:
    base = Path(os.environ.get(SCRATCH_ENV) or Path(tempfile.gettempdir()) / "klear-ray")
    return base / node_id[:12] / hashlib.sha256(root.encode()).hexdigest()[:12]


def _sees(probe: str, token: str) -> bool:
    """On a node: whether it reads the driver's probe file (the same disk at the same path)."""
    try:
        return Path(probe).read_text(encoding="utf-8") == token
    except OSError:
        return False


def _materialise(inputs: list[dict], local_root: Path) -> None:
    """Put a unit's inputs in the node's mirror, each checked on arrival; those already there and intact stay."""
    import ray

    for item in inputs:
        dest = local_root / item["rel"]
        if item["kind"] == "entry":
            manifest = dest / cache.MANIFEST
            if manifest.is_file() and hashlib.sha256(manifest.read_bytes()).hexdigest() == item["sha"] \
                    and cache.verify_files(dest) is None:
                continue  # the same entry, intact: a unit before this one brought it
            shutil.rmtree(dest, ignore_errors=True)  # another copy under that name, or a damaged one
            cache.install_entry(dest, ray.get(item["ref"]))
        else:
            if dest.is_file() and cache.file_sha256(dest) == item["sha"]:
                continue
            data = ray.get(item["ref"])
            if hashlib.sha256(data).hexdigest() != item["sha"]:
                raise ValueError(f"{item['rel']}: the copy that arrived differs from the driver's sha256")
            dest.parent.mkdir(parents=True, exist_ok=True)
            runs.write_atomic(dest, data, fsync=False)


def _skip(rel: str) -> bool:
    parts = rel.split("/")
    return any(p.startswith(WORK_PREFIX) or ".tmp-" in p for p in parts)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in root.rglob("*"):
        if p.is_file():
            rel = p.relative_to(root).as_posix()
            if not _skip(rel):
                st = p.stat()
                out[rel] = (st.st_size, st.st_mtime_ns)
    return out


def _new_lines(path: Path, offset: int) -> tuple[bytes, int]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return b"", offset
    end = chunk.rfind(b"\n") + 1
    return chunk[:end], offset + end


def _unit_task(spec: dict):
    """The Ray task of one unit (a generator): ``{"start"}``, then ``{"records": bytes}`` as the unit writes them,
    then ``{"done": result, "files": {...}}`` or ``{"failed": line, "traceback": text}``."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    for p in spec["sys_path"]:  # where the driver imports the unit's function from, where this node has it too
        if p not in sys.path and os.path.isdir(p):
            sys.path.append(p)
    ship = spec["mode"] == "ship"
    root = spec["root"]
    local_root = _mirror(node, root) if ship else Path(root)
    if ship:
        local_root.mkdir(parents=True, exist_ok=True)
        _materialise(spec["inputs"], local_root)
    here = str(local_root)
    work = Path(remap(spec["work_dir"], root, here))
    work.mkdir(parents=True, exist_ok=True)
    metrics = work / f"{spec['slug']}.jsonl"
    metrics.unlink(missing_ok=True)
    before = _snapshot(local_root) if ship else {}
    yield {"start": node, "host": socket.gethostname(), "ship": ship}
    env = {**os.environ, **remap(spec["env"], root, here)}
    env.pop(spec["owner_env"], None)  # the owner is a process on the driver's machine: Ray watches the driver
    cwd = spec["cwd"] if os.path.isdir(spec["cwd"]) else os.getcwd()
    context, init, call, identity = spec["worker"]
    # a worker process as the local pool's, whose "driver" is this Ray worker: it ends when Ray ends this process
    pool = cf.ProcessPoolExecutor(1, mp_context=context(), initializer=init,
                                  initargs=(spec["threads"], identity(), None, None, env, cwd))
    offset, error, result = 0, None, None
    main = sys.modules.get("__main__")
    try:
        # This process's main module is Ray's worker script: multiprocessing would import it again in the unit's
        # process (and Ray with it: 2.5 s a unit). The process starts on submit; it needs nothing of that script.
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            future = pool.submit(call, spec["fn"], remap(spec["kwargs"], root, here), str(metrics), spec["key"])
        finally:
            sys.modules["__main__"] = main
        while True:
            try:
                result = future.result(timeout=POLL_S)
                break
            except cf.TimeoutError:
                chunk, offset = _new_lines(metrics, offset)
                if chunk:
                    yield {"records": chunk}
            except Exception as err:  # noqa: BLE001 (the unit raised, or its process died: sent as a failure)
                error = err
                break
        chunk, offset = _new_lines(metrics, offset)
        if chunk:
            yield {"records": chunk}
        if error is not None:
            detail = getattr(error, "__cause__", None) or error
            yield {"failed": f"{type(error).__name__}: {error}",
                   "traceback": "".join(traceback.format_exception(type(detail), detail, detail.__traceback__))}
            return
        files = {}
        if ship:  # what changed under the mirror (another unit on this node may have written some: each whole)
            for rel, stamp in _snapshot(local_root).items():
                if before.get(rel) != stamp:
                    files[rel] = (local_root / rel).read_bytes()
        yield {"done": remap(result, here, root), "files": files}
    finally:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()  # a cancelled task: the unit's process group goes with it (its SIGTERM handler)
        pool.shutdown(wait=False, cancel_futures=True)
        if ship:
            shutil.rmtree(work, ignore_errors=True)


# ---- on the driver -----------------------------------------------------------------------------------------------

_MODES: dict[str, str] = {}  # share root -> the files mode found for it, once per process


def files_mode(ray, root: Path, probe: Path, token: str) -> str:
    """``shared`` or ``ship``: ``$KLEAR_RAY_FILES``, or for ``auto`` whether every live node reads ``probe``."""
    mode = os.environ.get(FILES_ENV, "auto")
    if mode not in ("auto", "shared", "ship"):
        raise ValueError(f"{FILES_ENV}={mode!r}: expected auto, shared or ship")
    if mode != "auto":
        return mode
    if str(root) not in _MODES:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        check = ray.remote(num_cpus=0, max_retries=0)(_sees)
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        refs = [check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(
            str(probe), token) for n in nodes]
        _MODES[str(root)] = "shared" if all(ray.get(refs, timeout=120)) else "ship"
    return _MODES[str(root)]


class _Inputs:
    """What a job's arguments name under the share root and the driver has (a cache entry's ``final/`` folder, a
    file), put in Ray's object store once per run; plus the run's config.json (units find their run by it)."""

    def __init__(self, ray, root: Path, run_root: Path):
        self.ray, self.root, self.items = ray, root, {}
        self.always = [run_root / runs.CONFIG_FILE]

    def _item(self, path: Path) -> dict | None:
        if path.name == cache.MODEL_DIR and cache.is_entry(path.parent):
            path, kind = path.parent, "entry"
        elif path.is_file():
            kind = "file"
        else:
            return None
        rel = path.relative_to(self.root).as_posix()
        if rel not in self.items:
            if kind == "entry":
                sha = hashlib.sha256((path / cache.MANIFEST).read_bytes()).hexdigest()
                data = cache.pack_entry(path)
            else:
                data = path.read_bytes()
                sha = hashlib.sha256(data).hexdigest()
            self.items[rel] = {"rel": rel, "kind": kind, "sha": sha, "ref": self.ray.put(data)}
        return self.items[rel]

    def for_job(self, job: Job) -> list[dict]:
        out = {}
        for text in [*(str(p) for p in self.always), *_strings(job.kwargs)]:
            path = Path(text)
            if path.is_absolute() and path.is_relative_to(self.root) and path.exists():
                item = self._item(path)
                if item is not None:
                    out[item["rel"]] = item
        return list(out.values())


def _receive(files: dict[str, bytes], root: Path) -> None:
    """Write the files a unit made on a node without the driver's disk at their places under ``root``; cache
    entries whole, checked against their manifests (``cache.install_entry``)."""
    suffix = "/" + cache.MANIFEST
    entries = [rel[:-len(suffix)] for rel in files if rel.endswith(suffix)
               and any(f.startswith(rel[:-len(cache.MANIFEST)] + cache.MODEL_DIR + "/") for f in files)]
    for entry in entries:
        part = {rel[len(entry) + 1:]: data for rel, data in files.items() if rel.startswith(entry + "/")}
        cache.install_entry(root / entry, part)
    for rel, data in files.items():
        if not any(rel.startswith(entry + "/") for entry in entries):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            runs.write_atomic(root / rel, data, fsync=False)


def _first_line(err: BaseException) -> str:
    """The error's type and first sentence (Ray's messages go on for lines: what to try, where the logs are)."""
    text = str(err).strip().splitlines()
    first = text[0].split(". ")[0].rstrip(".") if text else ""
    return f"{type(err).__name__}: {first[:200]}"


@dataclass(frozen=True)
class UnitKit:
    """What ``experiment.run_jobs`` lends the Ray executor: where a unit's records go on the driver (``records``),
    the run directory that holds ``run_dir`` (``run_root``: its config.json), the check that the run's owner lives,
    the failure type, the worker set-up a unit runs under on its node (``worker``: context, initializer, call,
    process identity; module functions, pickled by name), the variables units see (``env``) and the owner's name."""

    records: Callable[[Job], Path]
    run_root: Path
    check_owner: Callable[[], None]
    failed: type
    worker: tuple
    env: dict
    owner_env: str


def run_units(todo: list[Job], run_dir: Path, *, threads: int, kit: UnitKit, live, record, progress
              ) -> BaseException | None:
    """Run ``todo`` on the cluster; ``record(job, result)`` for each that finishes (the driver's done mark).
    Returns the first failure (``kit.failed``), or None; raises on Ctrl-C or a dead owner after cancelling every
    task of the run."""
    ray = connect()
    run_dir = Path(run_dir).resolve()
    root = share_root(run_dir, kit.run_root)
    for stale in run_dir.glob(f"{WORK_PREFIX}*"):  # an earlier attempt's work folders (its tasks are gone)
        shutil.rmtree(stale, ignore_errors=True)
    token = uuid.uuid4().hex[:12]
    probe = run_dir / f"{WORK_PREFIX}{token}" / "probe"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(token, encoding="utf-8")
    mode = files_mode(ray, root, probe, token)
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARD) and k != kit.owner_env}
    base = {"root": str(root), "work_dir": str(probe.parent), "mode": mode, "env": {**env, **kit.env},
            "sys_path": [p for p in sys.path if p], "cwd": os.getcwd(), "threads": threads, "worker": kit.worker,
            "owner_env": kit.owner_env}
    inputs = _Inputs(ray, root, kit.run_root) if mode == "ship" else None
    retries = int(os.environ.get(RETRIES_ENV, 2))
    task = ray.remote(max_retries=0)(_unit_task)
    running: dict = {}  # generator -> {"job", "attempt", "started"}

    def submit(job, attempt):
        spec = {**base, "key": job.key, "fn": job.fn, "kwargs": job.kwargs, "slug": job.slug,
                "inputs": inputs.for_job(job) if inputs else []}
        gen = task.options(name=f"klear:{job.key}", **unit_needs(job, threads)).remote(spec)
        running[gen] = {"job": job, "attempt": attempt, "started": False}

    failure = None

    def fail(err):
        nonlocal failure
        if failure is None:
            failure = err
            for gen, st in list(running.items()):
                if not st["started"]:  # not started yet: cancelled, as the local pool cancels its queue
                    ray.cancel(gen)
                    del running[gen]

    def lost(st, err):
        job, attempt = st["job"], st["attempt"]
        line = f"unit {job.key!r} lost its node or worker ({_first_line(err)})"
        if attempt <= retries and failure is None:
            progress(f"{line}: running it again (attempt {attempt + 1} of {retries + 1})")
            kit.records(job).unlink(missing_ok=True)
            submit(job, attempt + 1)
        else:
            fail(kit.failed(f"{line}, {attempt} times: not run again"))

    for job in todo:
        submit(job, 1)
    try:
        while running:
            kit.check_owner()
            ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
            for gen in ready:
                st = running[gen]
                job = st["job"]
                try:
                    item = ray.get(next(gen))
                except StopIteration:
                    del running[gen]
                    lost(st, RuntimeError("its task ended without a result"))  # never a silent gap
                    continue
                except ray.exceptions.TaskCancelledError:
                    del running[gen]
                    continue
                except ray.exceptions.RayTaskError as err:  # the task itself raised (an input failed its check)
                    del running[gen]
                    cause = err.cause if getattr(err, "cause", None) is not None else err
                    fail(kit.failed(f"unit {job.key!r} ({job.fn}) failed on its node: "
                                              f"{_first_line(cause)}"))
                    continue
                except ray.exceptions.RayError as err:  # the node or the worker process is gone
                    del running[gen]
                    lost(st, err)
                    continue
                metrics = kit.records(job)
                if "start" in item:
                    st["started"] = True
                    metrics.parent.mkdir(parents=True, exist_ok=True)
                    metrics.write_bytes(b"")  # its records start here (UnitProgress: the unit runs)
                elif "records" in item:
                    with open(metrics, "ab") as f:  # whole lines; on disk before the done mark that counts them
                        f.write(item["records"])
                        f.flush()
                        os.fsync(f.fileno())
                elif "failed" in item:
                    del running[gen]
                    fail(kit.failed(f"unit {job.key!r} ({job.fn}) failed: {item['failed']}\n"
                                              f"worker traceback:\n{item['traceback']}"))
                elif "done" in item:
                    del running[gen]
                    if item["files"]:
                        _receive(item["files"], root)
                    record(job, item["done"])
            live.poll()
    except BaseException:  # Ctrl-C, a dead owner: every task of the run ends now, on every node
        for gen in running:
            ray.cancel(gen, force=True)
        raise
    finally:
        shutil.rmtree(probe.parent, ignore_errors=True)
    return failure
