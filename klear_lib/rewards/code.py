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
   to ``expected`` after a JSON round trip (tuples compare as lists). All tests of a sample run in ONE sandbox
   (``sandbox.run_python_tests``), each in a fresh process forked from a warm interpreter, with its own
   ``timeout_s``: a test that hangs, crashes or floods its output costs that test only. A test's stdout and
   stderr are each capped at 4x the sample's longest expected output (at least 1 MiB): past it, ``wrong``.
3. Score from k passed of n run (paper vs released code, reference §5):

       soft   = k / n            (the paper; 4 of 16 → 0.25)        failure score 0.0
       signed = 2·k / n − 1      (the released code)                failure score −1.0
       hard   = 1 if k = n else 0 (the paper's all-or-nothing ablation) failure score 0.0

   Under group normalisation soft and signed give the same advantages; their failure scores do not, which is
   why each mode has its own (a program that times out or crashes on every test scores 0 passed, i.e. exactly
   the failure score, matching Klear's "timeout or crash → −1" in the signed scale).

Every result is a ``RewardResult`` whose ``reason`` is one of ``REASONS``, with ``passed``/``total`` = k/n
(for ``no_code`` / ``no_think_close``: 0 of the tests that would have run).

Trust. A function-call test's result is written by harness code inside the program's own process, so a
program written to tamper with it (find the result descriptor and the per-test nonce in its memory) could fake
passes; stdin/stdout tests cannot be forged that way (their output is read and judged outside the sandbox).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from dataclasses import dataclass

from klear_lib.rewards.result import RewardResult, build_options
from klear_lib.rewards.sandbox import FunctionCall, SandboxResult, run_python_tests

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
}

#: Score from (passed, total) per reward mode, and the score of a format failure in that mode (reference §5).
MODES = {
    "soft": lambda k, n: k / n,
    "signed": lambda k, n: 2.0 * k / n - 1.0,
    "hard": lambda k, n: 1.0 if k == n else 0.0,
}
FAILURE_SCORES = {"soft": 0.0, "signed": -1.0, "hard": 0.0}

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
    """Wall-clock limit per test, in seconds (LiveCodeBench's default)."""
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
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; valid: {', '.join(MODES)}")
    opts = make_options(**options)
    chosen = select_tests(tests, opts.max_tests, opts.seed)
    failure = FAILURE_SCORES[mode]
    if THINK_CLOSE not in response and opts.require_think_close:
        score = failure if opts.no_think_close_score is None else opts.no_think_close_score
        return RewardResult(score, "no_think_close", 0, len(chosen), "no </think> in the response")
    program = extract_code(response)
    if program is None:
        score = failure if opts.no_code_score is None else opts.no_code_score
        return RewardResult(score, "no_code", 0, len(chosen), "no ```python block after the last </think>")
    outcomes = run_tests(program, chosen, opts)
    k, n = sum(o.status == "passed" for o in outcomes), len(outcomes)
    return RewardResult(MODES[mode](k, n), _reason(outcomes), k, n, _summary(outcomes))


def extract_code(response: str) -> str | None:
    """The last ```python block after the last ``</think>`` (the whole response if there is none), or None."""
    answer = response.rsplit(THINK_CLOSE, 1)[-1]
    blocks = _FENCE.findall(answer)
    return blocks[-1] if blocks else None


def select_tests(tests: list[dict], max_tests: int, seed: int) -> list[dict]:
    """At most ``max_tests`` tests, in their original order; a subsample fixed by ``seed`` when there are more."""
    if not tests:
        raise ValueError("a code problem needs at least one test")
    for t in tests:
        _test_kind(t)  # a malformed test is a data error: fail loudly before running anything
    if len(tests) <= max_tests:
        return list(tests)
    keep = sorted(random.Random(seed).sample(range(len(tests)), max_tests))
    return [tests[i] for i in keep]


def run_tests(program: str, tests: list[dict], opts: CodeRewardOptions) -> list[TestOutcome]:
    """One outcome per test, in order, from ONE sandbox for the sample: each test in a fresh process."""
    runs = [test["input"] if _test_kind(test) == "stdio" else FunctionCall(test["fn_name"], list(test["args"]))
            for test in tests]
    results = run_python_tests(program, runs, timeout_s=opts.timeout_s, memory_mb=opts.memory_mb,
                               max_output_bytes=output_cap(tests), hide_paths=tuple(opts.hide_paths),
                               unsafe_no_sandbox=opts.unsafe_no_sandbox)
    return [_judge(test, r, opts) for test, r in zip(tests, results)]


def output_cap(tests: list[dict]) -> int:
    """Bytes of stdout (and of stderr) a test may write before it is killed as ``wrong``: 4x the longest expected
    output of the sample, at least ``OUTPUT_CAP_FLOOR``. Far past the answer's size a program cannot pass any
    more, and a sample's results (up to 16 tests, both streams) then stay a few MiB in the reward worker."""
    sizes = [len(t["output"]) if _test_kind(t) == "stdio" else len(json.dumps(t["expected"])) for t in tests]
    return max(OUTPUT_CAP_FLOOR, 4 * max(sizes))


def _test_kind(test: dict) -> str:
    if isinstance(test, dict) and {"input", "output"} <= test.keys():
        return "stdio"
    if isinstance(test, dict) and {"fn_name", "args", "expected"} <= test.keys():
        return "call"
    raise ValueError(f"unknown test format {str(test)[:200]!r}; expected {{'input', 'output'}} "
                     "(stdin/stdout) or {'fn_name', 'args', 'expected'} (function call)")


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _judge(test: dict, r: SandboxResult, opts: CodeRewardOptions) -> TestOutcome:
    if r.timed_out:
        return TestOutcome("timeout", f"no exit within {opts.timeout_s:g} s")
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
        return TestOutcome("wrong", f"result not JSON: {r.value}")
    want = json.loads(json.dumps(test["expected"]))  # tuples -> lists, as the result went through JSON
    if r.value == want:
        return TestOutcome("passed")
    return TestOutcome("wrong", f"expected {_short(want)}, got {_short(r.value)}")


def _crash_detail(r: SandboxResult) -> str:
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
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text if len(text) <= limit else text[:limit] + "...")
