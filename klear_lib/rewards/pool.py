"""Reward manager: grade a batch in worker processes, where a hung, dying or raising judge costs one score.

Reference §5: math-verify's timeouts are ``SIGALRM`` and work only in a process's main thread, and "a hung
parse must never stall training"; Klear grades in a Pebble process pool (code: 10 workers, 500 s per item,
timeout or crash → −1). ``RewardPool`` is such a pool, with its own workers (``klear_lib.rewards.workers`` says
why not pebble):

* each item runs ``score_fn(**item)`` in the main thread of a worker process (so math-verify's own timeouts
  work there), under a wall-clock limit of ``timeout_s`` that the parent enforces by killing the worker;
* every item yields a ``RewardResult``, in input order: the judge's own, or the failure score with one of
  ``POOL_REASONS``. Nothing about one item is raised into the training loop and nothing waits forever; a
  killed or dead worker is replaced and the batch goes on;
* a worker's early exit (``os._exit``, a segfault, SIGKILL) is ``worker_died`` as soon as the parent sees the
  process end (its sentinel), not at the item's timeout;
* ``memory_mb`` caps each worker's address space (``RLIMIT_AS``, soft limit) at what it holds once started plus
  ``memory_mb``; a judgement that runs into the cap is ``memory_exceeded``;
* a judge that cannot start in a fresh process (its module fails to import there, the initializer raises,
  the module quits on import) fails the pool at once: the constructor raises ``WorkerStartError`` with the
  worker's traceback, and so does ``score_batch`` if a replacement worker cannot start.

Groups. In GRPO the G completions of a prompt share a gold answer, and parsing the gold costs about as much as
parsing an answer. With ``group_key="gold"``, a run of consecutive items with the same gold (at most
``max_group``) is sent to one worker as one task: it parses the gold once (score_math caches it) and the batch
pays one round trip per group instead of one per item (benchmarks/bench_math_pool.py). The worker still sends
each item's result as soon as it has it, and the limit is per item, timed from the previous item's result: an
item that hangs is killed after ``timeout_s`` like any other, the group's items before it keep their results,
and the ones after it go back to the front of the queue as a new group. A hang costs its own item whatever the
grouping (benchmarks/bench_pool_faults.py).

``make_trl_reward_func`` wraps a pool as a TRL ``reward_funcs`` entry that also reports why each reward is
what it is (TRL's ``log_extra`` column and a running ``Counter`` on the function).

Workers start with ``spawn`` by default: the trainer process holds torch (and possibly CUDA) threads, and
forking a multi-threaded process can deadlock the child; a spawned worker imports the judge's module (and runs
the main module's top level again, as ``spawn`` does), ≈0.5 s, paid at pool start and when a killed worker is
replaced. ``score_fn`` must therefore be picklable by reference: a module-level function of an importable module
(``klear_lib.rewards.math.score_math``), not one defined in a notebook.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import math
import multiprocessing
import pickle
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import connection

from klear_lib.rewards.result import RewardResult
from klear_lib.rewards.workers import READY, RESULT, START_ERROR, Worker, WorkerStartError, exit_description

__all__ = ["RewardPool", "MemoPool", "WorkerStartError", "POOL_REASONS", "completion_text", "make_trl_reward_func"]

_STOP_GRACE_S = 5.0  # how long close() lets idle workers exit by themselves before killing them
_OPEN_POOLS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    # Workers are not daemons (a judge may start processes), so multiprocessing would wait for them at exit:
    # kill those of pools nobody closed. Registered after multiprocessing's own hook, so it runs before it.
    for pool in list(_OPEN_POOLS):
        pool.close(wait=False)

#: Reasons the pool itself can give (the judge's own reasons pass through unchanged); each scores failure_score.
POOL_REASONS = {
    "timeout": "the item ran past the pool's timeout_s; its worker was killed and replaced",
    "worker_died": "the worker process ended while grading the item (os._exit, a segfault, a signal)",
    "memory_exceeded": "the judgement raised MemoryError: it ran into the worker's memory_mb cap (or the machine's)",
    "invalid_score": "the judge returned a score that is not a finite real number (NaN, inf, a str, None, a bool)",
    "error": "score_fn raised, returned something other than a RewardResult, or the item could not be sent",
}


def _groups(items: Sequence[Mapping], key: str | None, max_group: int) -> list[list[int]]:
    """Indices of runs of consecutive items with the same ``item[key]``, at most ``max_group`` long
    (each item alone when ``key`` is None or the item has no such key)."""
    groups: list[list[int]] = []
    missing = last = object()
    for i, item in enumerate(items):
        value = missing if key is None else item.get(key, missing)
        if value is missing or last is missing or value != last or len(groups[-1]) >= max_group:
            groups.append([])
        groups[-1].append(i)
        last = value
    return groups


def _name(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


class RewardPool:
    """Worker processes that turn a batch of judge calls into a list of ``RewardResult`` (see module doc).

    Args:
        score_fn: picklable, module-level ``f(**item) -> RewardResult`` (e.g. ``score_math``).
        workers: worker processes (Klear: 10 for code; 2 on the project's 2-core machines).
        timeout_s: wall-clock limit per item, from the moment a worker starts it. Keep it above the judge's own
            budget (``score_math``'s ``timeout_s``, 5 s by default) so the judge can report its own ``timeout``.
        failure_score: the score of every ``POOL_REASONS`` failure (reference §5: −1).
        group_key: item key whose equal values, in consecutive items, go to one worker as one task (``"gold"``
            for ``score_math``); None: one task per item.
        max_group: the most items in one task.
        start_method: multiprocessing start method of the workers: ``"spawn"`` (default, safe next to torch
            threads), ``"forkserver"`` or ``"fork"``.
        max_tasks: replace a worker after this many tasks (0: never); bounds slow leaks of a judge.
        initializer, initargs: run once in each worker when it starts (e.g. warm the judge up).
        memory_mb: address space (MiB) a worker may add to what it holds once started, enforced with
            ``RLIMIT_AS`` (virtual memory, so a judge's reservations count, not only what it touches); None: no cap.
            The default, 4 GiB, is far above what math-verify or the sandbox's parent side add (tens of MiB) and
            keeps a runaway sympy expansion from taking the machine's memory.
        start_timeout_s: how long a worker may take to start (spawn, imports, initializer) before the pool fails.

    Raises ``WorkerStartError`` when a worker cannot start (the pool is closed then), ``TypeError`` when
    ``score_fn`` does not pickle. Use as a context manager (``with RewardPool(score_math) as pool:
    pool.score_batch(items)``), or call ``close()`` yourself; after either, no worker process is left.
    """

    def __init__(self, score_fn: Callable[..., RewardResult], *, workers: int = 2, timeout_s: float = 10.0,
                 failure_score: float = -1.0, group_key: str | None = None, max_group: int = 16,
                 start_method: str = "spawn", max_tasks: int = 0, initializer: Callable | None = None,
                 initargs: Sequence = (), memory_mb: float | None = 4096, start_timeout_s: float = 120.0):
        if workers < 1 or max_group < 1:
            raise ValueError(f"workers and max_group must be >= 1, got {workers} and {max_group}")
        for name, value in (("timeout_s", timeout_s), ("start_timeout_s", start_timeout_s), ("memory_mb", memory_mb)):
            if name == "memory_mb" and value is None:
                continue  # no cap
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        try:
            self._payload = pickle.dumps((score_fn, initializer, tuple(initargs)))
        except Exception as e:  # pickle raises several types for "not picklable by reference"
            raise TypeError(f"score_fn {_name(score_fn)} (with initializer and initargs) must be picklable: a "
                            f"module-level function of an importable module; {type(e).__name__}: {e}") from e
        self.score_fn = score_fn
        self.timeout_s = float(timeout_s)
        self.failure_score = float(failure_score)
        self.group_key = group_key
        self.max_group = max_group
        self.start_method = start_method
        self.max_tasks = max_tasks
        self.memory_mb = memory_mb
        self.start_timeout_s = float(start_timeout_s)
        self._ctx = multiprocessing.get_context(start_method)
        self._task_ids = itertools.count(1)
        self._closed = False
        self._workers: list[Worker] = []
        self._lock = threading.Lock()  # one batch at a time: callers in several threads (verl's reward loop) queue
        _OPEN_POOLS.add(self)
        try:
            self._workers = [self._new_worker() for _ in range(workers)]
            while not all(w.ready for w in self._workers):
                self._wait(None, None)
        except BaseException:
            self.close(wait=False)
            raise

    @property
    def workers(self) -> int:
        return len(self._workers)

    # -- lifecycle -------------------------------------------------------------------------------------------
    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(wait=exc_type is None)

    def close(self, wait: bool = True) -> None:
        """Stop the workers and reap them. ``wait=False`` kills them instead of asking them to exit."""
        if self._closed:
            return
        self._closed = True
        _OPEN_POOLS.discard(self)
        if wait:
            for w in self._workers:
                if w.ready and w.task is None:
                    w.request_stop()
            deadline = time.monotonic() + _STOP_GRACE_S
            for w in self._workers:
                w.process.join(max(0.0, deadline - time.monotonic()))
        for w in self._workers:
            w.kill()  # whatever did not exit by itself; reaps every process

    def __del__(self):
        if not getattr(self, "_closed", True):
            try:
                self.close(wait=False)
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
                pass

    def _new_worker(self) -> Worker:
        return Worker(self._ctx, self._payload, self.memory_mb)

    def _replace(self, w: Worker) -> None:
        w.kill()
        if not self._closed:
            self._workers[self._workers.index(w)] = self._new_worker()

    # -- scoring ---------------------------------------------------------------------------------------------
    def score_batch(self, items: Sequence[Mapping]) -> list[RewardResult]:
        """``score_fn(**item)`` for each item, in the workers; results in input order.

        Raises only ``WorkerStartError`` (a replacement worker could not start: the pool is closed) or what
        interrupts the caller (KeyboardInterrupt: the workers busy with this batch are replaced)."""
        with self._lock:
            return self._score_batch(items)

    def _score_batch(self, items: Sequence[Mapping]) -> list[RewardResult]:
        if self._closed:
            raise RuntimeError("RewardPool is closed")
        items = [dict(it) for it in items]
        results: list[RewardResult | None] = [None] * len(items)
        queue = collections.deque(_groups(items, self.group_key, self.max_group))
        try:
            while queue or any(w.task for w in self._workers):
                self._dispatch(queue, items, results)
                self._wait(results, queue)
        except WorkerStartError:
            self.close(wait=False)
            raise
        except BaseException:
            for w in list(self._workers):
                if w.task is not None:  # still on this batch: its results would be stale in the next one
                    self._replace(w)
            raise
        return results  # type: ignore[return-value]

    def score(self, **item) -> RewardResult:
        """One item through the pool (convenience for notebooks)."""
        return self.score_batch([item])[0]

    def _dispatch(self, queue: collections.deque, items: list[dict], results: list) -> None:
        """Send queued groups to idle workers."""
        for w in self._workers:
            if not queue:
                return
            if not w.ready or w.task is not None:
                continue
            group = queue.popleft()
            try:
                w.send(next(self._task_ids), group, [items[i] for i in group], self.failure_score)
            except OSError:  # the worker is gone: its sentinel will say so; the group waits for another
                queue.appendleft(group)
            except Exception as e:  # noqa: BLE001 - an item that does not pickle (nothing was written)
                if len(group) > 1:
                    queue.extendleft([i] for i in reversed(group))
                else:
                    results[group[0]] = RewardResult(self.failure_score, "error",
                                                     detail=f"item could not be sent: {type(e).__name__}: {e}")

    def _wait(self, results: list | None, queue: collections.deque | None) -> None:
        """Wait for the next message, worker exit or deadline, and handle what happened."""
        now = time.monotonic()
        deadlines = [w.since + self.timeout_s for w in self._workers if w.task is not None]
        deadlines += [w.started + self.start_timeout_s for w in self._workers if not w.ready]
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        by_handle = {}
        for w in self._workers:
            by_handle[w.conn] = by_handle[w.sentinel] = w
        for handle in connection.wait(list(by_handle), timeout):
            w = by_handle[handle]
            if w in self._workers:  # not replaced while handling an earlier handle of this round
                self._receive(w, results)
            if w in self._workers and not w.process.is_alive():
                self._on_exit(w, results, queue)
        now = time.monotonic()
        for w in list(self._workers):
            if not w.ready and now - w.started > self.start_timeout_s:
                raise WorkerStartError(f"a worker process for {_name(self.score_fn)} was not ready after "
                                       f"{self.start_timeout_s:g} s (start_method {self.start_method!r})")
            if w.task is not None and now - w.since > self.timeout_s:
                self._receive(w, results)  # a result that arrived just now beats the deadline
                if w.task is not None and time.monotonic() - w.since > self.timeout_s:
                    self._fail_current(w, results, queue, "timeout", f"item ran past {self.timeout_s:g} s")

    def _receive(self, w: Worker, results: list | None) -> None:
        """Read every message waiting on ``w``'s pipe."""
        while True:
            try:
                if not w.conn.poll():
                    return
                message = w.conn.recv()
            except (EOFError, OSError):  # the worker is gone; _on_exit accounts for it
                w.process.join(timeout=1.0)
                return
            kind = message[0]
            if kind == READY:
                w.ready = True
            elif kind == START_ERROR:
                raise WorkerStartError(f"score_fn {_name(self.score_fn)} could not start in a worker process "
                                       f"(start_method {self.start_method!r}); the worker's error:\n{message[1]}")
            elif kind == RESULT:
                _, task_id, k, result = message
                if w.task is None or task_id != w.task[0] or k != w.done:
                    continue  # stale: a task this pool no longer waits for
                results[w.current()] = result
                w.done += 1
                w.since = time.monotonic()
                if w.done == len(w.task[1]):
                    w.task = None
                    w.n_tasks += 1
                    if self.max_tasks and w.n_tasks >= self.max_tasks:
                        w.stop(timeout_s=_STOP_GRACE_S)
                        self._replace(w)
                        return

    def _on_exit(self, w: Worker, results: list | None, queue) -> None:
        w.process.join()
        how = exit_description(w.process.exitcode)
        if not w.ready:
            raise WorkerStartError(
                f"a worker process for {_name(self.score_fn)} ended ({how}) before it could load the judge: it died "
                f"starting Python or running the main module's top level again (start_method "
                f"{self.start_method!r}); its traceback, if any, is on stderr")
        if w.task is None:
            self._replace(w)
        else:
            self._fail_current(w, results, queue, "worker_died", f"the worker process ended while grading ({how})")

    def _fail_current(self, w: Worker, results: list, queue, reason: str, detail: str) -> None:
        """The item ``w`` is on gets ``reason``; the rest of its task goes back to the front of the queue."""
        results[w.current()] = RewardResult(self.failure_score, reason, detail=detail)
        rest = w.remaining_after_current()
        if rest:
            queue.appendleft(rest)
        w.task = None
        self._replace(w)


class MemoPool:
    """A ``RewardPool`` that judges each distinct item once: the same ``score_batch`` interface, items compared as
    JSON (keys sorted), within a batch and across batches. For a deterministic judge on deterministic programs
    (the tiny code task's: pure functions of their input) this changes no score and saves most of the sandbox time
    once a policy repeats itself (the G samples of a group, the held-out problems evaluated again). Results whose
    reason is in ``uncached`` (the pool's own failures and timeouts, which depend on the machine's load) are not
    kept, so the next identical item is judged again. A judge with randomness or wall-clock dependence would get
    its first answer every time: do not use it there.

    ``judged`` counts the items sent to the pool, ``hits`` those answered from the memo.
    """

    def __init__(self, pool, *, uncached=("timeout", *POOL_REASONS)):
        self.pool = pool
        self.uncached = frozenset(uncached)
        self.memo: dict[str, RewardResult] = {}
        self.judged = 0
        self.hits = 0

    @staticmethod
    def key(item: Mapping) -> str:
        import json

        return json.dumps(item, sort_keys=True, default=str)

    def score_batch(self, items: Sequence[Mapping]) -> list[RewardResult]:
        keys = [self.key(it) for it in items]
        todo: dict[str, Mapping] = {}
        for k, it in zip(keys, items):
            if k not in self.memo and k not in todo:
                todo[k] = it
        fresh = dict(zip(todo, self.pool.score_batch(list(todo.values())))) if todo else {}
        self.judged += len(todo)
        self.hits += len(items) - len(todo)
        for k, r in fresh.items():
            if r.reason not in self.uncached:
                self.memo[k] = r
        return [fresh[k] if k in fresh else self.memo[k] for k in keys]

    def score(self, **item) -> RewardResult:
        return self.score_batch([item])[0]


def completion_text(completion) -> str:
    """The text of one TRL completion: a plain string, or a list of chat messages (conversational data).

    For messages, the assistant turns' contents are joined; a turn whose thinking a response parser moved to
    ``reasoning_content``/``thinking`` gets it back inside ``<think>...</think>`` so the format rule still sees it.
    """
    if isinstance(completion, str):
        return completion
    parts = []
    for msg in completion:
        if msg.get("role", "assistant") != "assistant":
            continue
        thinking = msg.get("reasoning_content") or msg.get("thinking")
        content = msg.get("content") or ""
        if not isinstance(content, str):  # multimodal content: a list of {"type": "text", "text": ...}
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<think>{thinking}</think>{content}" if thinking else content)
    return "\n".join(parts)


def make_trl_reward_func(pool: RewardPool, fields: Mapping[str, str], name: str, *,
                         completion_arg: str = "response", score_kwargs: Mapping | None = None,
                         completion_prefix: str = "") -> Callable:
    """A TRL reward function ``f(completions, **kwargs) -> list[float]`` that grades through ``pool``.

    Args:
        pool: an open ``RewardPool`` (keep it open for the whole training run).
        fields: ``{score_fn argument: dataset column}``, e.g. ``{"gold": "answer"}``; TRL passes each dataset
            column as a keyword list, one value per completion.
        name: the function's ``__name__``, which TRL uses in its metric names (``rewards/<name>/mean``).
        completion_arg: the ``score_fn`` argument that receives the completion text (``score_math``: response).
        score_kwargs: constant extra arguments of ``score_fn`` (e.g. ``{"format_rule": "paper"}``).
        completion_prefix: text put before each completion, e.g. ``"<think>"`` when the chat template opens
            the thinking block inside the prompt (Qwen3-style templates), so the completion itself has none.

    Each call logs the reasons: ``log_extra(f"{name}_reason", reasons)`` when TRL passes ``log_extra`` (a column
    of the completions table), and ``f.reason_counts`` (a ``collections.Counter``) accumulates them across calls;
    ``f.last_results`` keeps the last batch's ``RewardResult`` objects.

    Example (math, Klear's data: the gold answer in a dataset column ``answer``)::

        with RewardPool(score_math, workers=2, timeout_s=10.0, group_key="gold") as pool:
            math_reward = make_trl_reward_func(pool, {"gold": "answer"}, "math")
            GRPOTrainer(..., reward_funcs=[math_reward]).train()
        math_reward.reason_counts  # Counter({'correct': ..., 'wrong': ..., 'no_think_close': ...})
    """
    fields = dict(fields)
    static = dict(score_kwargs or {})

    def reward_func(completions, **kwargs) -> list[float]:
        missing = [col for col in fields.values() if col not in kwargs]
        if missing:
            raise KeyError(f"reward {name!r} needs dataset column(s) {missing}; got {sorted(kwargs)}")
        items = []
        for i, completion in enumerate(completions):
            item = {arg: kwargs[col][i] for arg, col in fields.items()}
            item.update(static)
            item[completion_arg] = completion_prefix + completion_text(completion)
            items.append(item)
        results = pool.score_batch(items)
        reasons = [r.reason for r in results]
        reward_func.reason_counts.update(reasons)
        reward_func.last_results = results
        log_extra = kwargs.get("log_extra")
        if callable(log_extra):
            log_extra(f"{name}_reason", reasons)
        return [r.score for r in results]

    reward_func.__name__ = reward_func.__qualname__ = name
    reward_func.reason_counts = collections.Counter()
    reward_func.last_results = []
    return reward_func
