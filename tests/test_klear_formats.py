"""The authors' formats as released: every benchmark layout of the Klear repository (tests/fixtures/klear_benchmarks,
hand-written to the released structure, not by the project's row writers) loads, its gold answers are judged
correct and a wrong answer wrong by the project's judge; and code records' tests are checked and converted when
the RL data loads (layouts, types, sizes), naming dataset, row, field and test."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
import pathlib
import re
import shutil

import pytest

from klear_lib.data.hub import CODE_TEST_LIMITS, SchemaError, check_code_tests, load_eval_problems, load_klear_rl
from klear_lib.evaluation.benchmarks import judge, load_benchmark
from klear_lib.rewards.code import score_code
from klear_lib.rewards.math import score_math
from klear_lib.rewards.pool import RewardPool

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "klear_benchmarks"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

# (file, benchmark, [(id, gold answer)]): what each released layout must give
LAYOUTS = [
    ("aime24.qs.jsonl", "aime24", [("2024-II-1", "24"), ("2024-II-2", "9")]),  # meta.answer, str ids
    ("aime25.qs.jsonl", "aime25", [("0", "16"), ("1", "1001")]),  # meta.solution only, int ids
    ("HMMT-202502.jsonl", "hmmt25", [("0", "12"), ("1", "\\frac{3}{4}")]),  # no meta, int ids
    ("aime25_inference.jsonl", "aime25", [("0", "16")]),  # inference.py's output: the row under meta
]


def test_the_fixtures_have_the_released_structure():
    """Pins what makes each layout different (a fixture edited into another layout would pass the loader tests
    below without testing the released one)."""
    first = {f: (FIXTURES / f).read_text().splitlines()[0] for f, _, _ in LAYOUTS}
    assert first["aime25.qs.jsonl"].startswith('{"meta": {"unique_id": 0, "Year": 2025, "Problem Number": 0, ')
    assert '"answer"' not in (FIXTURES / "aime25.qs.jsonl").read_text()
    assert first["aime24.qs.jsonl"].startswith('{"messages": [{"role": "user", "content": ')
    assert '"unique_id": "2024-II-1", "Year": "2024", "Problem Number": 1,' in first["aime24.qs.jsonl"]
    assert first["HMMT-202502.jsonl"].startswith('{"id":0,"messages": [{"role": "user", "content":  ')
    assert '"meta"' not in (FIXTURES / "HMMT-202502.jsonl").read_text()
    row = json.loads(first["aime25_inference.jsonl"])
    assert list(row) == ["meta", "messages"] and list(row["meta"]) == ["meta", "messages"]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"]


@pytest.mark.parametrize("name, bench, want", [(f, b, w) for f, b, w in LAYOUTS], ids=[f for f, _, _ in LAYOUTS])
def test_every_released_layout_loads(name, bench, want):
    problems = load_eval_problems(FIXTURES / name)
    assert [(p.id, p.answer) for p in problems] == want
    assert all(p.problem and "$" in p.problem for p in problems)
    b = load_benchmark(bench, path=FIXTURES / name)
    assert [(p.id, p.answer) for p in b.problems] == want


def test_the_gold_answers_are_judged_correct_and_a_wrong_one_wrong():
    """Through the project's judge (judge() with a score_math pool, as evaluation runs it): the gold answer boxed
    after </think> is correct, the gold's neighbour (or another fraction) wrong, for every layout."""
    with RewardPool(score_math, workers=2, group_key="gold") as pool:
        for name, bench_name, want in LAYOUTS:
            bench = load_benchmark(bench_name, path=FIXTURES / name)
            wrong = {"12": "13", "\\frac{3}{4}": "\\frac{2}{3}"}
            completions = [[f"<think>work</think>The answer is $\\boxed{{{gold}}}$.",
                            f"<think>work</think>The answer is $\\boxed{{{wrong.get(gold) or int(gold) + 1}}}$."]
                           for _, gold in want]
            correct, reasons = judge(bench, completions, pool)
            assert correct.tolist() == [[True, False]] * len(want), (name, reasons)


