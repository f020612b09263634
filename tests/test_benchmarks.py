"""Benchmarks (klear_lib/evaluation/benchmarks.py): both Klear schemas and the hub columns give the same problems,
LiveCodeBench's window, test decoding (plain, compressed, hostile) and conversion, and judging through the real
reward pool and sandbox. Fixtures are written here with klear_lib.data.hub's row writers; nothing is downloaded."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import base64
import json
import pickle
import random
import re
import shutil
import zlib

import datasets
import pytest

from klear_lib.data import tasks
from klear_lib.data.hub import SchemaError
from klear_lib.data.rows import aime_row, hmmt_row, lcb_row, write_jsonl
from klear_lib.evaluation import benchmarks
from klear_lib.evaluation.benchmarks import (
    BENCHMARKS,
    CODE_JUDGE,
    LCB_IMPORTS,
    MATH_INSTRUCTION,
    MATH_JUDGE,
    BenchmarkSpec,
    BenchProblem,
    judge,
    judge_fn,
    judge_items,
    load_benchmark,
    open_judge_pool,
    register_benchmark,
)
from klear_lib.rewards.code import score_code
from klear_lib.rewards.math import score_math
from klear_lib.rewards.pool import RewardPool

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

PROBLEMS = [("1", "Find $x$ if $x + 1 = 3$.", "2"), ("2", "Compute $2^{10}$.", "1024"),
            ("3", "What is $\\frac{1}{2} + \\frac{1}{4}$?", "\\frac{3}{4}")]


@pytest.fixture(autouse=True)
def _quiet_progress_bars():
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    yield
    if was_enabled:
        datasets.enable_progress_bars()


def respond(program: str) -> str:
    return f"<think>plan</think>\n```python\n{program}\n```\n"


# --- math: the two Klear schemas and the hub columns -------------------------------------------------------------

def test_both_klear_schemas_give_the_same_problems(tmp_path):
    aime = write_jsonl([aime_row(i, p, a, instruction=MATH_INSTRUCTION) for i, p, a in PROBLEMS], tmp_path / "a.jsonl")
    hmmt = write_jsonl([hmmt_row(int(i), p, a, instruction=MATH_INSTRUCTION) for i, p, a in PROBLEMS],
                       tmp_path / "h.jsonl")
    a, h = load_benchmark("aime24", path=aime), load_benchmark("hmmt25", path=hmmt)
    assert [(p.id, p.messages, p.answer, p.kind) for p in a.problems] == \
           [(p.id, p.messages, p.answer, p.kind) for p in h.problems]
    # HMMT answers are read from the top level (the released judge read `meta` only, so it read none).
    assert [p.answer for p in h.problems] == ["2", "1024", "\\frac{3}{4}"]
    assert h.problems[1].messages == [{"role": "user", "content": "Compute $2^{10}$." + MATH_INSTRUCTION}]
    assert (a.n, a.kind, a.source) == (64, "math", str(aime))
    assert len(load_benchmark("aime24", path=aime, limit=2).problems) == 2


def test_hub_columns_are_mapped(tmp_path):
    # HuggingFaceH4/aime_2024's columns (id int, problem, solution, answer, url, year) ...
    h4 = tmp_path / "h4.parquet"
    datasets.Dataset.from_list([{"id": 60 + k, "problem": p, "solution": "...", "answer": a, "url": "u", "year": "2024"}
                                for k, (_, p, a) in enumerate(PROBLEMS)]).to_parquet(h4)
    # ... and MathArena's (problem_idx int, problem, answer int, problem_type list).
    arena = tmp_path / "arena.parquet"
    datasets.Dataset.from_list([{"problem_idx": 7, "problem": "Compute $2^{10}$.", "answer": 1024,
                                 "problem_type": ["Algebra"]}]).to_parquet(arena)
    b24 = load_benchmark("aime24", source=str(h4))
    assert [(p.id, p.answer) for p in b24.problems] == [("60", "2"), ("61", "1024"), ("62", "\\frac{3}{4}")]
    assert b24.problems[0].messages[0]["content"] == PROBLEMS[0][1] + MATH_INSTRUCTION
    b25 = load_benchmark("aime25", source=str(arena))
    assert [(p.id, p.answer, p.messages) for p in b25.problems] == [("7", "1024", b24.problems[1].messages)]
    # Another dataset's columns are named by the caller; a missing one names file, row and field.
    other = write_jsonl([{"qid": "q", "question": "Compute $2^{10}$.", "gold": "1024"}], tmp_path / "o.jsonl")
    b = load_benchmark("hmmt25", source=str(other), id_column="qid", problem_column="question", answer_column="gold")
    assert [(p.id, p.answer) for p in b.problems] == [("q", "1024")]
    with pytest.raises(SchemaError, match=r"o\.jsonl row 0: field 'problem_idx' is missing"):
        load_benchmark("hmmt25", source=str(other))
    with pytest.raises(ValueError, match="not both"):
        load_benchmark("aime24", path=other, source=str(other))


# --- LiveCodeBench ---------------------------------------------------------------------------------------------

ADD_TESTS = [{"input": f"{a} {b}\n", "output": f"{a + b}\n", "testtype": "stdin"} for a, b in [(1, 2), (5, 7), (10, 3)]]
MAXSUM_TESTS = [{"input": f"{json.dumps(nums)}\n{k}", "output": json.dumps(sum(sorted(nums)[-k:])),
                 "testtype": "functional"} for nums, k in [([1, 5, 3], 2), ([4, 4, 9, 1], 1), ([2, 3], 2)]]
STARTER = "class Solution:\n    def maxSum(self, nums: List[int], k: int) -> int:\n        "
ADD_OK, ADD_BAD = "a, b = map(int, input().split())\nprint(a + b)", "a, b = map(int, input().split())\nprint(a * b)"
# No `from typing import List`: LiveCodeBench's grader supplies it (LCB_IMPORTS), and so does judge().
MAXSUM_OK = ("class Solution:\n    def maxSum(self, nums: List[int], k: int) -> int:\n"
             "        return sum(sorted(nums)[-k:])")
MAXSUM_BAD = "class Solution:\n    def maxSum(self, nums: List[int], k: int) -> int:\n        return max(nums)"


def add_row(qid: str, date: str, **kw) -> dict:
    return lcb_row(qid, "Read a and b; print a + b.", date, ADD_TESTS, **kw)


def maxsum_row(qid: str, date: str, **kw) -> dict:
    return lcb_row(qid, "Return the sum of the k largest numbers.", date, MAXSUM_TESTS, starter_code=STARTER,
                   func_name="maxSum", platform="leetcode", difficulty="medium", **kw)


def test_lcb_window_keeps_start_and_drops_end(tmp_path):
    dates = {"jul31": "2024-07-31T23:59:59", "aug01": "2024-08-01T00:00:00", "jan31": "2025-01-31T18:00:00",
             "feb01": "2025-02-01T00:00:00", "apr30": "2025-04-30T12:00:00", "may01": "2025-05-01T00:00:00"}
    path = write_jsonl([add_row(q, d) for q, d in dates.items()], tmp_path / "lcb.jsonl")
    v5, v6 = load_benchmark("lcb_v5", path=path), load_benchmark("lcb_v6", path=path)
    assert [p.id for p in v5.problems] == ["aug01", "jan31"]
    assert [p.id for p in v6.problems] == ["feb01", "apr30"]
    assert (v5.n, v5.kind) == (8, "code") and BENCHMARKS["lcb_v5"].window == ("2024-08-01", "2025-02-01")
    assert v5.problems[0].meta == {"contest_date": "2024-08-01", "difficulty": "easy", "platform": "atcoder",
                                   "title": "aug01"}
    wide = load_benchmark("lcb_v5", path=path, window=("2024-01-01", "2026-01-01"))
    assert len(wide.problems) == 6
    with pytest.raises(ValueError, match=r"lcb_v6: no problem of .*lcb\.jsonl has a contest_date in the window "
                                         r"\[2023-01-01, 2023-02-01\)"):
        load_benchmark("lcb_v6", path=path, window=("2023-01-01", "2023-02-01"))


def test_lcb_prompts_follow_livecodebench(tmp_path):
    path = write_jsonl([add_row("a", "2024-09-01"), maxsum_row("m", "2024-09-02")], tmp_path / "lcb.jsonl")
    stdin_p, call_p = load_benchmark("lcb_v5", path=path).problems
    assert stdin_p.messages[0]["content"].startswith("### Question:\nRead a and b; print a + b.\n\n### Format: Read "
                                                     "the inputs from stdin solve the problem")
    assert f"```python\n{STARTER}\n```" in call_p.messages[0]["content"]
    assert "starter code" in call_p.messages[0]["content"] and "stdin" not in call_p.messages[0]["content"]


def test_compressed_private_tests_decode_like_plain_ones(tmp_path):
    plain = write_jsonl([add_row("a", "2024-09-01", n_public=1), maxsum_row("m", "2024-09-02")], tmp_path / "p.jsonl")
    packed = write_jsonl([add_row("a", "2024-09-01", n_public=1, compress_private=True),
                          maxsum_row("m", "2024-09-02", compress_private=True)], tmp_path / "z.jsonl")
    assert json.loads(open(packed).readline())["private_test_cases"].startswith("eJ")  # base64 of a zlib stream
    a, b = load_benchmark("lcb_v5", path=plain), load_benchmark("lcb_v5", path=packed)
    assert [p.tests for p in a.problems] == [p.tests for p in b.problems]
    assert a.problems[0].tests == [{"input": "1 2\n", "output": "3\n"}, {"input": "5 7\n", "output": "12\n"},
                                   {"input": "10 3\n", "output": "13\n"}]
    assert a.problems[1].tests[0] == {"fn_name": "maxSum", "args": [[1, 5, 3], 2], "expected": 8}


class _Hostile:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("payload, message", [
    ("hostile", r"refused to unpickle .*global posix\.system refused"),
    (["not", "a", "json", "string"], "the pickle must hold a JSON string, got list"),
])
def test_private_tests_never_run_pickled_code(tmp_path, payload, message):
    marker = tmp_path / "pwned"
    obj = _Hostile(marker) if payload == "hostile" else payload
    row = add_row("a", "2024-09-01")
    row["private_test_cases"] = base64.b64encode(zlib.compress(pickle.dumps(obj))).decode()
    path = write_jsonl([row], tmp_path / "evil.jsonl")
    with pytest.raises(SchemaError, match=r"evil\.jsonl row 0: field 'private_test_cases'.*" + message):
        load_benchmark("lcb_v5", path=path)
    assert not marker.exists()


def test_lcb_schema_errors_name_dataset_row_and_field(tmp_path):
    bad_type = add_row("a", "2024-09-01")
    bad_type["public_test_cases"] = json.dumps([{"input": "1", "output": "1", "testtype": "interactive"}])
    with pytest.raises(SchemaError, match=re.escape("t.jsonl row 1: field 'public_test_cases[0].testtype' must be "
                                                    "'stdin' or 'functional', got 'interactive'")):
        load_benchmark("lcb_v5", path=write_jsonl([add_row("ok", "2024-09-01"), bad_type], tmp_path / "t.jsonl"))
    with pytest.raises(SchemaError, match=re.escape("d.jsonl row 0: field 'contest_date' must be an ISO date or "
                                                    "date-time, got 'last autumn'")):
        load_benchmark("lcb_v5", path=write_jsonl([add_row("a", "last autumn")], tmp_path / "d.jsonl"))


@needs_bwrap
def test_functional_tests_pass_a_right_solution_class_and_fail_a_wrong_one(tmp_path):
    path = write_jsonl([maxsum_row("m", "2024-09-02")], tmp_path / "lcb.jsonl")
    tests = load_benchmark("lcb_v5", path=path).problems[0].tests
    prelude = "from typing import List\n"
    right = score_code(respond(prelude + MAXSUM_OK), tests, mode="hard")
    wrong = score_code(respond(prelude + MAXSUM_BAD), tests, mode="hard")
    assert (right.reason, right.passed, right.total) == ("all_passed", 3, 3)
    assert wrong.reason in ("some_passed", "none_passed") and wrong.score == 0.0


@needs_bwrap
def test_judge_lcb_through_the_sandbox(tmp_path):
    path = write_jsonl([add_row("a", "2024-09-01"), maxsum_row("m", "2024-09-02")], tmp_path / "lcb.jsonl")
    bench = load_benchmark("lcb_v5", path=path)
    correct, reasons = judge(bench, [[respond(ADD_OK), respond(ADD_BAD)], [respond(MAXSUM_OK), respond(MAXSUM_BAD)]])
    assert correct.tolist() == [[True, False], [True, False]]
    assert reasons[0][0] == reasons[1][0] == "all_passed"


def test_code_items_run_every_test_and_get_livecodebench_imports(tmp_path):
    path = write_jsonl([lcb_row("big", "q", "2024-09-01", ADD_TESTS * 7)], tmp_path / "lcb.jsonl")
    bench = load_benchmark("lcb_v5", path=path)
    item, unformatted = judge_items(bench, [[respond(ADD_OK), "```python\nprint(1)\n```"]], timeout_s=2.0)
    assert (item["mode"], item["max_tests"], item["timeout_s"], len(item["tests"])) == ("hard", 21, 2.0, 21)
    assert item["response"].endswith(f"</think>\n```python\n{LCB_IMPORTS}{ADD_OK}\n```\n")
    assert unformatted["response"] == "```python\nprint(1)\n```"  # no </think>: left to fail the format rule
    assert judge_fn(bench) is score_code


# --- tiny tasks ------------------------------------------------------------------------------------------------

def test_tiny_arithmetic_is_the_notebooks_heldout_split():
    _, heldout = tasks.make_splits(1234, 6000, 128, (1, 2, 3, 4))  # TaskModelConfig's data_seed, n_train, n_heldout
    bench = load_benchmark("tiny_arithmetic", seed=1234, n_heldout=128)
    assert [p.messages for p in bench.problems] == [tasks.prompt_messages(q) for q in heldout]
    assert [(p.answer, p.meta["level"]) for p in bench.problems] == [(str(q.answer), q.level) for q in heldout]
    assert (bench.n, bench.kind, bench.source) == (8, "math", "synthetic:1234")
    default = load_benchmark("tiny_arithmetic")
    assert len(default.problems) == 64 and default.source == "synthetic:0"


def test_tiny_code_is_the_code_heldout_split():
    _, heldout = tasks.make_code_splits(3, 500, 20)
    bench = load_benchmark("tiny_code", seed=3)
    assert [(p.messages, p.tests) for p in bench.problems] == [
        (tasks.code_prompt_messages(q), q.tests) for q in heldout]
    assert (bench.n, bench.kind) == (8, "code")


def test_judge_tiny_arithmetic_teacher_is_right_and_wrong_answers_are_wrong():
    bench = load_benchmark("tiny_arithmetic", seed=5, limit=6)
    _, heldout = tasks.make_splits(5, 0, 64)
    rng = random.Random(0)
    good = [[tasks.teacher_solution(q, rng)] * 2 for q in heldout[:6]]
    bad = [[s.replace(f"\\boxed{{{q.answer}}}", f"\\boxed{{{(q.answer + 1) % 10}}}") for s in row]
           for row, q in zip(good, heldout)]
    correct, reasons = judge(bench, good)
    assert correct.shape == (6, 2) and correct.all() and {r for row in reasons for r in row} == {"correct"}
    with RewardPool(score_math, workers=2, group_key="gold") as pool:  # a caller's pool is used as it is
        wrong, reasons = judge(bench, bad, pool)
        with pytest.raises(ValueError, match="tiny_code: the pool grades with score_math, a code benchmark needs "
                                             "score_code"):
            judge(load_benchmark("tiny_code", limit=1), [["x"]], pool)
    assert not wrong.any() and {r for row in reasons for r in row} == {"wrong"}
    assert judge_fn(bench) is score_math
    assert judge_items(bench, good)[0] == {"response": good[0][0], "gold": str(heldout[0].answer)}


# --- the registry: each benchmark owns its judging ---------------------------------------------------------------

def _two_problems(name, path):
    tests = [{"input": "2\n", "output": "4\n"}]
    return [BenchProblem(f"{name}-{i}", [{"role": "user", "content": "double it"}], "code", tests=tests * (i + 1))
            for i in range(2)], "inline"


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry, so that what a test registers is gone after it."""
    monkeypatch.setattr(benchmarks, "BENCHMARKS", dict(BENCHMARKS))
    return benchmarks.BENCHMARKS


