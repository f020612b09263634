"""The code reward (reference §5): extraction, test formats, every reason in every mode, seeded test selection."""

from __future__ import annotations

import json
import shutil
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from klear_lib.rewards import code as code_reward
from klear_lib.rewards import sandbox_zygote
from klear_lib.rewards.code import FAILURE_SCORES, MODES, REASONS, extract_code, score_code, select_tests
from klear_lib.rewards.result import RewardResult
from klear_lib.rewards.sandbox import run_python_tests

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap is not installed (apt-get install bubblewrap, or `make`)")


def respond(program: str, thought: str = "let me think") -> str:
    return f"<think>{thought}</think>\nHere is my solution.\n```python\n{program}\n```\n"


# Doubles its input, except that it gets 3 wrong: on inputs 1..4, exactly 3 of 4 tests pass.
DOUBLER = "n = int(input())\nprint(2 * n + (n == 3))"
DOUBLE_TESTS = [{"input": f"{n}\n", "output": f"{2 * n}\n"} for n in range(1, 5)]


# --- extraction and format ---------------------------------------------------------------------------------------

def test_extract_takes_the_last_block_after_the_last_think_close():
    text = ("<think>```python\nprint('draft in thought')\n```</think>"
            "```python\nprint(1)\n```\ntext\n```python\nprint(2)\n```\n```text\nnot code\n```")
    assert extract_code(text) == "print(2)\n"
    assert extract_code("<think>x</think>```py\nprint(3)\n```") == "print(3)\n"
    assert extract_code("<think>x</think>```Python3\nprint(4)\n```") == "print(4)\n"


def test_extract_needs_a_closed_python_fence():
    assert extract_code("<think>x</think>```python\nprint(1)\n") is None  # truncated: no closing fence
    assert extract_code("<think>x</think>```\nprint(1)\n```") is None  # no language: not a python block
    assert extract_code("<think>```python\nprint(1)\n```</think> no code here") is None  # only inside the thought


@pytest.mark.parametrize("mode", list(MODES))
def test_no_think_close_scores_the_mode_failure(mode):
    r = score_code("```python\nprint(1)\n```", [{"input": "", "output": "1"}], mode=mode)
    assert r == RewardResult(FAILURE_SCORES[mode], "no_think_close", 0, 1, r.detail)


@pytest.mark.parametrize("mode", list(MODES))
def test_no_code_scores_the_mode_failure(mode):
    r = score_code("<think>hmm</think>I give up.", DOUBLE_TESTS, mode=mode)
    assert (r.score, r.reason, r.passed, r.total) == (FAILURE_SCORES[mode], "no_code", 0, 4)


def test_failure_scores_are_configurable():
    tests = [{"input": "", "output": "1"}]
    assert score_code("no think", tests, no_think_close_score=-0.5).score == -0.5
    assert score_code("<think></think>no code", tests, mode="signed", no_code_score=-2.0).score == -2.0


@needs_bwrap
def test_think_close_can_be_optional():
    r = score_code("```python\nprint(1)\n```", [{"input": "", "output": "1"}], require_think_close=False)
    assert r.reason == "all_passed" and r.score == 1.0


# --- stdin/stdout tests and the three modes ---------------------------------------------------------------------

@needs_bwrap
@pytest.mark.parametrize("mode, expected", [("soft", 0.75), ("signed", 0.5), ("hard", 0.0)])
def test_partial_pass_scores(mode, expected):
    r = score_code(respond(DOUBLER), DOUBLE_TESTS, mode=mode)
    # soft = k/n = 3/4; signed = 2·3/4 − 1 = 0.5; hard = 0 unless 4/4
    assert (r.score, r.reason, r.passed, r.total) == (pytest.approx(expected), "some_passed", 3, 4)
    assert "test 2: wrong" in r.detail  # the input 3 is the third test


@needs_bwrap
@pytest.mark.parametrize("mode", list(MODES))
def test_all_passed_scores_one(mode):
    r = score_code(respond("print(2 * int(input()))"), DOUBLE_TESTS, mode=mode)
    assert (r.score, r.reason, r.passed, r.total) == (1.0, "all_passed", 4, 4)


