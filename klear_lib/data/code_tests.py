"""A code record's tests, checked and converted when its dataset loads: the layouts the released data and its reward
code use (LiveCodeBench stdin/functional rows, APPS/TACO ``{inputs, outputs, fn_name}``, function-call tests), their
types, and their sizes against ``CODE_TEST_LIMITS``; a ``SchemaError`` names dataset, row, field and test
(``klear_lib.data.hub.load_klear_rl`` calls it on every code record)."""

from __future__ import annotations

import json
from typing import Any

from klear_lib.data.schema import SchemaError, _show
from klear_lib.rewards import sandbox_json

#: ``data_source`` values whose ground truth is a JSON string of tests, as dispatched by the released reward
#: code (``verl/utils/reward_score``: ``coder1`` plus the rllm code sources; a ``_longcot`` suffix is
#: stripped before the lookup). A record whose ``ability`` is in ``CODE_ABILITIES`` counts as code too.
CODE_DATA_SOURCES = frozenset({
    "coder1", "apps", "taco", "code_contests", "codeforces", "livecodebench", "kodcode", "leetcode",
    "primeintellect", "humanevalplus",
})
CODE_ABILITIES = frozenset({"code", "coding"})


def is_code_record(data_source: str, ability: str) -> bool:
    """Whether a Klear RL record is a coding problem (by its data source, else its ability)."""
    return data_source.removesuffix("_longcot") in CODE_DATA_SOURCES or ability.lower() in CODE_ABILITIES


#: What one code record's tests may hold (``check_code_tests``): tests per record, characters of one test's input
#: (stdin, or the JSON of its arguments) and of its expected output, and of all of a record's tests together. The
#: sandbox keeps a test's output to 4x the longest expected one, per stream (``rewards.code.output_cap``): a record
#: at the caps costs a reward worker a few hundred MB at most, where 16 tests of 100 MB made a correct program
#: score 0 (MemoryError).
CODE_TEST_LIMITS = {"tests": 4096, "test_chars": 8 << 20, "record_chars": 64 << 20}


def check_code_tests(tests: list | dict, ds: str, row: int, *, field: str = "reward_model.ground_truth",
                     limits: dict | None = None) -> list[dict]:
    """A code record's tests as ``klear_lib.rewards.code`` runs them: ``{"input": str, "output": str}``
    (stdin/stdout) or ``{"fn_name": str, "args": list, "expected": JSON value}`` (a function call).

    Layouts accepted, converted to that list:
      * a list of those tests (extra keys ignored); a call test's ``args`` given as a JSON string of a list is
        parsed (never split into characters);
      * a list of LiveCodeBench tests ``{"input", "output", "testtype": "stdin" | "functional"}``, a functional one
        naming its function in ``fn_name`` or ``metadata.func_name``: arguments one JSON value per input line, the
        output JSON (as LiveCodeBench's grader reads them);
      * a dict of parallel lists ``{"inputs": [...], "outputs": [...]}`` (APPS, TACO, the released reward code's
        layout), with ``fn_name`` for function calls: each input a list of arguments or a str of one JSON value per
        line, each output the value or its JSON text; stdin outputs given as a list of lines are joined.

    Sizes are checked against ``CODE_TEST_LIMITS`` (``limits`` overrides some). Anything else is a ``SchemaError``
    naming the dataset, the row, the field and the test."""
    cap = {**CODE_TEST_LIMITS, **(limits or {})}
    where = f"{ds} row {row}: field '{field}'"
    if isinstance(tests, dict):
        tests = _parallel_tests(tests, where)
    if not isinstance(tests, list) or not tests:
        raise SchemaError(f"{where} must hold a non-empty list of tests, got {_show(tests)}")
    if len(tests) > cap["tests"]:
        raise SchemaError(f"{where} holds {len(tests)} tests, above the cap of {cap['tests']} (CODE_TEST_LIMITS)")
    out, total = [], 0
    for j, test in enumerate(tests):
        test = _one_test(test, f"{where} test {j}")
        size = _test_chars(test)
        if size > cap["test_chars"]:
            raise SchemaError(f"{where} test {j} holds {size:,} characters of input and expected output, above the "
                              f"cap of {cap['test_chars']:,} (CODE_TEST_LIMITS)")
        total += size
        out.append(test)
    if total > cap["record_chars"]:
        raise SchemaError(f"{where}: its tests hold {total:,} characters, above the cap of {cap['record_chars']:,} "
                          "per record (CODE_TEST_LIMITS)")
    return out