@needs_bwrap
def test_livecodebench_with_the_released_input_output_tests_loads_and_judges():
    bench = load_benchmark("lcb_v5", path=FIXTURES / "lcb_input_output.jsonl")
    assert [p.id for p in bench.problems] == ["3001", "3002"]  # int question ids
    assert bench.problems[0].tests == [{"input": "1 2\n", "output": "3\n"}, {"input": "5 7\n", "output": "12\n"}]
    assert bench.problems[1].tests[0] == {"fn_name": "maxSum", "args": [[1, 5, 3], 2], "expected": 8}

    def respond(program):
        return f"<think>plan</think>\n```python\n{program}\n```\n"

    add = "a, b = map(int, input().split())\nprint({})"
    cls = "class Solution:\n    def maxSum(self, nums: List[int], k: int) -> int:\n        return {}"
    correct, _ = judge(bench, [[respond(add.format("a + b")), respond(add.format("a * b"))],
                               [respond(cls.format("sum(sorted(nums)[-k:])")), respond(cls.format("max(nums)"))]])
    assert correct.tolist() == [[True, False], [True, False]]


def test_a_row_in_no_released_layout_is_named_by_row_and_field(tmp_path):
    rows = [json.loads(line) for line in (FIXTURES / "aime25.qs.jsonl").read_text().splitlines()]
    del rows[1]["meta"]["solution"]
    path = tmp_path / "aime25.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(SchemaError, match=re.escape(f"{path} row 1: field 'meta.answer' is missing or null, and so is "
                                                    "'meta.solution'; expected the gold answer (str or int)")):
        load_eval_problems(path)
    rows[1]["meta"] = "2025"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(SchemaError, match=re.escape(f"{path} row 1: field 'meta' must be an object (AIME layout) or "
                                                    "null (HMMT layout), got str ('2025')")):
        load_eval_problems(path)


# -- code records' tests, checked when the RL data loads ---------------------------------------------------------
def code_row(tests) -> dict:
    """A CodeSub-15K row, written by hand (its released columns), the tests JSON-encoded as released."""
    return {"data_source": "coder1_longcot", "prompt": [{"role": "user", "content": "Solve it."}], "ability": "code",
            "reward_model": {"ground_truth": json.dumps(tests), "style": "rule"}}


@pytest.mark.parametrize("tests, converted", [
    ([{"input": "1\n", "output": "2\n", "testtype": "stdin"}], [{"input": "1\n", "output": "2\n"}]),
    ([{"fn_name": "f", "args": "[1, 2]", "expected": 3}], [{"fn_name": "f", "args": [1, 2], "expected": 3}]),
    ([{"input": "[1, 2]\n3", "output": "6", "testtype": "functional", "metadata": {"func_name": "g"}}],
     [{"fn_name": "g", "args": [[1, 2], 3], "expected": 6}]),
    ({"inputs": ["1\n", "2\n"], "outputs": [["2", "x"], "4\n"]}, [{"input": "1\n", "output": "2\nx"},
                                                                 {"input": "2\n", "output": "4\n"}]),
    ({"inputs": ["\"ab\""], "outputs": ["2"], "fn_name": "size"}, [{"fn_name": "size", "args": ["ab"], "expected": 2}]),
], ids=["lcb-stdin", "args-as-json-string", "lcb-functional", "parallel-stdin", "parallel-call"])
def test_known_layouts_are_converted_to_the_reward_codes_tests(tmp_path, tests, converted):
    path = tmp_path / "code.jsonl"
    path.write_text(json.dumps(code_row(tests)) + "\n")
    (record,) = load_klear_rl(path)
    assert record.ground_truth == converted