@needs_bwrap
@pytest.mark.parametrize("mode", list(MODES))
def test_none_passed_scores_the_failure(mode):
    r = score_code(respond("print(-1)"), DOUBLE_TESTS, mode=mode)
    assert (r.score, r.reason, r.passed, r.total) == (FAILURE_SCORES[mode], "none_passed", 0, 4)


@needs_bwrap
def test_output_comparison_ignores_trailing_whitespace_only():
    tests = [{"input": "", "output": "1 2\n3\n"}]
    assert score_code(respond("print('1 2   ')\nprint('3')\nprint()\nprint()"), tests).score == 1.0
    assert score_code(respond("print('1 2')\nprint('3')"), [{"input": "", "output": "1 2\r\n3"}]).score == 1.0
    assert score_code(respond("print('1  2')\nprint('3')"), tests).score == 0.0  # inner spaces matter
    assert score_code(respond("print('1 2')\nprint()\nprint('3')"), tests).score == 0.0  # so do inner blank lines


@needs_bwrap
def test_right_output_then_a_crash_does_not_pass():
    r = score_code(respond("print(2 * int(input()))\nraise SystemExit(3)"), DOUBLE_TESTS[:1])
    assert (r.reason, r.passed) == ("crashed", 0) and "exit status 3" in r.detail


@needs_bwrap
def test_every_test_timing_out_is_timeout():
    r = score_code(respond("while True:\n    pass"), DOUBLE_TESTS[:2], mode="signed", timeout_s=0.5)
    assert (r.score, r.reason, r.passed, r.total) == (-1.0, "timeout", 0, 2)


@needs_bwrap
def test_crashes_and_timeouts_without_a_pass_are_crashed():
    program = "n = int(input())\nif n == 1:\n    while True: pass\nraise ValueError(n)"
    r = score_code(respond(program), DOUBLE_TESTS[:2], timeout_s=0.5)
    assert (r.score, r.reason, r.passed) == (0.0, "crashed", 0)
    assert "test 0: timeout" in r.detail
    r = score_code(respond("import ctypes; ctypes.string_at(0)"), DOUBLE_TESTS[:1])
    assert r.reason == "crashed" and "signal 11" in r.detail


# --- function-call tests -----------------------------------------------------------------------------------------

CALL_PROGRAM = """
import time
def add(a, b):
    print('noise on stdout must not matter')
    return a + b
def pair(x):
    return (x, [x])
def slow(x):
    while True:
        pass
def boom(x):
    raise ValueError('no')
def weird(x):
    return {1, 2}
class Solution:
    def twoSum(self, nums, target):
        seen = {}
        for i, v in enumerate(nums):
            if target - v in seen:
                return [seen[target - v], i]
            seen[v] = i
"""


@needs_bwrap
def test_function_calls_top_level_and_solution_methods():
    tests = [
        {"fn_name": "add", "args": [2, 3], "expected": 5},
        {"fn_name": "pair", "args": [7], "expected": [7, [7]]},  # tuple result vs list expected: equal via JSON
        {"fn_name": "twoSum", "args": [[2, 7, 11, 15], 9], "expected": (0, 1)},
        {"fn_name": "add", "args": [2, 2], "expected": 5},  # wrong
        {"fn_name": "boom", "args": [1], "expected": 1},  # raises
        {"fn_name": "weird", "args": [1], "expected": [1, 2]},  # not JSON: wrong, not a harness crash
        {"fn_name": "missing", "args": [1], "expected": 1},  # no such function
        {"fn_name": "slow", "args": [1], "expected": 1},  # per-test timeout; later tests still run
        {"fn_name": "add", "args": ["a", "b"], "expected": "ab"},
    ]
    outcomes = code_reward.run_tests(CALL_PROGRAM, tests, code_reward.make_options(timeout_s=0.5))
    assert [o.status for o in outcomes] == ["passed", "passed", "passed", "wrong", "crashed", "wrong", "crashed",
                                            "timeout", "passed"]
    r = score_code(respond(CALL_PROGRAM), tests, timeout_s=0.5)
    assert (r.score, r.reason, r.passed, r.total) == (pytest.approx(4 / 9), "some_passed", 4, 9)


