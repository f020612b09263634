"""What sits on a ``RewardPool`` (``klear_lib.rewards.pool``): ``MemoPool``, which judges each distinct item once
(keys from the full text of every value: ``canonical``), and ``make_trl_reward_func``, which makes a pool a TRL reward
function that keeps each batch's results (``last_results``) and counts their reasons."""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence

from klear_lib.rewards.pool import POOL_REASONS, RewardPool
from klear_lib.rewards.result import RewardResult

__all__ = ["MemoPool", "canonical", "completion_text", "make_trl_reward_func"]


class MemoPool:
    """A ``RewardPool`` that judges each distinct item once: the same ``score_batch`` interface, items compared as
    JSON (keys sorted), within a batch and across batches. For a deterministic judge on deterministic programs
    (the tiny code task's: pure functions of their input) this changes no score and saves most of the sandbox time
    once a policy repeats itself (the G samples of a group, the held-out problems evaluated again). Results whose
    reason is in ``uncached`` (the pool's own failures and timeouts, which depend on the machine's load) are not
    kept, so the next identical item is judged again. A judge with randomness or wall-clock dependence would get
    its first answer every time: do not use it there.

    ``judged`` counts the items sent to the pool, ``hits`` those answered from the memo. An item holding a value
    ``key`` cannot write exactly (an object of another type) is judged every time, never answered from the memo.
    """

    def __init__(self, pool, *, uncached=("timeout", *POOL_REASONS)):
        self.pool = pool
        self.uncached = frozenset(uncached)
        self.memo: dict[str, RewardResult] = {}
        self.judged = 0
        self.hits = 0

    @staticmethod
    def key(item: Mapping) -> str | None:
        """The item's full text, one way only (`canonical`): two items share a key only when every value in
        them is equal, integers of any size and `sandbox_json.LongInt`s digit for digit. None when a value has
        no exact text (the item is then judged, never memoised)."""
        try:
            return canonical(item)
        except TypeError:
            return None

    def score_batch(self, items: Sequence[Mapping]) -> list[RewardResult]:
        keys = [self.key(it) for it in items]
        keys = [k if k is not None else (None, i) for i, k in enumerate(keys)]  # no exact key: judged alone
        todo: dict = {}
        for k, it in zip(keys, items):
            if k not in self.memo and k not in todo:
                todo[k] = it
        fresh = dict(zip(todo, self.pool.score_batch(list(todo.values())))) if todo else {}
        self.judged += len(todo)
        self.hits += len(items) - len(todo)
        for k, r in fresh.items():
            if r.reason not in self.uncached and isinstance(k, str):
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


def canonical(value) -> str:
    """One text per value, never the same text for two different values: each value is tagged with its type
    (so 1, 1.0, True and "1" differ), strings are JSON-escaped, integers written in full (decimal, or hexadecimal
    past Python's 4,300-digit conversion limit, under another tag), `LongInt`s by all their digits, floats by
    their shortest exact repr, and a mapping's pairs sorted by their keys' own canonical text (so int and str
    keys mix without raising, and never merge: ``{1: x}`` and ``{"1": x}`` differ). Lists and tuples are
    sequences alike. TypeError for a value of any other type (its text could be lossy)."""
    import json

    from klear_lib.rewards.sandbox_json import LongInt

    out: list[str] = []
    stack: list = [value]
    while stack:  # an explicit stack: a deeply nested item cannot raise RecursionError here
        v = stack.pop()
        if isinstance(v, _Mark):
            out.append(v.text)
        elif v is None or isinstance(v, bool):
            out.append({None: "n", True: "t", False: "f"}[v])
        elif isinstance(v, int):
            out.append(f"i{v};" if v.bit_length() < 13_000 else f"x{v:x};")  # < 3,914 digits: str() is safe
        elif isinstance(v, LongInt):
            out.append(f"L{v.text};")
        elif isinstance(v, float):
            out.append(f"d{v!r};")
        elif isinstance(v, str):
            out.append("s" + json.dumps(v))
        elif isinstance(v, (bytes, bytearray)):
            out.append(f"b{bytes(v).hex()};")
        elif isinstance(v, (list, tuple)):
            stack.append(_Mark("]"))
            for i in range(len(v) - 1, -1, -1):
                stack.append(v[i])
                if i:
                    stack.append(_Mark(","))
            stack.append(_Mark("["))
        elif isinstance(v, Mapping):
            pairs = sorted(((canonical(k), x) for k, x in v.items()), key=lambda p: p[0])
            stack.append(_Mark("}"))
            for i in range(len(pairs) - 1, -1, -1):
                stack.append(pairs[i][1])
                stack.append(_Mark(("," if i else "") + pairs[i][0] + ":"))
            stack.append(_Mark("{"))
        else:
            raise TypeError(f"no exact text for a {type(v).__name__}")
    return "".join(out)


class _Mark:
    """Punctuation on `canonical`'s stack (never confused with a value: every value is tagged)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text