@pytest.mark.parametrize("tests, message", [
    ([{"input": "1"}], "test 0 must be {'input', 'output'} (stdin/stdout) or {'fn_name', 'args', 'expected'} (a "
                       "function call), got keys ['input']"),
    ([{"input": "1", "output": "1"}, {"input": "1", "output": 2}],
     "test 1: field 'output' of a stdin/stdout test must be str, got int (2)"),
    ([{"fn_name": "f", "args": "abc", "expected": 1}], "test 0 args must be JSON (Expecting value): 'abc'"),
    ([{"fn_name": "f", "args": "7", "expected": 1}], "test 0: field 'args' given as a string must be a JSON list, "
                                                     "got JSON int (7)"),
    ([{"fn_name": "os.system", "args": [], "expected": 0}], "test 0: a function-call test needs 'fn_name' (an "
                                                            "identifier), got 'os.system'"),
    ({"inputs": ["1"], "outputs": []}, ": 'inputs' holds 1 tests and 'outputs' 0"),
    ([1, 2], "test 0 must be an object, got int (1)"),
])
def test_malformed_tests_fail_at_load_naming_dataset_row_field_and_test(tmp_path, tests, message):
    path = tmp_path / "code.jsonl"
    path.write_text(json.dumps(code_row([{"input": "1", "output": "1"}])) + "\n" + json.dumps(code_row(tests)) + "\n")
    with pytest.raises(SchemaError) as err:
        load_klear_rl(path)
    assert str(err.value) == f"{path} row 1: field 'reward_model.ground_truth' {message}".replace("' :", "':")


def test_sizes_are_checked_against_the_documented_caps():
    assert CODE_TEST_LIMITS == {"tests": 4096, "test_chars": 8 << 20, "record_chars": 64 << 20}
    big = [{"input": "x" * 600, "output": "y" * 500}]
    with pytest.raises(SchemaError, match=re.escape("d row 3: field 'reward_model.ground_truth' test 0 holds 1,100 "
                                                    "characters of input and expected output, above the cap of "
                                                    "1,000 (CODE_TEST_LIMITS)")):
        check_code_tests(big, "d", 3, limits={"test_chars": 1000})
    with pytest.raises(SchemaError, match=re.escape("d row 3: field 'reward_model.ground_truth': its tests hold "
                                                    "3,300 characters, above the cap of 3,000 per record")):
        check_code_tests(big * 3, "d", 3, limits={"record_chars": 3000})
    with pytest.raises(SchemaError, match=re.escape("holds 3 tests, above the cap of 2 (CODE_TEST_LIMITS)")):
        check_code_tests(big * 3, "d", 3, limits={"tests": 2})
    # sized by their JSON text: "[[1, 1, ..., 1]]" is 2 + 299 * 3 + 1 + 2 = 902 characters, '"zz..z"' 102
    calls = [{"fn_name": "f", "args": [[1] * 300], "expected": "z" * 100}]
    with pytest.raises(SchemaError, match=re.escape("holds 1,004 characters")):
        check_code_tests(calls, "d", 0, limits={"test_chars": 1000})


@needs_bwrap
def test_args_given_as_a_string_score_a_correct_program_correct(tmp_path):
    """Before: args "[1, 2]" reached the sandbox as 6 characters, fn('[', '1', ',', ...), and the test was scored
    on that. Now the record holds [1, 2] and a correct add() passes, a wrong one fails."""
    path = tmp_path / "code.jsonl"
    path.write_text(json.dumps(code_row([{"fn_name": "add", "args": "[1, 2]", "expected": 3},
                                         {"fn_name": "add", "args": "[10, -4]", "expected": 6}])) + "\n")
    (record,) = load_klear_rl(path)
    right = score_code("<think>x</think>```python\ndef add(a, b):\n    return a + b\n```", record.ground_truth)
    wrong = score_code("<think>x</think>```python\ndef add(a, b):\n    return a * b\n```", record.ground_truth)
    assert (right.reason, right.score) == ("all_passed", 1.0)
    assert wrong.score == 0.0
