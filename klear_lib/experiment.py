"""An experiment's units of work (an arm × a seed, one SFT source, ...) run in worker processes, each recorded
when it finishes, so that an interrupted run resumes without redoing them.

    jobs = [Job("gppo/seed=0", "klear_lib.train.rl_jobs:rl_unit", {"config": {...}, "start": ..., "tags": {...}})]
    results = run_jobs(jobs, run_dir, workers=2)

Each job calls ``fn(**kwargs, metrics_path=...)`` in a worker process (``spawn``; the function must be importable,
not defined in a notebook), writes its metric records to ``run_dir/units/<job>.jsonl`` and, when it returns, its
result (a JSON-able dict) to ``run_dir/units/<job>.json``: that file is the job's "done" mark. On a second call
with the same run directory, done jobs are skipped and their results read back; an unfinished job's partial
records are discarded and it runs again. After every finished job, ``metrics.jsonl`` is rewritten from the done
jobs' records in job order (atomically), so it never holds a record twice and always holds every finished job.

Why processes: the tiny model is too small for two threads to speed one run up much, but two runs at a time,
one thread each, nearly double the throughput on two cores. Every job runs in a worker with ``threads`` torch
threads, whatever ``workers`` is, so its numbers do not depend on how many ran beside it.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import json
import multiprocessing
import os
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klear_lib import runs

UNITS_DIR = "units"
TRACKING_DIR = "tracking"


_CURRENT_UNIT: str | None = None  # in a worker: the key of the unit it runs (set by _call)


@dataclass(frozen=True)
class UnitTracking(os.PathLike):
    """Where a unit's experiment tracker writes and under which names: the notebook's run directory's
    ``tracking/<tracker>/`` (``tracking/tensorboard/gppo/lr=0.0001/seed=0``: TensorBoard shows the unit's key as its
    run; wandb's offline run folder goes there too; trackio keeps one database per run directory,
    ``tracking/trackio``, with the unit as the run and the notebook as the project). As a path it is the folder."""

    tracker: str
    root: Path  # <run dir>/tracking
    project: str  # the notebook's name
    run_name: str  # the unit's key

    @property
    def folder(self) -> Path:
        if self.tracker == "trackio":
            return self.root / "trackio"
        parts = [re.sub(r"[^A-Za-z0-9._=-]+", "_", p) for p in self.run_name.split("/") if p not in ("", ".", "..")]
        return self.root.joinpath(self.tracker, *parts)

    def __fspath__(self) -> str:
        return str(self.folder)


def _run_root(folder: Path) -> Path:
    """The notebook's run directory that holds ``folder`` (the nearest with a config.json: run_jobs may run in a
    subfolder, 03's ``control/``), else ``folder`` itself."""
    for candidate in (folder, *list(folder.parents)[:2]):
        if (candidate / runs.CONFIG_FILE).is_file():
            return candidate
    return folder


def unit_tracking_dir(metrics_path: str | os.PathLike, report_to: str) -> UnitTracking | None:
    """Where a unit's experiment tracker writes (``UnitTracking``), beside ``units/<unit>.jsonl`` in the notebook's
    run directory, so that its files outlive anything the unit deletes; ``None`` when ``report_to`` is ``"none"``.
    The unit's key comes from the worker (``run_jobs``); outside one, its file name."""
    if report_to == "none":
        return None
    unit = Path(metrics_path)
    root = _run_root(unit.parent.parent)
    key = _CURRENT_UNIT if _CURRENT_UNIT and Job(_CURRENT_UNIT, "m:f").slug == unit.stem else unit.stem
    return UnitTracking(report_to, root / TRACKING_DIR, root.parent.name, key)


@dataclass(frozen=True)
class Job:
    """One unit of work: ``fn`` ("package.module:function") called with ``kwargs`` (JSON-able) in a worker."""

    key: str
    fn: str
    kwargs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.key or ":" not in self.fn:
            raise ValueError(f"Job needs a key and fn='module:function', got key={self.key!r}, fn={self.fn!r}")

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._=-]+", "_", self.key)


