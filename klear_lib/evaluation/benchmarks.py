"""The paper's benchmarks (reference §7) and the tiny tasks' held-out sets, loaded as one record type and judged.

``load_benchmark(name)`` returns a ``Benchmark``: its problems as chat prompts with what judges them (a gold
answer, or tests), the paper's sample count ``n`` for avg@n, and its ``Judge``. ``judge(bench, completions)``
grades ``completions[i][j]`` (sample j of problem i) in a ``RewardPool`` and returns a ``(problems, n)`` bool array.

Each benchmark owns its judging. Its registry entry (``BenchmarkSpec``) names a loader, a ``Judge`` (the
judge function, the item builder, the correct reason, the format failures, the pool's settings, and extra
scores such as math's maj@n) and a prelude for programs; ``judge``, ``judge_items``, ``open_judge_pool`` and
``klear_lib.evaluation.evaluate`` read all of it from there and never branch on the kind. A new benchmark is
one ``register_benchmark(BenchmarkSpec(...))`` call, with ``MATH_JUDGE``, ``CODE_JUDGE`` or a new ``Judge``.

Registry (``BENCHMARKS``)::

    name             judge n   default source                                       window (contest_date)
    aime24           math  64  HuggingFaceH4/aime_2024 (split train)                -
    aime25           math  64  MathArena/aime_2025 (split train)                    -
    hmmt25           math  64  MathArena/hmmt_feb_2025 (split train)                -
    lcb_v5           code  8   livecodebench/code_generation_lite test3..5.jsonl    [2024-08-01, 2025-02-01)
    lcb_v6           code  8   livecodebench/code_generation_lite test6.jsonl       [2025-02-01, 2025-05-01)
    tiny_arithmetic  math  8   synthetic: tasks.make_splits held-out                -
    tiny_code        code  8   synthetic: tasks.make_code_splits held-out           -

Math (AIME, HMMT). ``path=`` a local JSONL/JSON/Parquet file in any layout of the Klear repo's benchmark files, read
by ``hub.load_eval_problems`` (AIME rows ``meta.{unique_id, problem, answer}``, or ``meta.solution`` where there is
no ``answer`` as in ``aime25.qs.jsonl``, str or int ids; HMMT rows top-level ``{id, messages, solution, answer}``;
the released inference script's output rows, the benchmark row under ``meta``). Without ``path`` the rows come from
a hub dataset (or any local file given as ``source=``) through ``hub._load``, with the columns of
``MATH_HUB_COLUMNS`` (data, overridable by ``id_column=``/``problem_column=``/``answer_column=``/``split=``):
HuggingFaceH4/aime_2024 has ``id`` (int), ``problem``, ``answer`` (str); the MathArena sets have ``problem_idx``
(int), ``problem``, ``answer`` (int or str). Either way the prompt is the problem text, then Klear's instruction
``MATH_INSTRUCTION``.

Code (LiveCodeBench ``code_generation_lite``). One row per problem, all columns str::

    question_title, question_content, platform ("leetcode" | "atcoder" | "codeforces"), question_id, contest_id,
    contest_date (ISO date-time), starter_code ("" for stdin problems), difficulty ("easy" | "medium" | "hard"),
    public_test_cases  JSON list of {"input": str, "output": str, "testtype": "stdin" | "functional"},
    private_test_cases the same JSON string, or base64(zlib(pickle(that JSON string))),
    metadata           JSON object; LeetCode rows carry {"func_name": "maxSum"}.

The hub repository holds a loading script, which datasets 4 and later (this project has 5.2) no longer run, so
its JSON-lines files are read directly (``datasets.load_dataset("json", data_files=hf://datasets/<repo>/<file>)``).
Each ``testN.jsonl`` adds one release (dataset card): v3 (problems to Jul 2024, 612 in all), v4 (to Sep 2024,
713), v5 (to Jan 2025, 880), v6 (to Apr 2025). test4+test5 hold 268 problems while the v5 window is usually
quoted as 279, so test3 (released mid-August 2024) is read as well in case its last problems fall in August; the
window filter drops the rest. v6's window lies in test6 alone. ``data_files=`` overrides the files.
``path=`` a local JSONL/Parquet file in the same schema (``question_id`` str or int; ``metadata`` and the test
columns JSON strings or already decoded; or the tests as the released reward code's ``input_output`` JSON,
``{"inputs", "outputs", "fn_name"?}``, in place of the two test columns). On either, the window ``[start, end)`` (start
inclusive, end exclusive, compared on ``contest_date``; ``window=`` overrides) keeps the benchmark's problems;
none kept is a ValueError naming the benchmark, window and file. The private tests are decoded WITHOUT
``pickle.loads``: ``_NoGlobalsUnpickler`` refuses every global, so a payload can only build plain data (str,
bytes, numbers, lists, dicts) and one that names a callable (``os.system``) is a ``SchemaError``.

Tests are mapped to ``klear_lib.rewards.code``'s formats: stdin -> ``{"input", "output"}``; functional ->
``{"fn_name": metadata["func_name"], "args": [json.loads(line) for each non-empty input line],
"expected": json.loads(output)}`` (score_code calls the method of ``class Solution``). The prompt follows
LiveCodeBench's generic one (``lcb_runner/prompts/code_generation.py``): the question, then the starter code to
complete or the stdin/stdout instruction, and a ```python block to answer in.

Judging (reference §7: "a code sample is correct only if every test passes"). ``MATH_JUDGE``: ``score_math``
through ``RewardPool(score_math, group_key="gold")``, correct iff the reason is ``correct``; its extra score is
maj@n by math-verify equivalence (``metrics.math_maj_at_k`` over the judge's own extraction, voted in a pool of
``metrics.math_majority``; samples whose judgement found no answer do not vote). ``CODE_JUDGE``: ``score_code``
in mode ``hard`` with EVERY test of the problem (``max_tests`` defaults to the problem's test count here, not
the training reward's 16), correct iff ``all_passed``. Like LiveCodeBench's grader (``testing_util.py``), LCB
specs have ``LCB_IMPORTS`` (``from typing import *`` and friends) as their prelude, so that ``List[int]`` from
the starter code needs no import; the program is rewritten into the response's last block before it is judged.

Departures: AIME/HMMT from the hub are the maintained copies named above, not the Klear repo's files (pass
``path=`` for those); tests are not sandboxed away from the dataset cache unless ``hide_paths=`` is passed.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from klear_lib.data import hub, schema, tasks
from klear_lib.evaluation.metrics import math_maj_at_k, math_majority
from klear_lib.rewards import sandbox_json
from klear_lib.rewards.code import CodeRewardOptions, extract_code, score_code
from klear_lib.rewards.math import extract_answer, score_math
from klear_lib.rewards.pool import RewardPool
from klear_lib.rewards.result import RewardResult

__all__ = [
    "BenchProblem", "Benchmark", "BenchmarkSpec", "Judge", "MathColumns", "BENCHMARKS", "MATH_HUB_COLUMNS",
    "MATH_INSTRUCTION", "LCB_IMPORTS", "MATH_JUDGE", "CODE_JUDGE", "load_benchmark", "register_benchmark",
    "judge_items", "judge_fn", "judge", "open_judge_pool", "decode_lcb_tests", "lcb_prompt",
]

#: Klear's instruction after every math problem (the one its benchmark files carry).
MATH_INSTRUCTION = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."

# LiveCodeBench's generic prompt pieces (lcb_runner/prompts/code_generation.py).
_LCB_WITH_STARTER = ("You will use the following starter code to write the solution to the problem and enclose "
                     "your code within delimiters.")
_LCB_WITHOUT_STARTER = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not "
                        "directly test on the sample inputs). Enclose your code within delimiters as follows. "
                        "Ensure that when the python program runs, it reads the inputs, runs the algorithm and "
                        "writes output to STDOUT.")

#: What LiveCodeBench's grader puts before every program (lcb_runner/evaluation/testing_util.py, import_string).
LCB_IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)


@dataclass(frozen=True)
class BenchProblem:
    """One benchmark problem: the chat prompt and what judges an answer (``answer`` for math, ``tests`` for code,
    in ``klear_lib.rewards.code``'s formats)."""

    id: str
    messages: list[dict]
    kind: str
    answer: str | None = None
    tests: list[dict] | None = None
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Benchmark:
    """Problems of one benchmark; ``n`` is the paper's samples per problem for avg@n; ``source`` where they came
    from (hub name, file, or ``synthetic:<seed>``); ``judge`` and ``prelude`` come from its spec."""

    name: str
    problems: list[BenchProblem]
    n: int
    source: str
    judge: Judge
    prelude: str = ""

    @property
    def kind(self) -> str:
        """The judge's label ("math", "code"), for tables."""
        return self.judge.kind


@dataclass(frozen=True)
class MathColumns:
    """Where a math hub dataset keeps what a problem needs."""

    split: str
    id: str
    problem: str
    answer: str
    config: str | None = None


#: Default hub dataset of each math benchmark, and its columns (dataset cards; see the module docstring).
MATH_HUB_COLUMNS: dict[str, tuple[str, MathColumns]] = {
    "aime24": ("HuggingFaceH4/aime_2024", MathColumns("train", "id", "problem", "answer")),
    "aime25": ("MathArena/aime_2025", MathColumns("train", "problem_idx", "problem", "answer")),
    "hmmt25": ("MathArena/hmmt_feb_2025", MathColumns("train", "problem_idx", "problem", "answer")),
}

_LCB_REPO = "livecodebench/code_generation_lite"


# ---------------------------------------------------------------------------------------------------------
# Math: Klear files (path=) or a hub dataset with named columns
# ---------------------------------------------------------------------------------------------------------
def _math_messages(problem: str) -> list[dict]:
    return [{"role": "user", "content": problem.strip() + MATH_INSTRUCTION}]


def _load_math(name: str, path: str | Path | None, *, source: str | None = None, split: str | None = None,
               config: str | None = None, id_column: str | None = None, problem_column: str | None = None,
               answer_column: str | None = None, cache_dir: str | Path | None = None
               ) -> tuple[list[BenchProblem], str]:
    if path is not None:
        if source is not None:
            raise ValueError(f"{name}: pass path= (a Klear benchmark file) or source= (a hub dataset), not both")
        rows = hub.load_eval_problems(path, split=split or "train", config=config, cache_dir=cache_dir)
        return [BenchProblem(p.id, _math_messages(p.problem), "math", answer=p.answer) for p in rows], str(path)
    default_source, cols = MATH_HUB_COLUMNS[name]
    src = source or default_source
    id_col, problem_col, answer_col = id_column or cols.id, problem_column or cols.problem, answer_column or cols.answer
    ds, data = hub._load(src, split=split or cols.split, config=config if config is not None else cols.config,
                         cache_dir=cache_dir)
    problems = []
    for i, row in enumerate(data):
        uid = schema._field(row, id_col, (str, int), ds, i)
        problem = schema._field(row, problem_col, str, ds, i)
        answer = schema._field(row, answer_col, (str, int), ds, i)
        problems.append(BenchProblem(str(uid), _math_messages(problem), "math", answer=str(answer).strip()))
    return problems, src


# ---------------------------------------------------------------------------------------------------------
# LiveCodeBench
# ---------------------------------------------------------------------------------------------------------
class _NoGlobalsUnpickler(pickle.Unpickler):
    """Builds only what needs no global: str, bytes, numbers, lists, tuples, dicts, sets. Any class or function
    a payload names (``os.system``, ``builtins.eval``) is refused, so loading runs no code of the payload's."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"global {module}.{name} refused (only plain data may be unpickled)")


def _parse_date(value: Any, ds: str, row: int) -> datetime:
    """``contest_date`` as a naive UTC datetime: an ISO string, or a datetime/date (datasets may infer one)."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):
        parsed = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise schema.SchemaError(f"{ds} row {row}: field 'contest_date' must be an ISO date or date-time, "
                                  f"got {value!r}") from None
    else:
        raise schema._wrong(ds, row, "contest_date", "ISO date str or datetime", value)
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(timezone.utc).replace(tzinfo=None)
    return parsed


def _json_field(row: dict, key: str, ds: str, row_i: int) -> Any:
    """A JSON-string column, decoded; a list or dict in its place (a copy of the data that decoded it) as it is."""
    if isinstance(row.get(key), (list, dict)):
        return row[key]
    text = schema._field(row, key, str, ds, row_i)
    try:
        return sandbox_json.loads(text)  # integers of any size (json.loads raises past 4,300 digits)
    except json.JSONDecodeError as err:
        raise schema.SchemaError(f"{ds} row {row_i}: field '{key}' must be a JSON string, got invalid JSON "
                              f"({err.msg} at char {err.pos}): {schema._show(text)}") from None


def _private_tests(text: str, ds: str, row: int) -> Any:
    """The private tests: plain JSON, else base64(zlib(pickle(JSON str))) unpickled without globals."""
    try:
        return sandbox_json.loads(text)
    except json.JSONDecodeError:
        pass
    where = f"{ds} row {row}: field 'private_test_cases'"
    try:
        raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    except (binascii.Error, zlib.error, UnicodeEncodeError, ValueError) as err:
        raise schema.SchemaError(f"{where} is neither JSON nor base64(zlib(pickle)): {err}") from None
    try:
        payload = _NoGlobalsUnpickler(io.BytesIO(raw)).load()
    except Exception as err:  # noqa: BLE001 - any failure of untrusted bytes is a data error
        raise schema.SchemaError(f"{where}: refused to unpickle ({type(err).__name__}: {err})") from None
    if isinstance(payload, bytes):
        payload = payload.decode("utf-8", errors="replace")
    if not isinstance(payload, str):
        raise schema.SchemaError(f"{where}: the pickle must hold a JSON string, got {type(payload).__name__}")
    try:
        return json.loads(payload)
    except json.JSONDecodeError as err:
        raise schema.SchemaError(f"{where}: the unpickled string is not JSON ({err.msg})") from None


def _convert_test(test: Any, func_name: str | None, ds: str, row: int, where: str) -> dict:
    if not isinstance(test, dict) or not isinstance(test.get("input"), str) or not isinstance(test.get("output"), str):
        raise schema.SchemaError(f"{ds} row {row}: field '{where}' must be {{'input': str, 'output': str, "
                              f"'testtype': ...}}, got {schema._show(test)}")
    kind = test.get("testtype")
    if kind == "stdin":
        return {"input": test["input"], "output": test["output"]}
    if kind == "functional":
        if not func_name:
            raise schema.SchemaError(f"{ds} row {row}: field 'metadata.func_name' is missing; a functional test "
                                  f"({where}) needs the method name")
        try:
            args = [json.loads(line) for line in test["input"].split("\n") if line.strip()]
            expected = json.loads(test["output"])
        except json.JSONDecodeError as err:
            raise schema.SchemaError(f"{ds} row {row}: field '{where}' of a functional test must hold one JSON value "
                                  f"per input line and a JSON output ({err.msg})") from None
        return {"fn_name": func_name, "args": args, "expected": expected}
    raise schema.SchemaError(f"{ds} row {row}: field '{where}.testtype' must be 'stdin' or 'functional', got {kind!r}")


def decode_lcb_tests(row: dict, ds: str = "row", row_index: int = 0) -> list[dict]:
    """Public then private tests of one LiveCodeBench row, in ``klear_lib.rewards.code``'s formats. A row that
    carries its tests as the released reward code's ``input_output`` instead (JSON ``{"inputs": [...], "outputs":
    [...], "fn_name"?}``: LiveCodeBench's inputs, one JSON value per line for a function, and outputs) is read
    through ``hub.check_code_tests``."""
    if row.get("public_test_cases") is None and row.get("input_output") is not None:
        return hub.check_code_tests(_json_field(row, "input_output", ds, row_index), ds, row_index,
                                    field="input_output")
    if row.get("metadata") is None:
        metadata = {}  # no metadata: stdin problems need none, a functional test names the missing func_name
    else:
        metadata = _json_field(row, "metadata", ds, row_index)
    if not isinstance(metadata, dict):
        raise schema._wrong(ds, row_index, "metadata", "a JSON object", metadata)
    func_name = metadata.get("func_name")
    tests = []
    private = row.get("private_test_cases")
    private = private if isinstance(private, list) else _private_tests(
        schema._field(row, "private_test_cases", str, ds, row_index), ds, row_index)
    for key, raw in (("public_test_cases", _json_field(row, "public_test_cases", ds, row_index)),
                     ("private_test_cases", private)):
        if not isinstance(raw, list):
            raise schema._wrong(ds, row_index, key, "a JSON list of tests", raw)
        tests += [_convert_test(t, func_name, ds, row_index, f"{key}[{j}]") for j, t in enumerate(raw)]
    if not tests:
        raise schema.SchemaError(f"{ds} row {row_index}: no tests in public_test_cases or private_test_cases")
    return tests


def lcb_prompt(question: str, starter_code: str) -> list[dict]:
    """LiveCodeBench's generic code-generation prompt as one user message."""
    if starter_code.strip():
        fmt = f"### Format: {_LCB_WITH_STARTER}\n```python\n{starter_code}\n```\n\n"
    else:
        fmt = f"### Format: {_LCB_WITHOUT_STARTER}\n```python\n# YOUR CODE HERE\n```\n\n"
    text = f"### Question:\n{question}\n\n{fmt}### Answer: (use the provided format with backticks)\n\n"
    return [{"role": "user", "content": text}]


def _load_lcb(name: str, path: str | Path | None, *, source: str | None = None,
              data_files: Sequence[str] | None = None, window: tuple[str, str] | None = None,
              cache_dir: str | Path | None = None) -> tuple[list[BenchProblem], str]:
    spec = BENCHMARKS[name]
    start_s, end_s = window or spec.window
    try:
        start, end = datetime.fromisoformat(start_s), datetime.fromisoformat(end_s)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: window must be two ISO dates (start inclusive, end exclusive), "
                         f"got {window!r}") from None
    if path is not None:
        if source is not None or data_files is not None:
            raise ValueError(f"{name}: pass path= (a local file) or source=/data_files= (the hub), not both")
        label, data = hub._load(path, split="train", config=None, cache_dir=cache_dir)
    else:
        import datasets  # the hub path only

        repo = source or spec.source
        files = list(data_files or spec.data_files)
        urls = [f if "://" in f else f"hf://datasets/{repo}/{f}" for f in files]
        label = f"{repo} ({', '.join(files)})"
        data = datasets.load_dataset("json", data_files=urls, split="train",
                                     cache_dir=None if cache_dir is None else str(cache_dir))
    problems = []
    for i, row in enumerate(data):
        when = _parse_date(row.get("contest_date"), label, i)
        if not start <= when < end:
            continue
        qid = schema._field(row, "question_id", (str, int), label, i)
        question = schema._field(row, "question_content", str, label, i)
        starter = row.get("starter_code") or ""
        meta = {"contest_date": when.date().isoformat(), "difficulty": row.get("difficulty"),
                "platform": row.get("platform"), "title": row.get("question_title")}
        problems.append(BenchProblem(str(qid), lcb_prompt(question, starter), "code",
                                     tests=decode_lcb_tests(row, label, i), meta=meta))
    if not problems:
        raise ValueError(f"{name}: no problem of {label} has a contest_date in the window "
                         f"[{start_s}, {end_s}) ({len(data)} rows read)")
    return problems, label