@needs_bwrap
def test_a_sample_runs_in_one_sandbox(monkeypatch):
    calls = []
    real = code_reward.run_python_tests
    monkeypatch.setattr(code_reward, "run_python_tests", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    tests = [{"fn_name": "add", "args": [i, i], "expected": 2 * i} for i in range(10)]
    r = score_code(respond(CALL_PROGRAM + "\nif __name__ == '__main__':\n    print(2 * int(input()))"),
                   tests + DOUBLE_TESTS[:2])
    assert r.passed == 12 and r.total == 12
    assert len(calls) == 1 and len(calls[0]) == 12  # one sandbox for ten function calls and two stdin tests


@needs_bwrap
def test_function_call_program_that_fails_at_import_crashes_every_test():
    tests = [{"fn_name": "f", "args": [1], "expected": 1}] * 3
    r = score_code(respond("def f(x): return x\nraise RuntimeError('at import')"), tests)
    assert (r.reason, r.passed, r.total) == ("crashed", 0, 3) and "at import" in r.detail
    r = score_code(respond("def f(x): return x\nwhile True: pass"), tests, timeout_s=0.5)
    assert r.reason == "timeout"


@needs_bwrap
def test_function_call_results_cannot_be_forged_by_printing():
    # The program writes result-shaped lines to stdout and to every descriptor the harness could hold. Its
    # stdout is /dev/null, and a line without the run's secret nonce is not a result.
    forged = (
        "import os\n"
        "for i in range(3):\n"
        "    line = '{\"i\": %d, \"status\": \"ok\", \"value\": 1, \"error\": \"\"}' % i\n"
        "    print(line)\n"
        "    for fd in range(1, 20):\n"
        "        try:\n"
        "            os.write(fd, ('x ' + line + '\\n').encode())\n"
        "        except OSError:\n"
        "            pass\n"
        "def f(x):\n"
        "    return 0\n")
    r = score_code(respond(forged), [{"fn_name": "f", "args": [1], "expected": 1}] * 3)
    assert r.passed == 0 and r.reason == "none_passed"


@needs_bwrap
def test_a_test_that_kills_its_process_costs_only_that_test():
    # Each test is a fresh process: f(2) ends its own, f(3) still runs, and a global set by one test is not seen
    # by the next (f counts its calls: every test sees 1).
    program = ("import os\nCALLS = []\ndef f(x):\n    CALLS.append(x)\n    if x == 2:\n        os._exit(1)\n"
               "    return len(CALLS) * x")
    tests = [{"fn_name": "f", "args": [x], "expected": x} for x in (1, 2, 3)]
    outcomes = code_reward.run_tests(program, tests, code_reward.make_options())
    assert [o.status for o in outcomes] == ["passed", "crashed", "passed"]


@needs_bwrap
def test_one_hanging_test_times_out_alone():
    program = "n = int(input())\nwhile n == 2:\n    pass\nprint(2 * n)"
    tests = [{"input": f"{n}\n", "output": f"{2 * n}\n"} for n in (1, 2, 3)]
    outcomes = code_reward.run_tests(program, tests, code_reward.make_options(timeout_s=0.5))
    assert [o.status for o in outcomes] == ["passed", "timeout", "passed"]


@needs_bwrap
def test_exiting_before_the_call_returns_is_a_crash_and_a_flood_is_wrong():
    tests = [{"fn_name": "f", "args": [1], "expected": 1}]
    r = score_code(respond("import sys\ndef f(x):\n    return x\nsys.exit(0)"), tests)
    assert (r.reason, r.passed) == ("crashed", 0) and "exited before the call returned" in r.detail
    r = score_code(respond("def f(x):\n    while True:\n        print('y' * 100000)"), tests)
    assert (r.reason, r.passed) == ("none_passed", 0) and "output limit exceeded" in r.detail


@needs_bwrap
def test_a_correct_program_that_makes_many_temporary_files_keeps_its_score():
    # 100 files (and as many renames) in /tmp on every test: far below the count quota (COUNTER_QUOTA), so every
    # test of the sample runs and passes; and each test still finds /tmp as the first did (none of the 100 left).
    program = ("import os\nn = int(input())\nassert os.listdir('/tmp') == ['main.py'], os.listdir('/tmp')\n"
               "for i in range(100):\n    open(f'/tmp/part{i}.tmp', 'w').write(str(n))\n"
               "    os.rename(f'/tmp/part{i}.tmp', f'/tmp/part{i}')\n"
               "print(sum(int(open(f'/tmp/part{i}').read()) for i in range(100)) // 50)")
    r = score_code(respond(program), DOUBLE_TESTS, mode="soft")
    assert (r.score, r.reason, r.passed, r.total) == (1.0, "all_passed", 4, 4), r
    assert 100 * 2 < sandbox_zygote.COUNTER_QUOTA["/tmp"]  # files and renames both count: the margin the test uses


@needs_bwrap
def test_a_correct_program_that_floods_stderr_keeps_its_score_and_its_log_is_truncated():
    # 2 MiB on stderr, past the 1 MiB cap: read to its end, kept as its head, a mark and its tail, never a failure.
    program = ("import sys\nn = int(input())\nfor _ in range(2048):\n    sys.stderr.write('e' * 1023 + '\\n')\n"
               "sys.stderr.write('last words')\nprint(2 * n)")
    r = score_code(respond(program), DOUBLE_TESTS, mode="soft")
    assert (r.score, r.reason, r.passed) == (1.0, "all_passed", 4), r
    cap = code_reward.output_cap(DOUBLE_TESTS)
    [one] = run_python_tests(program, ["3\n"], timeout_s=6, max_output_bytes=cap)
    assert one.ok and one.stdout == "6\n" and one.stderr_truncated and not one.output_limit_exceeded
    assert cap - 100 <= len(one.stderr.encode()) <= cap == 1 << 20
    head, mark, tail = one.stderr.partition("\n[stderr truncated: ")
    assert head == ("e" * 1023 + "\n") * (len(head) // 1024) + "e" * (len(head) % 1024)
    assert mark and tail.endswith("e" * 1023 + "\nlast words")
    left_out = 2048 * 1024 + len("last words") - len(head) - len(tail.partition("]\n")[2])
    assert tail.startswith(f"{left_out} of its {2048 * 1024 + 10} bytes left out here]\n")
    # a crash after the flood: its reason still gives the traceback's last line (the tail)
    r = score_code(respond(program.replace("print(2 * n)", "raise ValueError('the real cause')")), DOUBLE_TESTS[:1])
    assert r.reason == "crashed" and "ValueError: the real cause" in r.detail, r


def test_the_output_cap_follows_the_longest_expected_output():
    assert code_reward.output_cap([{"input": "", "output": "1"}]) == 1 << 20  # the floor
    big = [{"input": "", "output": "x" * 500_000}, {"fn_name": "f", "args": [], "expected": [1] * 10}]
    assert code_reward.output_cap(big) == 2_000_000  # 4 x 500,000
    assert code_reward.output_cap([{"fn_name": "f", "args": [], "expected": "y" * 400_000}]) == 4 * 400_002  # JSON


# --- selection and validation ------------------------------------------------------------------------------------

def test_selection_is_seeded_ordered_and_capped():
    tests = [{"input": str(i), "output": str(i)} for i in range(40)]
    a = select_tests(tests, 16, seed=7)
    assert a == select_tests(tests, 16, seed=7)  # deterministic
    assert a != select_tests(tests, 16, seed=8)
    assert len(a) == 16 and [int(t["input"]) for t in a] == sorted(int(t["input"]) for t in a)  # original order
    assert select_tests(tests[:10], 16, seed=0) == tests[:10]  # fewer than the cap: all, unchanged


@given(n=st.integers(1, 60), cap=st.integers(1, 20), seed=st.integers(0, 2**32))
def test_selection_properties(n, cap, seed):
    tests = [{"input": str(i), "output": ""} for i in range(n)]
    chosen = select_tests(tests, cap, seed)
    idx = [int(t["input"]) for t in chosen]
    assert len(chosen) == min(n, cap) and idx == sorted(set(idx))  # capped, distinct, in the original order
    assert chosen == select_tests(tests, cap, seed)


@given(k=st.integers(0, 16), n=st.integers(1, 16))
def test_signed_is_the_affine_image_of_soft(k, n):
    k = min(k, n)
    assert MODES["signed"](k, n) == pytest.approx(2 * MODES["soft"](k, n) - 1)  # reference §5: same up to 2x-1
    assert MODES["hard"](k, n) == float(k == n)


@needs_bwrap
def test_score_runs_at_most_max_tests():
    tests = [{"input": f"{n}\n", "output": f"{2 * n}\n"} for n in range(1, 21)]
    r = score_code(respond(DOUBLER), tests, max_tests=4, seed=1)
    chosen = select_tests(tests, 4, seed=1)
    assert r.total == 4 and r.passed == 4 - sum(t["input"] == "3\n" for t in chosen)


def test_bad_arguments_fail_loudly():
    with pytest.raises(TypeError, match="valid: max_tests"):
        score_code(respond("print(1)"), DOUBLE_TESTS, max_test=3)
    with pytest.raises(ValueError, match="mode"):
        score_code(respond("print(1)"), DOUBLE_TESTS, mode="binary")
    with pytest.raises(ValueError, match="unknown test format"):
        score_code(respond("print(1)"), [{"stdin": "1", "stdout": "1"}])
    with pytest.raises(ValueError, match="at least one test"):
        score_code(respond("print(1)"), [])


def test_every_reason_is_documented():
    assert set(REASONS) == {"all_passed", "some_passed", "none_passed", "timeout", "crashed", "no_code",
                            "no_think_close", "judge_error"}
    assert MODES["soft"](4, 16) == 0.25 and MODES["signed"](4, 16) == -0.5 and MODES["hard"](15, 16) == 0.0


def test_callers_wait_for_the_sandbox_deadline_of_their_most_tests():
    """A reward pool's per-sample limit below the sandbox's own deadline would give up on a slow program (a
    replaced worker) before the sandbox judges it (a wrong answer with its reason)."""
    from klear_lib.evaluation import benchmarks
    from klear_lib.rewards import sandbox

    # 16 tests at 1 s CPU each: start-up 10 s, then per test the 3 x 1 + 1 s wall backstop, the 1 s + RESET_EXTRA_S
    # reset budget and 4 s of slack
    assert sandbox.sample_budget_s(16, 1.0) == pytest.approx(10 + 16 * (4 + 1 + sandbox.RESET_EXTRA_S + 4))
    problems = [types.SimpleNamespace(tests=[{}] * 9)]
    limit = benchmarks._code_pool_options(problems, {"timeout_s": 2.0})["timeout_s"]
    assert limit > sandbox.sample_budget_s(9, 2.0)


# --- one budget in every caller; no training on an uncounted sandbox unless asked ------------------------------

def test_every_pool_of_the_code_reward_gives_a_sample_the_sandboxs_own_budget():
    """The sandbox's deadline for 16 tests at 6 s: 10 s to start, then per test the 19 s wall backstop (3 x 6 + 1),
    6 s of reset, 4 s of slack: 506 s; a pool adds 5 s for its worker. Before, `klear launch` gave 120 s."""
    from klear_lib.rewards import sandbox
    from klear_lib.train import code_jobs

    assert sandbox.sample_budget_s(16, 6.0) == 506.0
    assert code_reward.pool_limit_s() == 511.0 == code_reward.pool_limit_s(6.0, 16)
    assert code_reward.pool_limit_s(0.5, 4) == 10 + 4 * (2.5 + 0.5 + 2 + 4) + 5  # 51 s
    assert code_jobs.pool_limit_s(0.5) == code_reward.pool_limit_s(0.5)


SLOW_TESTS = [{"input": f"{i}\n", "output": str(i * i)} for i in range(3)]
# Right, but each test waits 0.8 s: 2.4 s of the sample's wall time at a CPU limit of 0.25 s per test (its wall
# backstop is 1.75 s), which no limit derived from that per-test limit cuts short.
SLOW_RIGHT = "<think>x</think>```python\nimport time\nn = int(input())\ntime.sleep(0.8)\nprint(n * n)\n```"
SLOW_TIMEOUT_S = 0.25


@needs_bwrap
@pytest.mark.slow
def test_a_correct_program_with_slow_tests_scores_1_through_launch_the_units_and_verl(monkeypatch):
    from klear_lib.integrations import verl_reward
    from klear_lib.rewards.pool_wrappers import MemoPool, make_trl_reward_func
    from klear_lib.train import code_jobs, launch

    direct = score_code(SLOW_RIGHT, SLOW_TESTS, timeout_s=SLOW_TIMEOUT_S)
    assert direct.score == 1.0, direct
    reward, pool = launch.code_reward(launch.LaunchConfig(ability="code", reward_workers=1),
                                      test_timeout_s=SLOW_TIMEOUT_S)
    try:
        assert pool.timeout_s == code_reward.pool_limit_s(SLOW_TIMEOUT_S)
        assert reward([SLOW_RIGHT], tests=[SLOW_TESTS]) == [1.0], reward.last_results
    finally:
        pool.close()
    with code_jobs.reward_pool(1, "signed", SLOW_TIMEOUT_S) as units_pool:  # as code_unit builds it
        assert units_pool.timeout_s == code_jobs.pool_limit_s(SLOW_TIMEOUT_S)
        units = make_trl_reward_func(MemoPool(units_pool), {"tests": "tests"}, "code_signed",
                                     score_kwargs={"mode": "signed", "timeout_s": SLOW_TIMEOUT_S})
        assert units([SLOW_RIGHT], tests=[SLOW_TESTS]) == [1.0], units.last_results
    # verl grades code in its own thread, with no pool: the sandbox's budget is the only one
    monkeypatch.setattr("klear_lib.rewards.code.score_code",
                        lambda response, tests, **kw: score_code(response, tests, **kw, timeout_s=SLOW_TIMEOUT_S))
    out = verl_reward.compute_score("coder1_longcot", SLOW_RIGHT, json.dumps(SLOW_TESTS))
    assert out == {"score": 1.0, "acc": 1.0}


def test_training_refuses_a_sandbox_without_a_cgroup_unless_asked_and_then_warns_once(monkeypatch, tmp_path):
    from klear_lib import runs
    from klear_lib.rewards import sandbox, sandbox_cgroup

    monkeypatch.setenv(sandbox_cgroup.ENV_VAR, "off")
    monkeypatch.delenv(sandbox.UNCOUNTED_ENV_VAR, raising=False)
    monkeypatch.setattr(sandbox, "_uncounted_warned", False)
    assert sandbox.sandbox_mode() == "none"
    with pytest.raises(sandbox.SandboxUnavailableError, match="KLEAR_SANDBOX_ALLOW_NO_CGROUP=1"):
        sandbox.require_metered("the test's trainer")
    monkeypatch.setenv(sandbox.UNCOUNTED_ENV_VAR, "1")
    with pytest.warns(sandbox.UncountedSandboxWarning, match="polled fallback") as caught:
        assert sandbox.require_metered("the test's trainer") == "none"
        assert sandbox.require_metered("the test's trainer") == "none"
    assert len([w for w in caught if issubclass(w.category, sandbox.UncountedSandboxWarning)]) == 1  # once
    from klear_lib import notebook

    notebook.start_run("x", str(tmp_path), {"x": 1})  # every notebook run records the mode it ran under
    assert json.loads((tmp_path / runs.VERSIONS_FILE).read_text())["sandbox"] == "none"
    monkeypatch.setenv(sandbox_cgroup.ENV_VAR, "auto")
    if sandbox_cgroup.setup() is not None:  # this machine gives samples a cgroup: no opt-in needed
        monkeypatch.delenv(sandbox.UNCOUNTED_ENV_VAR)
        assert sandbox.require_metered("the test's trainer") in ("cgroup v1", "cgroup v2")
        notebook.start_run("x", str(tmp_path), {"x": 1})
        assert json.loads((tmp_path / runs.VERSIONS_FILE).read_text())["sandbox"] == sandbox.sandbox_mode()