class JobFailed(RuntimeError):
    """A job raised in its worker; the message carries the job and the worker's traceback."""


def _paths(run_dir: Path, job: Job) -> tuple[Path, Path]:
    units = run_dir / UNITS_DIR
    return units / f"{job.slug}.jsonl", units / f"{job.slug}.json"


def _init_worker(threads: int, env: dict | None = None) -> None:
    # First, before anything imports trackio (TRL imports it with itself): trackio reads TRACKIO_DIR once, at
    # import, so every unit of this run logs to the run's one trackio folder (UnitTracking).
    os.environ.update(env or {})
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(threads)
    from klear_lib.notebook import quiet

    quiet()


def _call(fn: str, kwargs: dict, metrics_path: str, result_path: str, key: str | None = None) -> dict:
    global _CURRENT_UNIT
    _CURRENT_UNIT = key  # the unit's name for its experiment tracker (unit_tracking_dir)
    module, name = fn.split(":")
    func = getattr(importlib.import_module(module), name)
    start = time.perf_counter()
    result = dict(func(**kwargs, metrics_path=metrics_path) or {})
    result["seconds"] = round(time.perf_counter() - start, 1)
    tmp = result_path + ".tmp"
    Path(tmp).write_text(runs.to_json_text(result, "result", sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, result_path)  # the done mark appears whole or not at all
    return result


def merge_metrics(run_dir: str | os.PathLike, jobs: list[Job]) -> int:
    """Rewrite ``run_dir/metrics.jsonl`` from the records of the done jobs, in job order; returns the count."""
    run_dir = Path(run_dir)
    lines = []
    for job in jobs:
        metrics, result = _paths(run_dir, job)
        if result.is_file() and metrics.is_file():
            lines += [line for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    tmp = run_dir / (runs.METRICS_FILE + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, run_dir / runs.METRICS_FILE)
    return len(lines)


def run_jobs(jobs: list[Job], run_dir: str | os.PathLike, *, workers: int = 2, threads: int = 1,
             progress=print, bars: str = "auto", progress_every_s: float = 15.0) -> dict[str, dict]:
    """Run ``jobs`` (``workers`` at a time, each with ``threads`` torch threads) and return ``{key: result}``.

    Done jobs (a result file in ``run_dir/units``) are not run again. The first failure stops the run: the jobs
    not yet started are cancelled, the running ones finish and are recorded, then ``JobFailed`` is raised with
    the worker's traceback. Progress inside the units comes from their records as they are written
    (``UnitProgress``): ``bars="auto"`` shows tqdm widgets in JupyterLab and lines through ``progress`` (at most one
    per unit every ``progress_every_s`` seconds) elsewhere; ``"none"``: the done lines only.
    """
    run_dir = Path(run_dir)
    keys = [j.key for j in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"job keys must be unique; repeated: {sorted({k for k in keys if keys.count(k) > 1})}")
    slugs = [j.slug for j in jobs]
    if len(set(slugs)) != len(slugs):
        raise ValueError("two job keys map to the same file name; make them differ in letters or digits")
    if workers < 1 or threads < 1:
        raise ValueError(f"workers and threads must be >= 1, got {workers}, {threads}")
    (run_dir / UNITS_DIR).mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    todo = []
    for job in jobs:
        metrics, result = _paths(run_dir, job)
        if result.is_file():
            results[job.key] = json.loads(result.read_text(encoding="utf-8"))
        else:
            metrics.unlink(missing_ok=True)  # a partial record of an interrupted attempt
            todo.append(job)
    if results:
        progress(f"resuming: {len(results)} of {len(jobs)} units already done, {len(todo)} to run")
    merge_metrics(run_dir, jobs)
    if not todo:
        return {k: results[k] for k in keys}
    clock = time.perf_counter()
    failure = None
    ctx = multiprocessing.get_context("spawn")
    worker_env = {"TRACKIO_DIR": str(_run_root(run_dir) / TRACKING_DIR / "trackio")}
    pool = cf.ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx, initializer=_init_worker,
                                  initargs=(threads, worker_env))
    try:
        futures = {}
        for job in todo:
            metrics, result = _paths(run_dir, job)
            futures[pool.submit(_call, job.fn, job.kwargs, str(metrics), str(result), job.key)] = job
        done_count = len(results)
        live = UnitProgress(todo, run_dir, mode=bars, progress=progress, every_s=progress_every_s,
                            done=len(results), total=len(jobs))
        for fut in _as_completed(futures, live.poll):
            job = futures[fut]
            try:
                results[job.key] = fut.result()
            except Exception as err:  # noqa: BLE001 (reported with the job and re-raised below)
                if failure is None:
                    detail = getattr(err, "__cause__", None) or err
                    text = "".join(traceback.format_exception(type(detail), detail, detail.__traceback__))
                    failure = JobFailed(f"unit {job.key!r} ({job.fn}) failed: {type(err).__name__}: {err}\n"
                                        f"worker traceback:\n{text}")
                    for other in futures:
                        other.cancel()
                continue
            done_count += 1
            live.finished(job)
            merge_metrics(run_dir, jobs)
            elapsed = time.perf_counter() - clock
            ran = done_count - (len(jobs) - len(todo))
            left = elapsed / ran * (len(jobs) - done_count) if ran else 0.0
            progress(f"[{done_count:3d}/{len(jobs)}] {job.key} done in {results[job.key]['seconds']:.0f}s "
                     f"(elapsed {elapsed:.0f}s, about {left / 60:.1f} min left)")
        live.close()
    except BaseException:  # Ctrl-C above all: stop now; the running units are lost (redone on the next call)
        if "live" in locals():
            live.close()
        # concurrent.futures has no public way to stop a running task: end its worker processes
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    if failure is not None:
        raise failure
    return {k: results[k] for k in keys}


def _as_completed(futures, poll, every_s: float = 1.0):
    """``concurrent.futures.as_completed``, calling ``poll()`` at least every ``every_s`` seconds while it waits."""
    pending = set(futures)
    while pending:
        done, pending = cf.wait(pending, timeout=every_s, return_when=cf.FIRST_COMPLETED)
        poll()
        yield from done


class UnitProgress:
    """Progress inside the running units, read from the records they write as they go (``units/<job>.jsonl``; the
    parent polls the files, so nothing travels between processes): an RL unit's rollout records give its rollouts
    done out of ``config["rollouts"]``, with the rollout's mean reward, the fork probe (``klear/p_correct_fork``) and
    the last held-out avg@n. A unit whose config has no ``rollouts`` (an SFT unit) shows only that it runs.

    ``mode``: ``"widgets"`` (``tqdm.auto``: a bar per running unit and one for the units, whose ETA comes from the
    units done), ``"lines"`` (a plain text bar per unit through ``progress``, at most one per unit every ``every_s``
    seconds and one when it finishes: ``klear run``, papermill, logs), ``"none"``, or ``"auto"``: widgets in a
    JupyterLab kernel (``notebook.launcher() == "jupyter"``, ipywidgets installed), lines elsewhere."""

    def __init__(self, jobs: list[Job], run_dir: Path, *, mode: str = "auto", progress=print, every_s: float = 15.0,
                 done: int = 0, total: int | None = None, bar=None):
        if mode == "auto":
            mode = "widgets" if _in_jupyter() else "lines"
        if mode not in ("widgets", "lines", "none"):
            raise ValueError(f"bars must be 'auto', 'widgets', 'lines' or 'none', got {mode!r}")
        self.mode, self.progress, self.every_s, self.run_dir = mode, progress, every_s, Path(run_dir)
        self.jobs = {j.key: j for j in jobs}
        self.state: dict[str, dict] = {}  # key -> {"offset", "n", "reward", "p_fork", "eval", "bar", "printed"}
        self.clock = time.perf_counter()
        self._bar = bar
        self.overall = None
        if mode == "widgets":
            self.overall = self._new_bar(total=total or len(jobs), initial=done, desc="units", unit="unit",
                                         smoothing=0)  # smoothing 0: the ETA is the mean time per unit done

    def _new_bar(self, **kwargs):
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm
        return self._bar(**kwargs)

    @staticmethod
    def total(job: Job) -> int | None:
        rollouts = (job.kwargs.get("config") or {}).get("rollouts") if isinstance(job.kwargs, dict) else None
        return int(rollouts) if isinstance(rollouts, int) and not isinstance(rollouts, bool) else None

    def _read(self, job: Job, st: dict) -> bool:
        """New complete lines of the job's records; True when its rollout count moved."""
        metrics, _ = _paths(self.run_dir, job)
        try:
            with open(metrics, "rb") as f:
                f.seek(st["offset"])
                chunk = f.read()
        except OSError:
            return False
        end = chunk.rfind(b"\n") + 1  # a partial last line is read on a later poll
        st["offset"] += end
        moved = False
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or "final" not in rec or "rollout" not in rec:
                continue  # a step record: the rollout records carry the progress
            moved |= rec["rollout"] != st["n"]
            st["n"] = rec["rollout"]
            for key, name in (("reward", "reward"), ("klear/p_correct_fork", "p_fork"), ("eval/avg_at_n", "eval")):
                if isinstance(rec.get(key), (int, float)):
                    st[name] = rec[key]
        return moved

    def _postfix(self, st: dict) -> str:
        parts = [f"{name} {st[name]:.3f}" for name in ("reward", "p_fork", "eval") if st.get(name) is not None]
        return ", ".join(parts)

    def poll(self) -> None:
        if self.mode == "none":
            return
        if self.overall is not None:
            self.overall.refresh()  # its elapsed time moves between units too
        for key, job in self.jobs.items():
            st = self.state.get(key)
            if st is None:
                try:  # the unit opened its records when it started: its elapsed time counts from there
                    started = _paths(self.run_dir, job)[0].stat().st_mtime
                except OSError:
                    continue  # not started yet
                st = self.state[key] = {"offset": 0, "n": 0, "printed": None, "start": min(started, time.time())}
                if self.mode == "widgets":
                    st["bar"] = self._new_bar(total=self.total(job), desc=key, unit="rollout", leave=False)
            if st.get("done"):
                continue
            moved = self._read(job, st)
            if self.mode == "widgets":
                bar = st["bar"]
                bar.n = st["n"]
                bar.set_postfix_str(self._postfix(st), refresh=False)
                bar.refresh()
            elif moved and (st["printed"] is None or time.perf_counter() - st["printed"] >= self.every_s):
                self._line(job, st)

    def _line(self, job: Job, st: dict) -> None:
        from tqdm import tqdm

        st["printed"], st["printed_n"] = time.perf_counter(), st["n"]
        meter = tqdm.format_meter(st["n"], self.total(job), time.time() - st["start"], prefix=f"  {job.key}",
                                  unit="rollout", postfix=self._postfix(st) or None, ascii=True)
        self.progress(meter)

    def finished(self, job: Job) -> None:
        """The unit's done mark is written: its bar ends (and the units bar moves)."""
        st = self.state.get(job.key)
        if st is not None and self.mode != "none":
            self._read(job, st)
            if self.mode == "widgets":
                st["bar"].close()
            elif st["printed"] is not None and st["n"] != st.get("printed_n"):
                self._line(job, st)  # its last rollouts, if a throttled line left them out
        if st is not None:
            st["done"] = True
        if self.overall is not None:
            self.overall.update(1)

    def close(self) -> None:
        for st in self.state.values():
            if "bar" in st and not st.get("done"):
                st["bar"].close()
        if self.overall is not None:
            self.overall.close()


def _in_jupyter() -> bool:
    """A kernel of a Jupyter server (JupyterLab) with ipywidgets: where tqdm's widgets render."""
    import importlib.util

    from klear_lib.notebook import launcher

    return launcher() == "jupyter" and importlib.util.find_spec("ipywidgets") is not None


def unit_records(run_dir: str | os.PathLike, job: Job) -> list[dict[str, Any]]:
    """The metric records one done job wrote (``runs.read_metrics`` of its unit file)."""
    metrics, _ = _paths(Path(run_dir), job)
    return runs.read_metrics(metrics)