# ---------------------------------------------------------------------------------------------------------
# Tiny tasks: the held-out splits the notebooks use
# ---------------------------------------------------------------------------------------------------------
def _load_tiny_arithmetic(name: str, path: None, *, seed: int = 0, n_train: int = 0, n_heldout: int = 64,
                          levels: Sequence[int] = (1, 2, 3, 4)) -> tuple[list[BenchProblem], str]:
    _, heldout = tasks.make_splits(seed, n_train, n_heldout, tuple(levels))
    problems = [BenchProblem(f"{name}-{i}", tasks.prompt_messages(p), "math", answer=str(p.answer),
                             meta={"level": p.level}) for i, p in enumerate(heldout)]
    return problems, f"synthetic:{seed}"


def _load_tiny_code(name: str, path: None, *, seed: int = 0, n_train: int = 0,
                    n_heldout: int = 20) -> tuple[list[BenchProblem], str]:
    _, heldout = tasks.make_code_splits(seed, n_train, n_heldout)
    problems = [BenchProblem(f"{name}-{i}", tasks.code_prompt_messages(p), "code", tests=p.tests,
                             meta={"even_add": p.even_add, "odd_add": p.odd_add}) for i, p in enumerate(heldout)]
    return problems, f"synthetic:{seed}"


# ---------------------------------------------------------------------------------------------------------
# Judges: what a benchmark's spec names, so that callers never branch on the kind of benchmark
# ---------------------------------------------------------------------------------------------------------
def _no_extra_scores(bench: Benchmark, completions, reasons, *, workers: int = 2) -> dict:
    return {}