def test_a_registered_benchmark_brings_its_judge_and_prelude(registry):
    spec = register_benchmark(BenchmarkSpec("doubling", CODE_JUDGE, 4, _two_problems, (), False, prelude="X = 1\n"))
    assert registry["doubling"] is spec and "doubling" not in BENCHMARKS
    bench = load_benchmark("doubling")
    assert (bench.kind, bench.n, bench.source, bench.prelude) == ("code", 4, "inline", "X = 1\n")
    assert judge_fn(bench) is score_code
    item = judge_items(bench, [[respond("print(2 * int(input()))")], ["x"]])[0]
    assert item["response"].endswith("```python\nX = 1\nprint(2 * int(input()))\n```\n")  # the spec's prelude
    assert (item["mode"], item["max_tests"]) == ("hard", 1)
    with pytest.raises(ValueError, match="'doubling' is already registered"):
        register_benchmark(spec)
    assert register_benchmark(BenchmarkSpec("doubling", MATH_JUDGE, 2, _two_problems, (), False),
                              replace=True).kind == "math"


def test_judge_pools_are_set_up_by_the_benchmark(registry):
    register_benchmark(BenchmarkSpec("doubling", CODE_JUDGE, 4, _two_problems, (), False))
    with open_judge_pool(load_benchmark("doubling"), workers=1, timeout_s=2.0) as pool:
        # the sandbox's own deadline for the largest problem (2 tests at the judge's 2 s), plus 5 s of start-up
        from klear_lib.rewards.sandbox import sample_budget_s

        assert (pool.score_fn, pool.timeout_s, pool.group_key) == (score_code, sample_budget_s(2, 2.0) + 5.0, None)
    with open_judge_pool(load_benchmark("tiny_arithmetic", limit=1), workers=1) as pool:
        assert (pool.score_fn, pool.group_key) == (score_math, "gold")


