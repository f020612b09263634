"""The math judge: Klear's ``<think>`` format rule, then math-verify on the text after the last ``</think>``.

Rule (reference §5, "Rewards / Math"):

0. Gold. A gold answer that is missing (None, NaN, blank, not a str or a number) or that math-verify cannot turn
   into a math expression is ``gold_error``: a data problem, counted apart from ``wrong``, checked before the
   format so that every completion of such a prompt gets the same ``gold_error_score`` (−1 by default, the
   pool's failure score). GRPO normalises rewards within a prompt's group, so a constant score gives that prompt
   zero advantage whatever its value: bad data teaches nothing instead of teaching "skip the format".
   (A departure: neither the paper nor the released code has this rule; there such a gold answer scores every
   completion by its format, and a well-formatted one −1.)
1. Format. The released code (Kwai-Klear ``math_dapo.compute_score(..., is_longcot=True)``) checks, in this
   order: no ``</think>`` → −0.5; else no ``<think>`` → −2.0. The paper only says the format is required;
   ``format_rule="paper"`` reads that as "a format failure is a wrong answer" (−1). ``format_rule="none"``
   skips the check (the answer is then the whole response when it has no ``</think>``).
2. Answer. The text after the LAST ``</think>`` is parsed with math-verify (LaTeX first, ``\\boxed{}`` first
   among LaTeX; then plain expressions), the gold answer too, and ``verify(gold, answer)`` decides: ±1.

Every judgement is a ``RewardResult`` whose ``reason`` is one of ``REASONS``.

What math-verify 0.9 accepts (the agreement table in tests/test_reward_math.py, 114 of 126 cases agree with
the mathematical verdict): equivalent numbers and expressions (3/4 = 0.75 = \frac{6}{8}, 2\\sqrt{2} = \\sqrt{8},
x = 3 for 3), sets, intervals, tuples and matrices; ``\text{}`` units and degree signs are dropped (5 cm = 5,
30° = 30, but 30° ≠ π/6); ``p\\%`` equals p/100 and, leniently, also p (50 passes for 50%); numbers are compared
after rounding to 6 decimals (0.3333333 passes for 1/3); unicode ½, √2, π are not read.

Timeouts. The budget, ``timeout_s``, is CPU time of the grading process for the whole judgement (gold parse,
answer parse, verification), never wall time: a loaded machine slows a judgement down without failing it (a
correct answer, or the gold itself, timing out under load). math-verify's own timeouts (``signal.alarm``, wall
time, whole seconds) are turned off; ``score_math`` arms one ``ITIMER_PROF`` timer instead (SIGPROF after
``timeout_s`` of this process's user + system time), whose handler raises math-verify's ``TimeoutException``, and
which fires again every ``REFIRE_S`` of CPU after that: a raise that lands where Python swallows it (a
finalizer, a library's ``except BaseException``) is repeated, and a judgement that went past its budget is
``timeout`` whatever it returns. Signals only reach a process's main thread: called from another thread
``score_math`` raises; grade through ``klear_lib.rewards.pool.RewardPool``, whose workers run it in their main
threads. A signal cannot interrupt a long C-level routine (a big-integer power inside sympy, say): the raise then
comes only when that routine returns, minutes later. Only a process kill bounds that case, which is why training
grades through the pool (its per-item limit, wall time, kills the worker and scores the item ``timeout``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import re
import signal
import threading
from dataclasses import dataclass
from itertools import product

from math_verify import parse, verify
from math_verify.errors import TimeoutException

from klear_lib.data import tasks
from klear_lib.rewards.result import RewardResult, build_options

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

#: Every reason ``score_math`` can give, and what it means.
REASONS = {
    "correct": "the answer after </think> verifies against the gold answer",
    "wrong": "an answer was parsed but does not verify",
    "no_think_close": "the response has no </think> (format failure)",
    "no_think_open": "the response has </think> but no <think> (format failure)",
    "no_answer": "nothing math-verify can extract after the last </think>",
    "timeout": "parsing or verifying the answer ran past timeout_s",
    "parse_error": "math-verify found an answer but could not turn it into a math expression",
    "gold_error": "the gold answer is missing or math-verify cannot parse it (a data problem, not the model's)",
}

FORMAT_RULES = tasks.FORMAT_RULES  # one list of rules for every judge (klear_lib.data.tasks)


@dataclass(frozen=True)
class MathRewardOptions:
    """Options of ``score_math``; every field is a keyword of ``score_math``."""

    correct_score: float = 1.0
    """Score of a verified answer (reference §5: ±1)."""
    wrong_score: float = -1.0
    """Score of a wrong, missing, unparseable or timed-out answer, and of a format failure under ``"paper"``."""
    no_think_close_score: float = -0.5
    """Released code: score of a response without ``</think>`` (checked first)."""
    no_think_open_score: float = -2.0
    """Released code: score of a response with ``</think>`` but without ``<think>``."""
    gold_error_score: float = -1.0
    """Score of any response to a prompt whose gold answer is missing or unparsable (see rule 0: the value does
    not move GRPO's advantages, since the whole group gets it; −1 is the pool's failure score)."""
    format_rule: str = "released"
    """``"released"`` (the −0.5 / −2.0 penalties above), ``"paper"`` (format failure → ``wrong_score``), or
    ``"none"`` (no format check)."""
    timeout_s: float = 5.0
    """CPU-time budget of the grading process for the whole judgement (gold parse, answer parse, verification),
    in seconds (module docstring, "Timeouts")."""

    def __post_init__(self):
        if self.format_rule not in FORMAT_RULES:
            raise ValueError(f"format_rule={self.format_rule!r}; valid: {', '.join(FORMAT_RULES)}")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}")


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(MathRewardOptions))


def make_options(**options) -> MathRewardOptions:
    """Build ``MathRewardOptions``; an unknown option is a TypeError that lists the valid ones."""
    return build_options(MathRewardOptions, "math reward", options)


REFIRE_S = 0.1  # once the budget is spent, SIGPROF comes again after every REFIRE_S of CPU time


class _CpuBudget:
    """One budget of this process's CPU time for a whole judgement (module docstring, "Timeouts").

    ``ITIMER_PROF`` counts user + system time of the process and delivers SIGPROF; the handler raises
    ``TimeoutException`` while the budget is armed (and notes that it expired), never after ``disarm``. A raise
    can land inside ``disarm`` itself, before it took effect: the caller then disarms again (the next SIGPROF is
    ``REFIRE_S`` of CPU away, a disarm takes microseconds)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.armed = self.expired = False
        self.previous = None
        self.phase = "parsing the gold"

    def _on_sigprof(self, signum, frame):
        if self.armed:
            self.expired = True
            raise TimeoutException(f"the judgement ran past {self.seconds:g} s of CPU time ({self.phase})")

    def arm(self) -> None:
        self.previous = signal.signal(signal.SIGPROF, self._on_sigprof)
        self.armed = True
        signal.setitimer(signal.ITIMER_PROF, self.seconds, REFIRE_S)

    def disarm(self) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        if self.previous is not None:
            signal.signal(signal.SIGPROF, self.previous)
            self.previous = None