@dataclass(frozen=True)
class Judge:
    """How one kind of benchmark is judged. A benchmark's spec names its judge; ``judge``, ``judge_items``,
    ``open_judge_pool`` and the evaluation read everything from here and never look at ``kind``.

    ``build_item(problem, completion, prelude, options) -> item`` makes the keyword arguments of one
    ``score_fn(**item)`` call; ``pool_options(problems, options)`` the ``RewardPool`` keywords of a pool that
    judges those problems; ``extra_scores(bench, completions, reasons, workers=...)`` scores beyond avg@n and
    pass@k, added to the evaluation's result (math: ``maj_at_n``).
    """

    kind: str
    """A label for tables and results ("math", "code"); nothing branches on it."""
    score_fn: Callable[..., RewardResult]
    """Module-level judge of one sample, run in a ``RewardPool``'s workers."""
    build_item: Callable[[BenchProblem, str, str, dict], dict]
    correct_reason: str
    """The judge's reason for a correct sample."""
    format_failures: frozenset[str]
    """The judge's reasons meaning the response broke the format rather than answered wrongly."""
    pool_options: Callable[[Sequence[BenchProblem], dict], dict]
    extra_scores: Callable[..., dict] = _no_extra_scores


def _math_item(problem: BenchProblem, completion: str, prelude: str, options: dict) -> dict:
    return {"response": completion, "gold": problem.answer, **options}


