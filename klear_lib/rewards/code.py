"""The code reward: run the response's last ```python block against the problem's tests in the sandbox.

Rule (reference §5, "Rewards / Code"):

1. Format. No ``</think>`` → ``no_think_close`` (a format failure, as in the math judge; ``<think>`` itself is
   not required, chat templates often put it in the prompt). The program is the LAST ```python block after
   the last ``</think>`` (```py and ```python3 are accepted too; an unclosed fence, e.g. a truncated response,
   is no block); none → ``no_code``. Both score the mode's failure score (reference: "none → −1" in the
   released code's signed scale), configurable as ``no_code_score`` / ``no_think_close_score``.
2. Tests. At most ``max_tests`` (16) tests per sample, a seeded sample of them when there are more. A
   stdin/stdout test ``{"input", "output"}`` runs the program once with that stdin and passes if it exits with
   status 0 in time and its stdout equals the expected output, both stripped, compared line by line with
   trailing whitespace stripped. A function-call test ``{"fn_name", "args", "expected"}`` passes if
   ``fn(*args)`` (a top-level function, else a method of a top-level ``class Solution``) returns a value equal
   to ``expected`` after a JSON round trip (tuples compare as lists; integers of any size compare exactly).
   All tests of a sample run in ONE sandbox (``sandbox.run_python_tests``), each in a fresh process forked from
   a warm interpreter, on a fresh /tmp, with its own ``timeout_s`` of CPU time (all its processes; a wall-clock
   backstop of 3x + 1 s ends one that waits): a test that hangs, crashes or floods its output costs that test
   only, and a busy machine slows tests without failing them. A test's stdout and result are each capped at 4x
   the sample's longest expected output (at least 1 MiB): past it, ``wrong``; its stderr (a log, not the answer)
   is truncated at that size, with a mark, and never fails it.
3. Score from k passed of n run (paper vs released code, reference §5):

       soft   = k / n            (the paper; 4 of 16 → 0.25)        failure score 0.0
       signed = 2·k / n − 1      (the released code)                failure score −1.0
       hard   = 1 if k = n else 0 (the paper's all-or-nothing ablation) failure score 0.0

   The failure score of a mode, ``failure_score(mode)``, is its score for 0 passed: that of every response that
   passes nothing (wrong, timed out, crashed, no code), and the score every caller must give a failure of the
   judging itself (a ``RewardPool`` timeout or dead worker, a judge error), so that no failure of any kind
   scores above an honest wrong answer, nor below it, in any mode. Under group normalisation soft and signed
   give the same advantages; their failure scores do not, which is why each mode has its own (matching Klear's
   "timeout or crash → −1" in the signed scale).

Every result is a ``RewardResult`` whose ``reason`` is one of ``REASONS``, with ``passed``/``total`` = k/n
(for ``no_code`` / ``no_think_close``: 0 of the tests that would have run).

Trust. Nothing a program does can raise here: its output is compared as text, and a function-call result is
decoded as hostile bytes (``sandbox_json``: malformed, too deep, too large, invalid UTF-8, huge integers all
give ``wrong`` with the reason); any other failure while judging a response is ``judge_error`` at the failure
score. The result record is written from the program's own process, so the program can only claim its own
test's value, which it could as well have returned; the expected values never enter the sandbox. A malformed
test (a data error) still raises ``ValueError`` naming it, before anything runs.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass

from klear_lib.rewards import sandbox_json
from klear_lib.rewards.result import DataError, RewardResult, build_options
from klear_lib.rewards.sandbox import FunctionCall, SandboxResult, SandboxUnavailableError, run_python_tests

THINK_CLOSE = "</think>"

#: Every reason ``score_code`` can give, and what it means.
REASONS = {
    "all_passed": "every selected test passed",
    "some_passed": "at least one but not every selected test passed",
    "none_passed": "no test passed and at least one ran to completion with a wrong answer",
    "timeout": "every selected test timed out",
    "crashed": "no test passed; every test crashed (non-zero exit, signal, exception) or timed out",
    "no_code": "no closed ```python block after the last </think>",
    "no_think_close": "the response has no </think> (format failure)",
    "judge_error": "judging the response failed (a bug, never the response's doing); it scores the failure score",
}

#: Score from (passed, total) per reward mode, and the score of a format failure in that mode (reference §5).
MODES = {
    "soft": lambda k, n: k / n,
    "signed": lambda k, n: 2.0 * k / n - 1.0,
    "hard": lambda k, n: 1.0 if k == n else 0.0,
}
FAILURE_SCORES = {mode: score(0, 1) for mode, score in MODES.items()}  # soft 0.0, signed -1.0, hard 0.0


def failure_score(mode: str) -> float:
    """The score of a failure in reward mode ``mode``: its score for 0 tests passed (module docstring, rule 3).
    Every caller that scores a failure of its own (a pool's timeout, a dead worker) must use this."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; valid: {', '.join(MODES)}")
    return FAILURE_SCORES[mode]


POOL_START_S = 5.0  # a reward pool worker's own start-up on top of the sandbox's deadline, in `pool_limit_s`


def pool_limit_s(timeout_s: float | None = None, max_tests: int | None = None) -> float:
    """The limit per sample that every reward pool of ``score_code`` must give (``RewardPool(timeout_s=...)``):
    the sandbox's own deadline for ``max_tests`` tests at ``timeout_s`` seconds of CPU each
    (``sandbox.sample_budget_s``; both default to ``CodeRewardOptions``'), plus ``POOL_START_S``. A slow
    program is then judged by the sandbox (its tests time out: an honest wrong answer with its reason), never
    abandoned by the pool, and a correct program with slow tests is never scored ``timeout``. At the defaults
    (16 tests, 6 s): 10 + 16 x (19 + 6 + 2 + 4) + 5 = 511 s."""
    from klear_lib.rewards.sandbox import sample_budget_s

    defaults = CodeRewardOptions()
    return sample_budget_s(defaults.max_tests if max_tests is None else max_tests,
                           defaults.timeout_s if timeout_s is None else timeout_s) + POOL_START_S


OUTPUT_CAP_FLOOR = 1 << 20  # see `output_cap`
_FENCE = re.compile(r"```[ \t]*(?:python3|python|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class CodeRewardOptions:
    """Options of ``score_code``; every field is a keyword of ``score_code``."""

    max_tests: int = 16
    """Most tests run per sample (reference §5: up to 16); more are subsampled with ``seed``."""
    seed: int = 0
    """Seed of the test subsample, so that every response to one problem meets the same tests."""
    timeout_s: float = 6.0
    """CPU-time limit per test, in seconds, over all its processes (LiveCodeBench's default, there wall time);
    a test that waits instead of computing meets a wall-clock backstop of 3x + 1 s (``sandbox.wall_limit_s``)."""
    memory_mb: int = 1024
    """Address-space limit of the program (RLIMIT_AS), in MiB."""
    no_code_score: float | None = None
    """Score of ``no_code``; None: the mode's failure score (``FAILURE_SCORES``)."""
    no_think_close_score: float | None = None
    """Score of ``no_think_close``; None: the mode's failure score."""
    hide_paths: tuple[str, ...] = ()
    """Host directories to hide should they lie inside what the sandbox shows (the interpreter's own directories);
    the sandbox shows nothing else of the host, so datasets and caches with the tests are out of reach anyway."""
    require_think_close: bool = True
    """False: a response without ``</think>`` is searched whole for code (for non-thinking models)."""
    unsafe_no_sandbox: bool = False
    """Run the programs without bubblewrap (warns every call). Only for machines where bwrap cannot run."""

    def __post_init__(self):
        if self.max_tests < 1:
            raise ValueError(f"max_tests must be >= 1, got {self.max_tests}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CodeRewardOptions))


def make_options(**options) -> CodeRewardOptions:
    """Build ``CodeRewardOptions``; an unknown option is a TypeError that lists the valid ones."""
    return build_options(CodeRewardOptions, "code reward", options)


@dataclass(frozen=True)
class TestOutcome:
    """One test's fate: ``status`` is ``passed``, ``wrong``, ``timeout`` or ``crashed``."""

    status: str
    detail: str = ""


def score_code(response: str, tests: list[dict], *, mode: str = "soft", **options) -> RewardResult:
    """Reward one response to a coding problem with the tests of that problem (rule in the module docstring).

    >>> score_code("<think>..</think>```python\\nprint(int(input())*2)\\n```", [{"input": "2", "output": "4"}])
    RewardResult(score=1.0, reason='all_passed', passed=1, total=1, detail='1/1 passed')
    """
    failure = failure_score(mode)
    opts = make_options(**options)
    chosen = select_tests(tests, opts.max_tests, opts.seed)
    expected = [_expected(t, i) for i, t in enumerate(chosen)]  # a data error raises here, before anything runs
    if not isinstance(response, str):
        return RewardResult(failure, "judge_error", 0, len(chosen), f"the response is a {type(response).__name__}")
    if THINK_CLOSE not in response and opts.require_think_close:
        score = failure if opts.no_think_close_score is None else opts.no_think_close_score
        return RewardResult(score, "no_think_close", 0, len(chosen), "no </think> in the response")
    program = extract_code(response)
    if program is None:
        score = failure if opts.no_code_score is None else opts.no_code_score
        return RewardResult(score, "no_code", 0, len(chosen), "no ```python block after the last </think>")
    try:
        outcomes = run_tests(program, chosen, opts, expected)
    except (SandboxUnavailableError, KeyboardInterrupt):
        raise  # the machine cannot sandbox at all: a configuration error, never a score
    except Exception as e:  # noqa: BLE001 - nothing a response does may raise into training, nor pay
        return RewardResult(failure, "judge_error", 0, len(chosen), f"{type(e).__name__}: {str(e)[:200]}")
    k, n = sum(o.status == "passed" for o in outcomes), len(outcomes)
    return RewardResult(MODES[mode](k, n), _reason(outcomes), k, n, _summary(outcomes))


def parse_tests(text: str | bytes):
    """A problem's tests from JSON text (a record's ground truth), integers of any size included (``json.loads``
    raises past 4,300 digits; these become ``sandbox_json.LongInt``)."""
    return sandbox_json.loads(text)


def extract_code(response: str) -> str | None:
    """The last ```python block after the last ``</think>`` (the whole response if there is none), or None."""
    answer = response.rsplit(THINK_CLOSE, 1)[-1]
    blocks = _FENCE.findall(answer)
    return blocks[-1] if blocks else None


def select_tests(tests: list[dict], max_tests: int, seed: int) -> list[dict]:
    """At most ``max_tests`` tests, in their original order; a subsample fixed by ``seed`` when there are more."""
    if not tests:
        raise DataError("a code problem needs at least one test")
    for t in tests:
        _test_kind(t)  # a malformed test is a data error: fail loudly before running anything
    if len(tests) <= max_tests:
        return list(tests)
    keep = sorted(random.Random(seed).sample(range(len(tests)), max_tests))
    return [tests[i] for i in keep]


def run_tests(program: str, tests: list[dict], opts: CodeRewardOptions, expected: list | None = None) \
        -> list[TestOutcome]:
    """One outcome per test, in order, from ONE sandbox for the sample: each test in a fresh process.
    ``expected``: the tests' normalized expected values (``_expected``), computed here when not given."""
    if expected is None:
        expected = [_expected(t, i) for i, t in enumerate(tests)]
    runs = [test["input"] if _test_kind(test) == "stdio" else FunctionCall(test["fn_name"], list(test["args"]))
            for test in tests]
    results = run_python_tests(program, runs, timeout_s=opts.timeout_s, memory_mb=opts.memory_mb,
                               max_output_bytes=output_cap(tests, expected), hide_paths=tuple(opts.hide_paths),
                               unsafe_no_sandbox=opts.unsafe_no_sandbox)
    return [_judge(test, want, r, opts) for test, want, r in zip(tests, expected, results)]


def output_cap(tests: list[dict], expected: list | None = None) -> int:
    """Bytes of stdout (and of a result) a test may write before it is killed as ``wrong``, and of stderr kept
    (truncated past it, never a failure): 4x the longest expected output of the sample, at least
    ``OUTPUT_CAP_FLOOR``. Far past the answer's size a program cannot pass any more, and a sample's results (up to
    16 tests, both streams) then stay a few MiB in the reward worker."""
    if expected is None:
        expected = [_expected(t, i) for i, t in enumerate(tests)]
    sizes = [len(t["output"]) if _test_kind(t) == "stdio" else sandbox_json.json_size(want)
             for t, want in zip(tests, expected)]
    return max(OUTPUT_CAP_FLOOR, 4 * max(sizes))


def _test_kind(test: dict) -> str:
    if isinstance(test, dict) and {"input", "output"} <= test.keys():
        return "stdio"
    if isinstance(test, dict) and {"fn_name", "args", "expected"} <= test.keys():
        return "call"
    raise DataError(f"unknown test format {str(test)[:200]!r}; expected {{'input', 'output'}} "
                     "(stdin/stdout) or {'fn_name', 'args', 'expected'} (function call)")


def _expected(test: dict, i: int):
    """A function-call test's expected value as a result decodes (``sandbox_json.normalize_expected``); None for
    a stdin/stdout test. ValueError naming the test when it is not a JSON value."""
    if _test_kind(test) == "stdio":
        if not isinstance(test["output"], str) or not isinstance(test["input"], str):
            raise DataError(f"test {i}: 'input' and 'output' must be str, got {type(test['input']).__name__} and "
                             f"{type(test['output']).__name__}")
        return None
    try:
        return sandbox_json.normalize_expected(test["expected"])
    except (TypeError, RecursionError) as e:
        raise DataError(f"test {i} ({test['fn_name']!r}): its expected value is not JSON: {e}") from None


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _judge(test: dict, want, r: SandboxResult, opts: CodeRewardOptions) -> TestOutcome:
    if r.timed_out:
        if r.cpu_s >= opts.timeout_s:
            return TestOutcome("timeout", f"more than {opts.timeout_s:g} s of CPU time")
        return TestOutcome("timeout", f"still running after {r.duration_s:.1f} s of wall time")
    if r.output_limit_exceeded:
        return TestOutcome("wrong", "output limit exceeded")
    if r.returncode != 0:
        return TestOutcome("crashed", _crash_detail(r))
    if _test_kind(test) == "stdio":
        if _lines(r.stdout) == _lines(test["output"]):
            return TestOutcome("passed")
        return TestOutcome("wrong", f"expected {_short(test['output'].strip())}, got {_short(r.stdout.strip())}")
    if not r.returned:  # exit status 0 before the call returned: sys.exit(0) at the top level, os._exit(0), ...
        return TestOutcome("crashed", "the program exited before the call returned")
    if not r.value_is_json:
        return TestOutcome("wrong", f"result not JSON: {str(r.value)[:300]}")
    if sandbox_json.equal(r.value, want):
        return TestOutcome("passed")
    return TestOutcome("wrong", f"expected {_short(want)}, got {_short(r.value)}")


def _crash_detail(r: SandboxResult) -> str:
    if r.memory_exceeded and r.killed_by_signal == 9:
        return "killed at the sample's memory cap"
    if r.killed_by_signal:
        return f"killed by signal {r.killed_by_signal}"
    last = r.stderr.strip().splitlines()[-1:] or [""]
    return f"exit status {r.returncode}: {last[0][:200]}"


def _reason(outcomes: list[TestOutcome]) -> str:
    statuses = [o.status for o in outcomes]
    k = statuses.count("passed")
    if k == len(statuses):
        return "all_passed"
    if k:
        return "some_passed"
    if all(s == "timeout" for s in statuses):
        return "timeout"
    if all(s in ("timeout", "crashed") for s in statuses):
        return "crashed"
    return "none_passed"


def _summary(outcomes: list[TestOutcome]) -> str:
    k = sum(o.status == "passed" for o in outcomes)
    text = f"{k}/{len(outcomes)} passed"
    first = next(((i, o) for i, o in enumerate(outcomes) if o.status != "passed"), None)
    if first:
        text += f"; test {first[0]}: {first[1].status}" + (f" ({first[1].detail})" if first[1].detail else "")
    return text


def _short(value, limit: int = 80) -> str:
    return sandbox_json.short(value, limit)