def _parallel_tests(tests: dict, where: str) -> list[dict]:
    """APPS/TACO ``{"inputs": [...], "outputs": [...], "fn_name"?}`` as a list of single tests."""
    inputs, outputs, fn = tests.get("inputs"), tests.get("outputs"), tests.get("fn_name")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise SchemaError(f"{where} is a dict of tests but not {{'inputs': [...], 'outputs': [...]}}: keys "
                          f"{sorted(tests)}")
    if len(inputs) != len(outputs):
        raise SchemaError(f"{where}: 'inputs' holds {len(inputs)} tests and 'outputs' {len(outputs)}")
    if fn is None:
        return [{"input": x, "output": "\n".join(y) if isinstance(y, list) and all(isinstance(s, str) for s in y)
                 else y} for x, y in zip(inputs, outputs)]
    out = []
    for j, (x, y) in enumerate(zip(inputs, outputs)):
        args = _json_lines(x, f"{where} test {j} input") if isinstance(x, str) else x
        expected = _json_text(y, f"{where} test {j} output") if isinstance(y, str) else y
        out.append({"fn_name": fn, "args": args, "expected": expected})
    return out


def _json_lines(text: str, where: str) -> list:
    try:
        return [sandbox_json.loads(line) for line in text.split("\n") if line.strip()]
    except json.JSONDecodeError as err:
        raise SchemaError(f"{where} must hold one JSON value per line ({err.msg}): {_show(text)}") from None


def _json_text(text: str, where: str):
    try:
        return sandbox_json.loads(text)
    except json.JSONDecodeError as err:
        raise SchemaError(f"{where} must be JSON ({err.msg}): {_show(text)}") from None


def _one_test(test: Any, where: str) -> dict:
    """One test checked and in the reward code's layout (``check_code_tests``)."""
    if not isinstance(test, dict):
        raise SchemaError(f"{where} must be an object, got {type(test).__name__} ({_show(test)})")
    kind = test.get("testtype")
    if kind == "functional" or (kind is None and "fn_name" in test):
        fn = test.get("fn_name") or (test.get("metadata") or {}).get("func_name")
        if not isinstance(fn, str) or not fn.isidentifier():
            raise SchemaError(f"{where}: a function-call test needs 'fn_name' (an identifier), got {_show(fn)}")
        if kind == "functional":  # LiveCodeBench: one JSON argument per input line, the output JSON
            for key in ("input", "output"):
                if not isinstance(test.get(key), str):
                    raise SchemaError(f"{where}: field '{key}' of a functional test must be str, got "
                                      f"{_show(test.get(key))}")
            return {"fn_name": fn, "args": _json_lines(test["input"], f"{where} input"),
                    "expected": _json_text(test["output"], f"{where} output")}
        if "args" not in test or "expected" not in test:
            raise SchemaError(f"{where}: a function-call test needs 'args' and 'expected', got keys {sorted(test)}")
        args = test["args"]
        if isinstance(args, str):  # a JSON list in a string: parsed, never split into characters
            args = _json_text(args, f"{where} args")
            if not isinstance(args, list):
                raise SchemaError(f"{where}: field 'args' given as a string must be a JSON list, got JSON "
                                  f"{type(args).__name__} ({_show(args)})")
        if not isinstance(args, list):
            raise SchemaError(f"{where}: field 'args' must be a list of arguments, got {type(args).__name__} "
                              f"({_show(args)})")
        return {"fn_name": fn, "args": args, "expected": test["expected"]}
    if kind not in (None, "stdin"):
        raise SchemaError(f"{where}: field 'testtype' must be 'stdin' or 'functional', got {_show(kind)}")
    if "input" not in test or "output" not in test:
        raise SchemaError(f"{where} must be {{'input', 'output'}} (stdin/stdout) or {{'fn_name', 'args', "
                          f"'expected'}} (a function call), got keys {sorted(test)}")
    for key in ("input", "output"):
        if not isinstance(test[key], str):
            raise SchemaError(f"{where}: field '{key}' of a stdin/stdout test must be str, got "
                              f"{type(test[key]).__name__} ({_show(test[key])})")
    return {"input": test["input"], "output": test["output"]}


def _test_chars(test: dict) -> int:
    if "input" in test:
        return len(test["input"]) + len(test["output"])
    return sandbox_json.json_size(test["args"]) + sandbox_json.json_size(test["expected"])


def _parse_tests(text: str, ds: str, row: int) -> list | dict:
    field = "reward_model.ground_truth"
    try:
        tests = sandbox_json.loads(text)  # integers of any size (json.loads raises past 4,300 digits)
    except json.JSONDecodeError as err:
        raise SchemaError(f"{ds} row {row}: field '{field}' must be a JSON string of tests (list or dict), "
                          f"got invalid JSON ({err.msg} at char {err.pos}): {_show(text)}") from None
    if not isinstance(tests, (list, dict)):
        raise SchemaError(f"{ds} row {row}: field '{field}' must be a JSON string of tests (list or dict), "
                          f"got JSON {type(tests).__name__} ({_show(tests)})")
    if not tests:
        raise SchemaError(f"{ds} row {row}: field '{field}' holds no tests ({_show(tests)})")
    return tests