def _math_pool_options(problems: Sequence[BenchProblem], options: dict) -> dict:
    return {"group_key": "gold"}  # the samples of a problem share a gold: one task parses it once


#: Seconds a math majority vote of one problem may take in a pool worker, per sample (a safety bound: votes
#: take milliseconds, but a comparison math-verify's alarm cannot interrupt must cost one problem, not the run).
MAJORITY_S_PER_SAMPLE = 10.0


def _math_majority(bench: Benchmark, completions: Sequence[Sequence[str]], reasons: list[list[str]], *,
                   workers: int = 2) -> dict:
    """``maj_at_n``: math-verify equivalence classes of the judge's own extraction, voted in a pool.

    A sample whose judgement found no answer (a format failure, or ``no_answer``) does not vote."""
    silent = bench.judge.format_failures | {"no_answer"}
    answers = [[None if why in silent else extract_answer(c) for c, why in zip(row, whys)]
               for row, whys in zip(completions, reasons)]
    n = len(completions[0])
    with RewardPool(math_majority, workers=workers, timeout_s=MAJORITY_S_PER_SAMPLE * n) as pool:
        return {"maj_at_n": math_maj_at_k(answers, [p.answer for p in bench.problems], n, pool=pool)}


def _with_prelude(response: str, prelude: str, think_required: bool = True) -> str:
    """The response with its program (the block score_code would take) rewritten as ``prelude + program``.

    A response without a block, or without ``</think>`` while ``think_required``, is left as it is, so its format
    failure stands; so is a program with a ``from __future__`` import, which must stay first."""
    program = extract_code(response)
    has_think = "</think>" in response
    if program is None or "from __future__" in program or (think_required and not has_think):
        return response
    head = response.rsplit("</think>", 1)[0] + "</think>\n" if has_think else ""
    return f"{head}```python\n{prelude}{program}```\n"