# --- errors ----------------------------------------------------------------------------------------------------

def test_mismatched_completions_raise_naming_benchmark_and_problem():
    bench = load_benchmark("tiny_arithmetic", limit=3)
    with pytest.raises(ValueError, match=r"tiny_arithmetic: 2 lists of completions for 3 problems"):
        judge(bench, [["x"], ["y"]])
    with pytest.raises(ValueError, match=r"tiny_arithmetic: problem 2 has 1 samples, problem 0 has 2"):
        judge_items(bench, [["a", "b"], ["c", "d"], ["e"]])


def test_unknown_names_and_options_list_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown benchmark 'aime26'; valid: aime24, aime25, hmmt25, lcb_v5, lcb_v6"):
        load_benchmark("aime26")
    with pytest.raises(TypeError, match=r"tiny_arithmetic: unknown option\(s\) \['seeds'\]; valid: seed, n_train"):
        load_benchmark("tiny_arithmetic", seeds=1)
    with pytest.raises(TypeError, match=r"lcb_v5: unknown option\(s\) \['split'\]; valid: source, data_files, window"):
        load_benchmark("lcb_v5", path=tmp_path / "x.jsonl", split="test")
    with pytest.raises(ValueError, match="takes no path"):
        load_benchmark("tiny_code", path=tmp_path / "x.jsonl")