class _NoTimeoutWarning(logging.Filter):
    """math-verify warns, once per process, that its timeouts are off: here they are off on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().lstrip().startswith("Timeout is disabled")


for _logger in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_logger).addFilter(_NoTimeoutWarning())


def _is_math(x) -> bool:
    # parse() returns sympy objects first and, as a fallback, the raw matched string.
    return not isinstance(x, str)


_MATH_DELIMITER = re.compile(r"(?<!\\)\$|\\\(|\\\[")  # $ (not the escaped currency sign \$), \( or \[


def gold_source(gold: str) -> str:
    """The gold answer as math-verify's LaTeX extractor wants it.

    Gold answers come bare (``3/4``, ``\\frac{3}{4}``, ``(1, 2]``); bare LaTeX is only found inside a math
    environment, so a gold without one is wrapped in ``\\boxed{}`` (the released code does the same).
    """
    gold = str(gold).strip()
    if "\\boxed" in gold or _MATH_DELIMITER.search(gold):
        return gold
    return f"\\boxed{{{gold}}}"


_GOLD_CACHE: collections.OrderedDict[str, tuple] = collections.OrderedDict()
_GOLD_CACHE_SIZE = 4096


def _parse_gold_cached(src: str, budget: _CpuBudget) -> tuple:
    """A group of G completions shares one gold: parse it once per worker. Neither a raise nor a parse that ran
    past the budget (its timeout swallowed somewhere, its result unsure) is cached."""
    if src in _GOLD_CACHE:
        _GOLD_CACHE.move_to_end(src)
        return _GOLD_CACHE[src]
    parsed = tuple(parse(src, parsing_timeout=None, raise_on_error=True))
    if not budget.expired:
        _GOLD_CACHE[src] = parsed
        while len(_GOLD_CACHE) > _GOLD_CACHE_SIZE:
            _GOLD_CACHE.popitem(last=False)
    return parsed


def _missing_gold(gold) -> str | None:
    """Why ``gold`` is no answer at all (None, NaN from a data frame, blank, a list ...), or None if it is one."""
    if gold is None:
        return "gold answer is None"
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        return f"gold answer is {type(gold).__name__} ({_short(repr(gold))}), expected str or a number"
    if isinstance(gold, float) and not math.isfinite(gold):
        return f"gold answer is {gold!r} (a missing value)"
    if isinstance(gold, str) and not gold.strip():
        return "gold answer is blank"
    return None


def _parse_gold(gold, budget: _CpuBudget) -> tuple | str:
    """The gold answer parsed by math-verify, or why it cannot be graded against (a ``gold_error`` detail).
    ``TimeoutException`` passes through (`score_math` says where the budget ran out)."""
    missing = _missing_gold(gold)
    if missing:
        return missing
    try:
        parsed = _parse_gold_cached(gold_source(gold), budget)
    except Exception as e:  # noqa: BLE001 - any failure of the gold is a data problem, reported as such
        return f"{type(e).__name__} on gold {_short(str(gold))}"
    if not any(_is_math(g) for g in parsed):  # nothing, or only the raw text back: not a math expression
        return f"math-verify finds no math expression in gold {_short(str(gold))}"
    return parsed


def extract_answer(response: str) -> str:
    """The text after the last ``</think>`` (the whole response when there is none)."""
    return response.rsplit(THINK_CLOSE, 1)[-1]


def _format_failure(response: str, opts: MathRewardOptions) -> RewardResult | None:
    """Reference §5: released code checks ``</think>`` first (−0.5), then ``<think>`` (−2.0)."""
    if opts.format_rule == "none":
        return None
    for tag, reason, released_score in ((THINK_CLOSE, "no_think_close", opts.no_think_close_score),
                                        (THINK_OPEN, "no_think_open", opts.no_think_open_score)):
        if tag not in response:
            score = released_score if opts.format_rule == "released" else opts.wrong_score
            return RewardResult(score, reason)
    return None


def _short(x, n: int = 120) -> str:
    s = x if isinstance(x, str) else type(x).__name__  # never str() a sympy object: it can hang
    return s if len(s) <= n else s[:n] + "..."


def score_math(response: str, gold: str, **options) -> RewardResult:
    """Klear's math reward of one ``response`` against the ``gold`` answer (reference §5).

    Options (see ``MathRewardOptions``): ``correct_score=1.0, wrong_score=-1.0, no_think_close_score=-0.5,
    no_think_open_score=-2.0, gold_error_score=-1.0, format_rule="released"|"paper"|"none", timeout_s=5.0``.

    >>> score_math("<think>3 quarters</think> The answer is $\\\\frac{3}{4}$.", "0.75")
    RewardResult(score=1.0, reason='correct', passed=None, total=None, detail='')
    >>> score_math("<think>...", "1").reason
    'no_think_close'

    Must run in a process's main thread (its CPU-time budget is a signal, SIGPROF); elsewhere it raises
    RuntimeError.
    """
    opts = make_options(**options)
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "score_math needs a process's main thread: its CPU-time budget is a signal (SIGPROF), which only "
            "reaches that thread. Grade from threads through klear_lib.rewards.pool.RewardPool (a process pool)."
        )
    response = "" if response is None else str(response)
    budget = _CpuBudget(opts.timeout_s)
    try:
        try:
            budget.arm()
            result = _judge(response, gold, opts, budget)
        finally:
            budget.disarm()
    except TimeoutException:
        budget.disarm()  # again: the raise may have come inside the first disarm, before it took effect
        result = None
    if result is not None and not budget.expired:
        return result
    # Past the budget: timed out, whatever the judgement returned (a raise swallowed on the way makes it unsure).
    if budget.phase == "parsing the gold":
        return RewardResult(opts.gold_error_score, "gold_error", detail=f"timed out parsing gold {_short(str(gold))} "
                            f"(more than {opts.timeout_s:g} s of CPU time)")
    return RewardResult(opts.wrong_score, "timeout", detail=f"{budget.phase} (more than {opts.timeout_s:g} s of CPU "
                        f"time)")


def _judge(response: str, gold, opts: MathRewardOptions, budget: _CpuBudget) -> RewardResult:
    """`score_math` under its armed budget; ``TimeoutException`` passes through."""
    gold_parsed = _parse_gold(gold, budget)
    if isinstance(gold_parsed, str):
        return RewardResult(opts.gold_error_score, "gold_error", detail=gold_parsed)

    failed = _format_failure(response, opts)
    if failed is not None:
        return failed
    wrong = functools.partial(RewardResult, opts.wrong_score)

    answer_text = extract_answer(response)
    if not answer_text.strip():
        return wrong("no_answer", detail="empty after </think>")

    budget.phase = "parsing the answer"
    try:
        answer = parse(answer_text, parsing_timeout=None, raise_on_error=True)
    except Exception as e:  # noqa: BLE001 - sympy/antlr raise many types on malformed input
        return wrong("parse_error", detail=f"{type(e).__name__}: {_short(str(e))}")
    if not answer:
        return wrong("no_answer", detail="math-verify found no answer after </think>")

    # verify(gold, answer) is "any (gold, answer) pair matches". It is run pair by pair here so that a comparison
    # that errors costs only its pair, and all pairs share the one budget (a timeout ends the judgement); exact-text
    # pairs go first, so an answer written exactly like the gold is not lost to a slow symbolic comparison.
    budget.phase = "verifying the answer"
    pairs = sorted(product(gold_parsed, answer), key=lambda p: _is_math(p[0]) or _is_math(p[1]))
    for g, a in pairs:
        try:
            if verify(g, a, timeout_seconds=None, raise_on_error=True):
                return RewardResult(opts.correct_score, "correct")
        except Exception:  # noqa: BLE001 - math-verify's own default: a comparison that errors is False
            continue
    if not any(_is_math(a) for a in answer):
        # Found (e.g. "\\frac{1}{") but only as text: compared as a string, and it did not match.
        return wrong("parse_error", detail=f"answer only as text {_short(answer[-1])}")
    return wrong("wrong", detail=f"answer {_short(answer[-1])}")