def _code_item(problem: BenchProblem, completion: str, prelude: str, options: dict) -> dict:
    response = _with_prelude(completion, prelude, options.get("require_think_close", True)) if prelude else completion
    return {"response": response, "tests": problem.tests, "mode": "hard", "max_tests": len(problem.tests), **options}


def _code_pool_options(problems: Sequence[BenchProblem], options: dict) -> dict:
    """A per-item limit that covers the sandbox's own deadline for the most tests a problem has (plus start-up)."""
    from klear_lib.rewards.sandbox import sample_budget_s

    per_test = float(options.get("timeout_s", CodeRewardOptions.timeout_s))
    most = options.get("max_tests") or max((len(p.tests) for p in problems), default=1)
    return {"timeout_s": sample_budget_s(most, per_test) + 5.0}


#: Reference §7: math judged by math-verify (correct iff ``score_math`` says ``correct``), with maj@n.
MATH_JUDGE = Judge("math", score_math, _math_item, "correct", frozenset({"no_think_close", "no_think_open"}),
                   _math_pool_options, _math_majority)
#: Reference §7: a code sample is correct only if every test passes (``score_code`` in mode ``hard``).
CODE_JUDGE = Judge("code", score_code, _code_item, "all_passed", frozenset({"no_think_close", "no_code"}),
                   _code_pool_options)


