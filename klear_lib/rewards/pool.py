"""Reward manager: grade a batch in worker processes, where a hung, crashed or raising judge costs one score.

Reference §5: math-verify's timeouts are ``SIGALRM`` and work only in a process's main thread, and "a hung
parse must never stall training"; Klear grades in a Pebble process pool (code: 10 workers, 500 s per item,
timeout or crash → −1). ``RewardPool`` is that pool:

* each item runs ``score_fn(**item)`` in the main thread of a worker process (so math-verify's own timeouts
  work there), under a wall-clock limit that pebble enforces by killing the worker;
* every item yields a ``RewardResult``, in input order: the judge's own, or ``(failure_score, "timeout")``,
  ``(failure_score, "crashed")`` (the worker died: segfault, ``os._exit``, SIGKILL, out of memory) or
  ``(failure_score, "error", detail=...)`` (the judge raised, or returned something else). Nothing is raised
  into the training loop and nothing waits forever; pebble replaces a killed worker and the pool goes on.

Groups. In GRPO the G completions of a prompt share a gold answer, and parsing the gold costs about as much as
parsing an answer. With ``group_key="gold"``, a run of consecutive items with the same gold (at most
``max_group``) is one pebble task: one worker grades the whole group and parses its gold once, and the batch
pays one round trip per group instead of one per item (benchmarks/bench_math_pool.py, 2 workers against a
loop: ≈1.2x one task per item, ≈1.9–2.1x grouped). The task's limit is ``timeout_s`` per item, summed; if the
task times out or its worker dies, its items are graded again one by one, each under ``timeout_s``, so every
item still gets its own result and reason (the judge must be deterministic and free of side effects, which
both judges here are). The price: an item that hangs is found after up to ``(max_group + 1) * timeout_s``
instead of ``timeout_s``. Without ``group_key`` every item is its own task under ``timeout_s``.

``make_trl_reward_func`` wraps a pool as a TRL ``reward_funcs`` entry that also reports why each reward is
what it is (TRL's ``log_extra`` column and a running ``Counter`` on the function).

Workers start with ``spawn`` by default: the trainer process holds torch (and possibly CUDA) threads, and
forking a multi-threaded process can deadlock the child; spawned workers import only the judge's module
(≈0.5 s each, paid at pool start and when a killed worker is replaced). ``score_fn`` must therefore be a
module-level function of an importable module (``klear_lib.rewards.math.score_math``), not one defined in
a notebook.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import math
import multiprocessing
from collections.abc import Callable, Mapping, Sequence

import pebble

from klear_lib.rewards.result import RewardResult

#: Reasons the pool itself can give (the judge's own reasons pass through unchanged).
POOL_REASONS = {
    "timeout": "the item ran past the pool's timeout_s; its worker was killed and replaced",
    "crashed": "the worker process died while scoring the item (segfault, os._exit, SIGKILL, OOM)",
    "error": "score_fn raised, or returned something other than a RewardResult (detail says what)",
}

_DEADLINE = "batch deadline of the pool passed"
# Seconds allowed per wave of tasks on top of their limits, for a worker restart (spawn + imports) and IPC, in
# the batch-level safety net of score_batch (pebble's per-task timeout is what normally bounds a batch).
_RESTART_ALLOWANCE_S = 30.0


def _short(text: str, n: int = 500) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _error(failure_score: float, e: BaseException) -> RewardResult:
    return RewardResult(failure_score, "error", detail=_short(f"{type(e).__name__}: {e}"))


def _score_items(score_fn: Callable, items: list[dict], failure_score: float) -> list:
    """Runs in a worker: ``score_fn`` on each item in turn; an exception costs only its own item."""
    out = []
    for item in items:
        try:
            out.append(score_fn(**item))
        except Exception as e:  # noqa: BLE001 - the judge's failure is that item's "error"
            out.append(_error(failure_score, e))
    return out


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


class RewardPool:
    """A pebble ``ProcessPool`` that turns a batch of judge calls into a list of ``RewardResult`` (see module doc).

    Args:
        score_fn: picklable, module-level ``f(**item) -> RewardResult`` (e.g. ``score_math``).
        workers: worker processes (Klear: 10 for code; 2 on the project's 2-core machines).
        timeout_s: wall-clock limit per item, from the moment a worker starts it. Keep it above the judge's own
            budget (``score_math``'s ``timeout_s``, 5 s by default) so the judge can report its own ``timeout``.
        failure_score: the score of a timeout, a crash or an error (reference §5: −1).
        group_key: item key whose equal values, in consecutive items, make one task (``"gold"`` for
            ``score_math``); None: one task per item.
        max_group: the most items in one task; bounds how late a hung item in a group is found.
        start_method: multiprocessing start method of the workers: ``"spawn"`` (default, safe next to torch
            threads), ``"forkserver"`` or ``"fork"``.
        max_tasks: recycle a worker after this many tasks (0: never); bounds slow leaks of a judge.
        initializer, initargs: run once in each worker when it starts (e.g. warm the judge up).

    Use as a context manager (``with RewardPool(score_math) as pool: pool.score_batch(items)``), or call
    ``close()`` yourself; after either, no worker process is left.
    """

    def __init__(self, score_fn: Callable[..., RewardResult], *, workers: int = 2, timeout_s: float = 10.0,
                 failure_score: float = -1.0, group_key: str | None = None, max_group: int = 16,
                 start_method: str = "spawn", max_tasks: int = 0, initializer: Callable | None = None,
                 initargs: Sequence = ()):
        if workers < 1 or max_group < 1:
            raise ValueError(f"workers and max_group must be >= 1, got {workers} and {max_group}")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.score_fn = score_fn
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.failure_score = float(failure_score)
        self.group_key = group_key
        self.max_group = max_group
        self.start_method = start_method
        self._pool = pebble.ProcessPool(
            max_workers=workers, max_tasks=max_tasks, initializer=initializer, initargs=tuple(initargs),
            context=multiprocessing.get_context(start_method),
        )
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------------------
    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(wait=exc_type is None)

    def close(self, wait: bool = True) -> None:
        """Stop the workers and join them. ``wait=False`` kills running items instead of letting them finish."""
        if self._closed:
            return
        self._closed = True
        if wait:
            self._pool.close()  # no new tasks; running ones end within their limits
            try:
                self._pool.join(timeout=self.max_group * self.timeout_s + _RESTART_ALLOWANCE_S)
                return
            except TimeoutError:
                pass  # fall through to a hard stop: never leave a worker behind
        self._pool.stop()
        self._pool.join()

    # -- scoring ---------------------------------------------------------------------------------------------
    def score_batch(self, items: Sequence[Mapping]) -> list[RewardResult]:
        """``score_fn(**item)`` for each item, in the workers; results in input order, never an exception."""
        if self._closed:
            raise RuntimeError("RewardPool is closed")
        results: list[RewardResult | None] = [None] * len(items)
        again = []  # items of groups whose task timed out or died: graded one by one
        for group, outcome in self._run(items, _groups(items, self.group_key, self.max_group)):
            if isinstance(outcome, RewardResult) and len(group) > 1 and outcome.detail != _DEADLINE:
                again.extend(group)
            else:
                for i, r in zip(group, outcome if isinstance(outcome, list) else [outcome]):
                    results[i] = r
        for group, outcome in self._run(items, [[i] for i in again]):
            results[group[0]] = outcome if isinstance(outcome, RewardResult) else outcome[0]
        return results  # type: ignore[return-value]

    def score(self, **item) -> RewardResult:
        """One item through the pool (convenience for notebooks)."""
        return self.score_batch([item])[0]

    def _run(self, items: Sequence[Mapping], groups: list[list[int]]):
        """Schedule one task per group and yield ``(group, outcome)``: a list of per-item results, or one
        ``RewardResult`` when the task as a whole timed out, died or failed."""
        tasks = []
        for group in groups:
            try:
                future = self._pool.schedule(_score_items, timeout=self.timeout_s * len(group),
                                             args=(self.score_fn, [dict(items[i]) for i in group], self.failure_score))
            except Exception as e:  # noqa: BLE001 - e.g. a pool broken by the OS; report, don't raise
                future = _error(self.failure_score, e)
            tasks.append((group, future))
        # Safety net only: pebble's per-task timeout bounds each task; this bounds the batch if pebble itself were
        # ever wedged (waves of `workers` tasks, each within its limit plus a worker restart).
        pending = [f for _, f in tasks if not isinstance(f, RewardResult)]
        waves = math.ceil(len(pending) / self.workers)
        cf.wait(pending, timeout=(waves + 1) * (self.max_group * self.timeout_s + _RESTART_ALLOWANCE_S))
        for group, future in tasks:
            yield group, future if isinstance(future, RewardResult) else self._outcome(future, len(group))

    def _outcome(self, future, n: int) -> list[RewardResult] | RewardResult:
        fail = self.failure_score
        if not future.done():
            future.cancel()  # pebble kills the worker running it
            return RewardResult(fail, "timeout", detail=_DEADLINE)
        try:
            res = future.result()
        except TimeoutError as e:
            if e.args[:1] == ("Task timeout",):  # pebble's own; a TimeoutError of score_fn is caught in the worker
                return RewardResult(fail, "timeout", detail=f"item ran past {self.timeout_s:g} s")
            return _error(fail, e)
        except pebble.ProcessExpired as e:
            return RewardResult(fail, "crashed", detail=f"worker exit code {e.exitcode}")
        except BaseException as e:  # noqa: BLE001 - e.g. an item or a result that does not pickle
            return _error(fail, e)
        if not isinstance(res, list) or len(res) != n:
            return RewardResult(fail, "error", detail="malformed task result")
        return [r if isinstance(r, RewardResult) else
                RewardResult(fail, "error", detail=f"score_fn returned {type(r).__name__}, expected RewardResult")
                for r in res]


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