# ---------------------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchmarkSpec:
    """A registry entry: the loader and the options it takes, the judge, default n, source and window.

    ``loader(name, path, **options) -> (problems, source)``; ``prelude``: code put before every program before
    it is judged (code judges only; LiveCodeBench's imports)."""

    name: str
    judge: Judge
    n: int
    loader: Callable[..., tuple[list[BenchProblem], str]]
    options: tuple[str, ...]
    takes_path: bool
    source: str | None = None
    window: tuple[str, str] | None = None
    data_files: tuple[str, ...] = ()
    prelude: str = ""

    @property
    def kind(self) -> str:
        return self.judge.kind


_MATH_OPTIONS = ("source", "split", "config", "id_column", "problem_column", "answer_column", "cache_dir")
_LCB_OPTIONS = ("source", "data_files", "window", "cache_dir")

BENCHMARKS: dict[str, BenchmarkSpec] = {
    **{name: BenchmarkSpec(name, MATH_JUDGE, 64, _load_math, _MATH_OPTIONS, True, source=src)
       for name, (src, _) in MATH_HUB_COLUMNS.items()},
    "lcb_v5": BenchmarkSpec("lcb_v5", CODE_JUDGE, 8, _load_lcb, _LCB_OPTIONS, True, source=_LCB_REPO,
                            window=("2024-08-01", "2025-02-01"),
                            data_files=("test3.jsonl", "test4.jsonl", "test5.jsonl"), prelude=LCB_IMPORTS),
    "lcb_v6": BenchmarkSpec("lcb_v6", CODE_JUDGE, 8, _load_lcb, _LCB_OPTIONS, True, source=_LCB_REPO,
                            window=("2025-02-01", "2025-05-01"), data_files=("test6.jsonl",), prelude=LCB_IMPORTS),
    "tiny_arithmetic": BenchmarkSpec("tiny_arithmetic", MATH_JUDGE, 8, _load_tiny_arithmetic,
                                     ("seed", "n_train", "n_heldout", "levels"), False),
    "tiny_code": BenchmarkSpec("tiny_code", CODE_JUDGE, 8, _load_tiny_code, ("seed", "n_train", "n_heldout"), False),
}


def register_benchmark(spec: BenchmarkSpec, *, replace: bool = False) -> BenchmarkSpec:
    """Add ``spec`` to ``BENCHMARKS`` so that ``load_benchmark(spec.name)`` and the evaluation know it; a name
    already there is a ValueError unless ``replace``. Returns the spec."""
    if spec.name in BENCHMARKS and not replace:
        raise ValueError(f"benchmark {spec.name!r} is already registered (pass replace=True to replace it)")
    BENCHMARKS[spec.name] = spec
    return spec


def load_benchmark(name: str, *, path: str | Path | None = None, limit: int | None = None,
                   **options) -> Benchmark:
    """The problems of benchmark ``name`` (see ``BENCHMARKS`` and the module docstring for sources and options).

    ``path``: a local file instead of the hub (math and LCB only). ``limit``: keep the first ``limit`` problems.
    An unknown name is a ValueError, an option the loader does not take a TypeError; both list the valid ones.
    """
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; valid: {', '.join(BENCHMARKS)}")
    spec = BENCHMARKS[name]
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise TypeError(f"{name}: unknown option(s) {unknown}; valid: {', '.join(spec.options) or 'none'}")
    if path is not None and not spec.takes_path:
        raise ValueError(f"{name} is generated, not read from a file; it takes no path (got {str(path)!r})")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    problems, source = spec.loader(name, path, **options)
    return Benchmark(name, problems[:limit], spec.n, source, spec.judge, spec.prelude)


# ---------------------------------------------------------------------------------------------------------
# Judging
# ---------------------------------------------------------------------------------------------------------
def judge_fn(bench: Benchmark) -> Callable:
    """The module-level (picklable) judge of the benchmark: ``score_math`` or ``score_code`` here."""
    return bench.judge.score_fn


def _check_shape(bench: Benchmark, completions: Sequence[Sequence[str]]) -> int:
    if len(completions) != len(bench.problems):
        raise ValueError(f"{bench.name}: {len(completions)} lists of completions for {len(bench.problems)} "
                         f"problems (expected one list per problem, problem-major)")
    n = len(completions[0]) if completions else 0
    for i, samples in enumerate(completions):
        if len(samples) != n:
            raise ValueError(f"{bench.name}: problem {i} has {len(samples)} samples, problem 0 has {n}; "
                             f"every problem needs the same number")
    return n


def judge_items(bench: Benchmark, completions: Sequence[Sequence[str]], **judge_options) -> list[dict]:
    """One ``score_fn(**item)`` item per (problem, sample), problem-major, for ``RewardPool.score_batch``.

    Math: ``{"response", "gold", **judge_options}``. Code: ``{"response", "tests", "mode": "hard",
    "max_tests": len(tests), **judge_options}`` (every test runs unless ``max_tests`` is passed); LCB responses
    get ``LCB_IMPORTS`` (their spec's prelude) before their program (module docstring)."""
    _check_shape(bench, completions)
    return [bench.judge.build_item(p, c, bench.prelude, judge_options)
            for p, samples in zip(bench.problems, completions) for c in samples]


def open_judge_pool(bench: Benchmark, *, workers: int = 2, **judge_options) -> RewardPool:
    """A ``RewardPool`` of the benchmark's judge, set up for its problems (math: grouped by gold; code: a
    per-item limit that covers every test's timeout). Close it, or use it as a context manager."""
    return RewardPool(bench.judge.score_fn, workers=workers, **bench.judge.pool_options(bench.problems, judge_options))


def judge(bench: Benchmark, completions: Sequence[Sequence[str]], pool: RewardPool | None = None, *,
          workers: int = 2, **judge_options) -> tuple[np.ndarray, list[list[str]]]:
    """Correctness ``(problems, samples)`` bool array and the judge's reason per sample.

    Math: correct iff ``score_math``'s reason is ``correct``; code: iff ``score_code`` (mode ``hard``) says
    ``all_passed``. ``pool``: an open ``RewardPool`` of ``judge_fn(bench)`` to reuse; None opens one for the
    call with ``open_judge_pool`` and closes it."""
    n = _check_shape(bench, completions)
    items = judge_items(bench, completions, **judge_options)
    if pool is None:
        with open_judge_pool(bench, workers=workers, **judge_options) as own:
            results = own.score_batch(items)
    else:
        if pool.score_fn is not bench.judge.score_fn:
            raise ValueError(f"{bench.name}: the pool grades with {getattr(pool.score_fn, '__name__', pool.score_fn)}"
                             f", a {bench.kind} benchmark needs {bench.judge.score_fn.__name__}")
        results = pool.score_batch(items)
    reasons = [[r.reason for r in results[i * n:(i + 1) * n]] for i in range(len(bench.problems))]
    correct = np.array([[r == bench.judge.correct_reason for r in row] for row in reasons],
                       dtype=bool).reshape(len(bench.problems), n)
    return correct, reasons
