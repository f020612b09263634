"""Real data through the `datasets` library (local JSON through the json module): Klear RL records, long-CoT SFT
sources, benchmark problems.

Every loader takes a hub name or a local path and returns plain, validated Python records:

  * RL prompts (reference §5, "RL data"): HF datasets ``Kwai-Klear/KlearReasoner-MathSub-30K`` and
    ``Kwai-Klear/KlearReasoner-CodeSub-15K``, one row per prompt ->
    ``RLRecord`` (``load_klear_rl``);
  * long-CoT SFT sources, one loader per family, all mapped to ``SFTSample`` (``SFT_FAMILIES``,
    ``load_sft_source``); the field mapping of each family is in its loader's docstring;
  * benchmark problems for evaluation and decontamination (reference §7): the Klear repo's AIME and HMMT
    JSONL files, whose two schemas differ -> ``EvalProblem`` (``load_eval_problems``).

Where the data comes from. ``name_or_path`` is resolved in this order:

  1. an existing ``.jsonl``/``.json`` file -> read with the json module, one line at a time (below); ``.parquet``
     -> ``load_dataset("parquet", data_files=...)``; a single file is the split ``train``;
  2. an existing directory written by ``save_to_disk`` (``state.json`` or ``dataset_dict.json`` inside) ->
     ``load_from_disk`` (``split`` picks the split of a saved DatasetDict; a saved Dataset is the one
     split); any other directory -> ``load_dataset(directory)`` (datasets infers the builder
     from the data files in it);
  3. something that looks like a path (a file suffix above, or a leading ``/ ./ ../ ~``) but does not exist
     -> ``FileNotFoundError`` (never a silent hub lookup);
  4. anything else is a hub dataset name -> ``load_dataset(name, config, split=...)``.

Validation. Every row is checked before it is mapped. A missing (absent or null: Arrow cannot tell them
apart) or wrong-typed field raises ``SchemaError`` naming the dataset, the row index, the dotted field path,
what was expected and what was found, e.g.::

    KlearReasoner-MathSub-30K row 17: field 'reward_model.ground_truth' must be str, got int (5)

An empty dataset is an error as well, so is a filter (``ability=``) that keeps nothing.

Local JSON files. A ``.jsonl`` file (or a ``.json`` file in JSON lines) is read one line at a time as the loader
takes its rows, so a large file is never held in memory, let alone twice, and each value comes back exactly as
written (datasets' JSON reader turns a column whose rows disagree on a type into ``Json`` and loses the types:
a str "5" in one row and an int 5 in another both come back as 5). A ``.json`` file holding one JSON document (a
list of objects, or one object over several lines) is parsed whole. Blank lines are skipped; row indices count
rows, not lines.

Malformed records. The first malformed record raises ``SchemaError`` naming the file and the line: invalid
UTF-8, malformed JSON, a line that is not a JSON object (``null``, a list, a number), e.g.::

    data/train.jsonl line 3: malformed JSON (Expecting ',' delimiter at column 14): '{"prompt": "a" "b"}'

A Parquet file that is not one (0 bytes, truncated) is named with pyarrow's reason; whatever else datasets fails
to read (a directory's data files, a hub dataset) is named with the file and line, or the rows, where they can be
found, and otherwise with datasets' underlying error, instead of "An error occurred while generating the dataset".

Writers. ``write_jsonl`` and one row builder per schema (``klear_rl_row``, ``openr1_row``, ``messages_row``,
``aime_row``, ``hmmt_row``, ``lcb_row``) produce rows in the real schemas, so tests and notebooks write their own small
fixtures instead of shipping downloaded data. ``sft_sample_to_chat`` turns a sample into the
prompt/completion conversational format that ``klear_lib.train.sft.run_sft`` trains on.
"""

from __future__ import annotations

import base64
import codecs
import json
import pickle
import re
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from datasets.exceptions import DatasetGenerationError

from klear_lib.rewards import sandbox_json

__all__ = [
    "SchemaError", "RLRecord", "SFTSample", "EvalProblem",
    "load_klear_rl", "load_openr1", "load_chat", "load_columns", "SFT_FAMILIES", "load_sft_source",
    "load_eval_problems", "check_code_tests", "CODE_TEST_LIMITS",
    "write_jsonl", "klear_rl_row", "openr1_row", "messages_row", "aime_row", "hmmt_row", "lcb_row",
    "sft_sample_to_chat",
]

JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)

#: ``data_source`` values whose ground truth is a JSON string of tests, as dispatched by the released reward
#: code (``verl/utils/reward_score``: ``coder1`` plus the rllm code sources; a ``_longcot`` suffix is
#: stripped before the lookup). A record whose ``ability`` is in ``CODE_ABILITIES`` counts as code too.
CODE_DATA_SOURCES = frozenset({
    "coder1", "apps", "taco", "code_contests", "codeforces", "livecodebench", "kodcode", "leetcode",
    "primeintellect", "humanevalplus",
})
CODE_ABILITIES = frozenset({"code", "coding"})

# Chat layouts: "messages" rows use role/content; "conversations" rows (OpenThoughts) use from/value with
# ShareGPT role names (OpenThoughts-114k says user/assistant, OpenThoughts3 human/gpt).
_CONVERSATION_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
                       "system": "system"}


class SchemaError(ValueError):
    """A row (or the whole dataset) does not match the schema its loader expects."""


@dataclass(frozen=True)
class RLRecord:
    """One RL prompt. ``ground_truth`` is the gold answer (str) for math, the parsed tests (list or dict)
    for code; ``prompt`` keeps only ``role`` and ``content`` of each message."""

    data_source: str
    prompt: list[dict]
    ability: str
    ground_truth: str | list | dict
    source_row: int


@dataclass(frozen=True)
class SFTSample:
    """One (prompt, long-CoT response) pair in the one schema every SFT family maps to.

    ``source`` names where it comes from (what ``selection.top_k_sources`` ranks); ``verdict`` is the
    teacher response's correctness where the source records one, else None; ``difficulty`` is a label
    where the source has one, else None; ``row`` is the index of the dataset row it came from (an OpenR1
    row gives several samples with the same ``row``).
    """

    prompt: str
    response: str
    source: str
    verdict: bool | None
    difficulty: str | None
    row: int

    def to_dict(self) -> dict:
        """The sample as the plain dict the functions of ``klear_lib.data.selection`` take."""
        return asdict(self)


@dataclass(frozen=True)
class EvalProblem:
    """One benchmark problem: its id (as a str), the problem text, the gold answer, the row it came from."""

    id: str
    problem: str
    answer: str
    source_row: int


# ---------------------------------------------------------------------------------------------------------
# Loading: hub name or local path -> one `datasets.Dataset`
# ---------------------------------------------------------------------------------------------------------
def _looks_like_path(text: str) -> bool:
    return text.endswith(JSON_SUFFIXES + PARQUET_SUFFIXES) or text.startswith(("/", "./", "../", "~"))


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def _first_char(path: Path) -> bytes:
    """The first byte of a file that is not whitespace (nor a UTF-8 byte-order mark), b"" if none."""
    with path.open("rb") as f:
        start = True
        while chunk := f.read(1 << 16):
            if start and chunk.startswith(codecs.BOM_UTF8):
                chunk = chunk[len(codecs.BOM_UTF8):]
            start = False
            if chunk.strip():
                return chunk.lstrip()[:1]
    return b""


def _json_document(path: Path, label: str) -> Iterator[dict]:
    """The records of a file holding one JSON document: the objects of a list, or the one object."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SchemaError(f"{label} line {line}: invalid UTF-8 (byte 0x{data[e.start]:02x})") from None
    del data
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise SchemaError(f"{label} line {e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
    if isinstance(doc, dict):
        yield doc
        return
    if not isinstance(doc, list):
        raise SchemaError(f"{label}: must be JSON lines, a JSON list of objects or one object, got a JSON "
                          f"{_JSON_TYPES.get(type(doc), type(doc).__name__)}")
    for i, row in enumerate(doc):
        if not isinstance(row, dict):
            raise SchemaError(f"{label} row {i}: must be a JSON object, got "
                              f"{_JSON_TYPES.get(type(row), type(row).__name__)} ({_show(row)})")
        yield row


def _json_records(path: Path, label: str) -> Iterator[dict]:
    """The records of a local JSON file, each checked to be a JSON object, read one line at a time.

    JSON lines (blank lines skipped, as datasets does); a ``.json`` file that starts with ``[``, or whose first
    line is not a whole JSON value, is one document (``_json_document``). The first malformed record raises
    ``SchemaError`` naming the file and the line.
    """
    document = path.suffix.lower() == ".json"
    if document and _first_char(path) == b"[":
        yield from _json_document(path, label)
        return
    seen = 0
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if n == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                around = raw[max(0, e.start - 40):e.start + 8].rstrip()
                raise SchemaError(f"{label} line {n}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at byte "
                                  f"{e.start + 1} of the line): {_show(around)}") from None
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip())  # without the newline, so the column is on this line
            except json.JSONDecodeError as e:
                if document and not seen:  # one object spread over lines (pretty-printed)
                    yield from _json_document(path, label)
                    return
                raise SchemaError(f"{label} line {n}: malformed JSON ({e.msg} at column {e.colno}): "
                                  f"{_show(line.strip())}") from None
            if not isinstance(value, dict):
                raise SchemaError(f"{label} line {n}: must be a JSON object, got "
                                  f"{_JSON_TYPES.get(type(value), type(value).__name__)} ({_show(value)})")
            seen += 1
            yield value


def _parquet_rows(path: Path, label: str) -> int:
    """The row count of a Parquet file; a file that is not one (0 bytes, truncated, garbage) names pyarrow's why."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as e:
        raise SchemaError(f"{label}: not a readable Parquet file ({e})") from None


def _parquet_bad_rows(path: Path, label: str) -> SchemaError | None:
    """The first row group of a Parquet file that cannot be read, as an error naming its rows; None if all read."""
    pf = pq.ParquetFile(path)
    first = 0
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        try:
            pf.read_row_group(g)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types on damaged pages
            why = " ".join(str(e).split())  # pyarrow's messages span lines
            return SchemaError(f"{label} rows {first}-{first + n - 1} (row group {g}): cannot be read "
                               f"({type(e).__name__}: {why})")
        first += n
    return None


def _find_malformed(path: Path, label: str) -> SchemaError | None:
    """The first malformed record in a local data file, or in the data files under a directory; None if none."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        name = label if f == path else f"{label}/{f.relative_to(path)}"
        suffix = f.suffix.lower()
        try:
            if suffix in JSON_SUFFIXES:
                for _ in _json_records(f, name):
                    pass
            elif suffix in PARQUET_SUFFIXES:
                _parquet_rows(f, name)
                if (err := _parquet_bad_rows(f, name)) is not None:
                    return err
        except SchemaError as err:
            return err
    return None


def _read(label: str, path: Path | None, read: Callable[[], datasets.Dataset]) -> datasets.Dataset:
    """``read()``; if datasets fails on the data, the error names the file and line or rows where it can."""
    try:
        return read()
    except (DatasetGenerationError, pa.ArrowException, UnicodeDecodeError) as e:
        found = _find_malformed(path, label) if path is not None else None
        if found is not None:
            raise found from e
        cause = e.__cause__ or e
        raise SchemaError(f"{label}: datasets could not read the data ({type(cause).__name__}: {cause})") from e


class _JsonRows:
    """The rows of a local JSON file, read and checked one line at a time on each iteration (``_json_records``);
    a file without rows is an error once iterated. ``len`` reads the file through, one line at a time."""

    def __init__(self, path: Path, label: str):
        self.path, self.label = path, label

    def __iter__(self) -> Iterator[dict]:
        n = 0
        for n, row in enumerate(_json_records(self.path, self.label), 1):
            yield row
        if n == 0:
            raise SchemaError(f"{self.label}: dataset is empty (the file has no rows)")

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _load(name_or_path: str | Path, *, split: str, config: str | None,
          cache_dir: str | Path | None) -> tuple[str, datasets.Dataset | _JsonRows]:
    """(label used in error messages, the rows of the split), resolved as in the module docstring. Both kinds of
    rows iterate as dicts and have a ``len``. (A hub dataset's ``Json`` columns, if any, are validated as datasets
    decodes them.)"""
    label = str(name_or_path)
    cache = str(cache_dir) if cache_dir is not None else None
    path = Path(label).expanduser()
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix not in JSON_SUFFIXES + PARQUET_SUFFIXES:
            raise ValueError(f"{label}: unsupported file type {suffix!r}; expected one of "
                             f"{list(JSON_SUFFIXES + PARQUET_SUFFIXES)} or a directory")
        if split != "train":
            raise ValueError(f"{label}: a single data file has one split, 'train'; got split {split!r}")
        if suffix in JSON_SUFFIXES:
            return label, _JsonRows(path, label)
        # datasets stops with "corresponds to no data" on a Parquet file without rows: say what is wrong.
        if _parquet_rows(path, label) == 0:
            raise SchemaError(f"{label}: dataset is empty (the file has no rows)")
        ds = _read(label, path, lambda: datasets.load_dataset("parquet", data_files=str(path), split=split,
                                                              cache_dir=cache))
    elif path.is_dir():
        if (path / "dataset_dict.json").is_file():  # a saved DatasetDict: one saved Dataset per split folder
            splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
            if split not in splits:
                raise ValueError(f"{label}: no split {split!r}; splits: {sorted(splits)}")
            path = path / split
        if (path / "state.json").is_file():
            # load_from_disk fails with an IndexError on a saved Dataset without rows (no data files).
            if not json.loads((path / "state.json").read_text(encoding="utf-8"))["_data_files"]:
                raise SchemaError(f"{label}: dataset is empty (0 rows in split {split!r})")
            ds = datasets.load_from_disk(str(path))
        else:
            ds = _read(label, path, lambda: datasets.load_dataset(str(path), split=split, cache_dir=cache))
    elif _looks_like_path(label):
        raise FileNotFoundError(f"{label}: no such file or directory (a local path, so the hub is not tried)")
    else:
        ds = _read(label, None, lambda: datasets.load_dataset(label, config, split=split, cache_dir=cache))
    if len(ds) == 0:
        raise SchemaError(f"{label}: dataset is empty (0 rows in split {split!r})")
    return label, ds


# ---------------------------------------------------------------------------------------------------------
# Validation helpers: every failure names dataset, row, field, expectation and what was found
# ---------------------------------------------------------------------------------------------------------
def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _wrong(ds: str, row: int, field: str, expected: str, value: Any) -> SchemaError:
    if value is None:
        return SchemaError(f"{ds} row {row}: field '{field}' is missing or null; expected {expected}")
    return SchemaError(f"{ds} row {row}: field '{field}' must be {expected}, "
                       f"got {type(value).__name__} ({_show(value)})")


def _is(value: Any, typ: type) -> bool:
    # bool is an int subclass; a verdict where a count is expected (or the reverse) is a schema error.
    if typ is int and isinstance(value, bool):
        return False
    return isinstance(value, typ)


def _field(record: dict, path: str, typ: type | tuple[type, ...], ds: str, row: int) -> Any:
    """``record[a][b]...`` for ``path == "a.b"``, checked to be an instance of ``typ``."""
    value: Any = record
    walked: list[str] = []
    for key in path.split("."):
        if walked and not isinstance(value, dict):
            raise _wrong(ds, row, ".".join(walked), "dict", value)
        value = value.get(key)
        walked.append(key)
    types = typ if isinstance(typ, tuple) else (typ,)
    if value is None or not any(_is(value, t) for t in types):
        raise _wrong(ds, row, path, " or ".join(t.__name__ for t in types), value)
    return value


def _typed_list(record: dict, field: str, ds: str, row: int, *, item: type = str) -> list:
    values = _field(record, field, list, ds, row)
    for j, v in enumerate(values):
        if v is None or not _is(v, item):
            raise _wrong(ds, row, f"{field}[{j}]", item.__name__, v)
    return values


def _messages(record: dict, field: str, ds: str, row: int, *, role_key: str = "role",
              content_key: str = "content") -> list[dict]:
    """A non-empty list of messages, each reduced to ``{"role", "content"}`` (both str)."""
    values = _field(record, field, list, ds, row)
    if not values:
        raise SchemaError(f"{ds} row {row}: field '{field}' must be a non-empty list of messages, got []")
    out = []
    for j, msg in enumerate(values):
        if not isinstance(msg, dict):
            raise _wrong(ds, row, f"{field}[{j}]", "dict", msg)
        role, content = msg.get(role_key), msg.get(content_key)
        if not isinstance(role, str):
            raise _wrong(ds, row, f"{field}[{j}].{role_key}", "str", role)
        if not isinstance(content, str):
            raise _wrong(ds, row, f"{field}[{j}].{content_key}", "str", content)
        out.append({"role": role, "content": content})
    return out


# ---------------------------------------------------------------------------------------------------------
# 1. Klear RL records
# ---------------------------------------------------------------------------------------------------------
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


def load_klear_rl(name_or_path: str | Path, *, split: str = "train", ability: str | None = None,
                  config: str | None = None, cache_dir: str | Path | None = None) -> list[RLRecord]:
    """Klear RL prompts (``Kwai-Klear/KlearReasoner-MathSub-30K``, ``Kwai-Klear/KlearReasoner-CodeSub-15K``).

    Row schema (dataset cards; reference §5)::

        {"data_source": str, "prompt": [{"role": "user", "content": str}, ...], "ability": str,
         "reward_model": {"ground_truth": str, "style": str}}     (extra columns, e.g. __index_level_0__, ignored)

    Mapping: ``data_source``, ``ability`` as they are; ``prompt`` -> list of ``{"role", "content"}``;
    ``reward_model.ground_truth`` -> ``ground_truth``: the str itself for math; for code, ``json.loads`` of it,
    checked and converted to ``klear_lib.rewards.code``'s test list by ``check_code_tests`` (layouts, types and
    sizes against ``CODE_TEST_LIMITS``), so that a malformed test fails here, naming the dataset, the row and the
    test, and not in training as a score; ``source_row`` = row index. A record is code when its
    ``data_source`` without ``_longcot`` is in ``CODE_DATA_SOURCES`` (``coder1_longcot`` in CodeSub-15K) or its
    ``ability`` is in ``CODE_ABILITIES``. ``ability`` keeps only records with that ``ability`` (every row is
    still validated); keeping none is an error that lists the abilities present.
    """
    ds, data = _load(name_or_path, split=split, config=config, cache_dir=cache_dir)
    records = []
    for i, row in enumerate(data):
        data_source = _field(row, "data_source", str, ds, i)
        prompt = _messages(row, "prompt", ds, i)
        row_ability = _field(row, "ability", str, ds, i)
        truth = _field(row, "reward_model.ground_truth", str, ds, i)
        _field(row, "reward_model.style", str, ds, i)
        if is_code_record(data_source, row_ability):
            truth = check_code_tests(_parse_tests(truth, ds, i), ds, i)
        records.append(RLRecord(data_source, prompt, row_ability, truth, i))
    if ability is not None:
        kept = [r for r in records if r.ability == ability]
        if not kept:
            raise ValueError(f"{ds}: no record has ability {ability!r}; abilities present: "
                             f"{sorted({r.ability for r in records})}")
        records = kept
    return records


# ---------------------------------------------------------------------------------------------------------
# 2. Long-CoT SFT sources, one loader per family, all -> SFTSample
# ---------------------------------------------------------------------------------------------------------
def load_openr1(name_or_path: str | Path, *, source: str | None = None, split: str = "train",
                use_llama_judge: bool = False, config: str | None = None,
                cache_dir: str | Path | None = None) -> list[SFTSample]:
    """OpenR1-Math (``open-r1/OpenR1-Math-220k``; configs ``default``/``extended``, split ``train``).

    Columns used (dataset card features): ``problem`` (str), ``generations`` (list of str: DeepSeek-R1
    traces, ``<think>...</think>`` then the answer), ``correctness_math_verify`` (list of bool, one per
    generation), ``correctness_llama`` (list of bool or null; Llama-3.3-70B as judge, used only with
    ``use_llama_judge``). Ignored: ``solution``, ``answer``, ``problem_type``, ``question_type``, ``source``,
    ``uuid``, ``is_reasoning_complete``, ``finish_reasons``, ``correctness_count``, ``messages``.

    Mapping: one sample per generation: prompt = ``problem``, response = ``generations[j]``, verdict =
    ``correctness_math_verify[j]`` (or-ed with ``correctness_llama[j]`` when ``use_llama_judge`` and that list
    is present), difficulty = None, source = ``source`` or the dataset name. The verdict list must be as long
    as ``generations``.
    """
    ds, data = _load(name_or_path, split=split, config=config, cache_dir=cache_dir)
    src = source or ds
    samples = []
    for i, row in enumerate(data):
        problem = _field(row, "problem", str, ds, i)
        gens = _typed_list(row, "generations", ds, i)
        verdicts = _typed_list(row, "correctness_math_verify", ds, i, item=bool)
        if len(verdicts) != len(gens):
            raise SchemaError(f"{ds} row {i}: field 'correctness_math_verify' must have one verdict per "
                              f"generation ({len(gens)}), got {len(verdicts)}")
        if use_llama_judge and row.get("correctness_llama") is not None:
            llama = _typed_list(row, "correctness_llama", ds, i, item=bool)
            if len(llama) != len(gens):
                raise SchemaError(f"{ds} row {i}: field 'correctness_llama' must have one verdict per "
                                  f"generation ({len(gens)}), got {len(llama)}")
            verdicts = [a or b for a, b in zip(verdicts, llama)]
        samples += [SFTSample(problem, g, src, v, None, i) for g, v in zip(gens, verdicts)]
    return samples


def _chat_turns(row: dict, ds: str, i: int) -> list[dict]:
    """The row's turns as ``{"role", "content"}`` dicts from either chat layout (roles normalised)."""
    if row.get("messages") is not None:
        return _messages(row, "messages", ds, i)
    if row.get("conversations") is None:
        raise SchemaError(f"{ds} row {i}: field 'messages' (role/content) or 'conversations' (from/value) "
                          f"is missing or null; expected a list of turns")
    turns = _messages(row, "conversations", ds, i, role_key="from", content_key="value")
    for j, turn in enumerate(turns):
        if turn["role"] not in _CONVERSATION_ROLES:
            raise SchemaError(f"{ds} row {i}: field 'conversations[{j}].from' must be one of "
                              f"{sorted(_CONVERSATION_ROLES)}, got {turn['role']!r}")
        turn["role"] = _CONVERSATION_ROLES[turn["role"]]
    return turns


def load_chat(name_or_path: str | Path, *, source: str | None = None, split: str = "train",
              config: str | None = None, cache_dir: str | Path | None = None) -> list[SFTSample]:
    """Chat-layout long-CoT data, one single-turn conversation per row, in either layout:

      * ``messages``: ``[{"role": "user"|"assistant"|"system", "content": str}, ...]`` as in
        ``a-m-team/AM-Thinking-v1-Distilled`` (its messages may carry an ``info`` dict, ignored; the assistant
        content, think part and answer, is taken whole);
      * ``conversations``: ``[{"from": "user"|"human"|"assistant"|"gpt", "value": str}, ...]`` with an
        optional top-level ``system`` str as in ``open-thoughts/OpenThoughts-114k`` (``OpenThoughts3-1.2M``
        uses human/gpt and has an int ``difficulty`` column).

    Mapping: system turns (and the ``system`` column) are dropped; what remains must be exactly one user
    turn then one assistant turn: prompt = the user content, response = the assistant content. difficulty =
    ``str(row["difficulty"])`` when that column exists and is not null, else None; verdict = None (neither
    dataset records one: they were filtered for correctness upstream); source = ``source`` or the dataset name.
    """
    ds, data = _load(name_or_path, split=split, config=config, cache_dir=cache_dir)
    src = source or ds
    samples = []
    for i, row in enumerate(data):
        turns = [t for t in _chat_turns(row, ds, i) if t["role"] != "system"]
        roles = [t["role"] for t in turns]
        if roles != ["user", "assistant"]:
            raise SchemaError(f"{ds} row {i}: turns must be one user turn then one assistant turn "
                              f"(system turns aside), got roles {roles}")
        difficulty = row.get("difficulty")
        if difficulty is not None and (not isinstance(difficulty, (str, int)) or isinstance(difficulty, bool)):
            raise _wrong(ds, i, "difficulty", "str or int", difficulty)
        samples.append(SFTSample(turns[0]["content"], turns[1]["content"], src, None,
                                 None if difficulty is None else str(difficulty), i))
    return samples


def load_columns(name_or_path: str | Path, *, prompt_field: str, response_field: str,
                 verdict_field: str | None = None, difficulty_field: str | None = None,
                 source: str | None = None, split: str = "train", config: str | None = None,
                 cache_dir: str | Path | None = None) -> list[SFTSample]:
    """Any dataset with one prompt column and one response column, named by the caller.

    Mapping: prompt = ``row[prompt_field]`` (str), response = ``row[response_field]`` (str); verdict =
    ``row[verdict_field]`` (bool) if a field is named, else None; difficulty = ``row[difficulty_field]`` (str,
    or int as str) if named, else None; source = ``source`` or the dataset name. A named field may be dotted
    (``"meta.level"``) and is required in every row.
    """
    ds, data = _load(name_or_path, split=split, config=config, cache_dir=cache_dir)
    src = source or ds
    samples = []
    for i, row in enumerate(data):
        prompt = _field(row, prompt_field, str, ds, i)
        response = _field(row, response_field, str, ds, i)
        verdict = _field(row, verdict_field, bool, ds, i) if verdict_field else None
        difficulty = _field(row, difficulty_field, (str, int), ds, i) if difficulty_field else None
        samples.append(SFTSample(prompt, response, src, verdict,
                                 None if difficulty is None else str(difficulty), i))
    return samples


SFT_FAMILIES: dict[str, Callable[..., list[SFTSample]]] = {
    "openr1": load_openr1,
    "chat": load_chat,
    "columns": load_columns,
}


def load_sft_source(family: str, name_or_path: str | Path, *, source: str | None = None,
                    split: str = "train", **kw) -> list[SFTSample]:
    """``SFT_FAMILIES[family](name_or_path, source=source, split=split, **kw)``; an unknown family is a
    ValueError that lists the valid ones, an unknown keyword a TypeError from the family's loader."""
    if family not in SFT_FAMILIES:
        raise ValueError(f"unknown SFT family {family!r}; valid families: {sorted(SFT_FAMILIES)}")
    return SFT_FAMILIES[family](name_or_path, source=source, split=split, **kw)


# ---------------------------------------------------------------------------------------------------------
# 3. Benchmark problems (AIME and HMMT schemas of the Klear repo's benchmark files)
# ---------------------------------------------------------------------------------------------------------
# A trailing instruction such as "Please reason step by step, and put your final answer within \boxed{}."
# is not part of the problem; left in, its 9-grams would match every training prompt carrying the same
# instruction and decontamination would drop them all.
_TRAILING_INSTRUCTION = re.compile(r"\s*please reason step by step\b.*\Z", flags=re.IGNORECASE | re.DOTALL)


def _user_message(row: dict, ds: str, i: int) -> str:
    users = [m["content"] for m in _messages(row, "messages", ds, i) if m["role"] == "user"]
    if not users:
        raise SchemaError(f"{ds} row {i}: field 'messages' must contain a user message (the problem), got none")
    problem = _TRAILING_INSTRUCTION.sub("", users[0]).strip()
    if not problem:
        raise SchemaError(f"{ds} row {i}: field 'messages' user message holds no problem text")
    return problem


def load_eval_problems(path_or_name: str | Path, *, split: str = "train", config: str | None = None,
                       cache_dir: str | Path | None = None) -> list[EvalProblem]:
    """Benchmark problems from every layout of the benchmark files the Klear repository releases (reference §7),
    row by row:

      * AIME rows ``{"meta": {...}, "messages": [...]}``: id = ``meta.unique_id``, problem = ``meta.problem``, the
        gold answer = ``meta.answer``, else ``meta.solution`` (``aime25.qs.jsonl`` has only ``solution``, and ints
        for ``unique_id``, ``Year``, ``Problem Number`` and ``Part``; ``aime24.qs.jsonl`` has both, equal, and str
        ids). The other ``meta`` keys (``Year``, ``Problem Number``, ``Part``, ``level``, ...) are not read;
      * HMMT rows ``{"id", "messages", "solution", "answer"}`` (no ``meta``; ``HMMT-202502.jsonl``, int ids): id =
        ``id``, problem = the first user message's content with a trailing "Please reason step by step ..."
        instruction removed, the gold answer = ``answer``, else ``solution``;
      * the output of the released ``benchmarks/inference.py``, ``{"meta": <one of the rows above>, "messages":
        [..., the model's answer]}``: read as the benchmark row inside.

    A ``solution`` that is one ``\\boxed{...}`` gives what is inside. A row is AIME-shaped when its ``meta`` is
    not null. ids and answers may be str or int and are returned as str. The released judge reads ``meta`` only,
    so it scored every HMMT answer wrong; here every layout gives the same record. Errors name the file, the row
    and the field.
    """
    ds, data = _load(path_or_name, split=split, config=config, cache_dir=cache_dir)
    problems = []
    for i, row in enumerate(data):
        inner = row.get("meta")
        if isinstance(inner, dict) and isinstance(inner.get("messages"), list):  # inference.py's output row
            row = inner
        if row.get("meta") is not None:
            if not isinstance(row["meta"], dict):
                raise _wrong(ds, i, "meta", "an object (AIME layout) or null (HMMT layout)", row["meta"])
            uid = _field(row, "meta.unique_id", (str, int), ds, i)
            problem = _field(row, "meta.problem", str, ds, i).strip()
            answer = _gold(row, "meta.", ds, i)
        else:
            uid = _field(row, "id", (str, int), ds, i)
            problem = _user_message(row, ds, i)
            answer = _gold(row, "", ds, i)
        problems.append(EvalProblem(str(uid), problem, answer, i))
    return problems


def _gold(row: dict, prefix: str, ds: str, i: int) -> str:
    """The gold answer of a benchmark row: ``<prefix>answer``, else ``<prefix>solution`` (unboxed)."""
    holder = row.get("meta") if prefix else row
    for key in ("answer", "solution"):
        if holder.get(key) is not None:
            value = str(_field(row, prefix + key, (str, int), ds, i)).strip()
            if key == "solution" and value.startswith("\\boxed{") and value.endswith("}"):
                value = value[len("\\boxed{"):-1].strip()
            if not value:
                raise SchemaError(f"{ds} row {i}: field '{prefix}{key}' is empty; expected the gold answer")
            return value
    raise SchemaError(f"{ds} row {i}: field '{prefix}answer' is missing or null, and so is '{prefix}solution'; "
                      "expected the gold answer (str or int) in one of them")


# ---------------------------------------------------------------------------------------------------------
# 4. Writers: rows in the real schemas, for fixtures and notebooks
# ---------------------------------------------------------------------------------------------------------
def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    """Write one JSON object per line (UTF-8, non-ASCII kept), creating parent folders; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def klear_rl_row(prompt: str, ground_truth: str | list | dict, *, data_source: str | None = None,
                 ability: str | None = None) -> dict:
    """A Klear RL row. A str ground truth makes a math row (``math_longcot_math_verify``, ability ``math``);
    a list/dict of tests makes a code row (``coder1_longcot``, ability ``code``) with the tests JSON-encoded,
    as the released data stores them. ``data_source``/``ability`` override the defaults."""
    code = not isinstance(ground_truth, str)
    return {
        "data_source": data_source or ("coder1_longcot" if code else "math_longcot_math_verify"),
        "prompt": [{"role": "user", "content": prompt}],
        "ability": ability or ("code" if code else "math"),
        "reward_model": {"ground_truth": json.dumps(ground_truth) if code else ground_truth, "style": "rule"},
    }


def openr1_row(problem: str, generations: list[str], correctness_math_verify: list[bool], *,
               answer: str = "", correctness_llama: list[bool] | None = None, source: str = "olympiads",
               uuid: str = "") -> dict:
    """An OpenR1-Math-220k row with all its columns; ``messages`` holds the problem and the first generation
    judged correct (the first generation if none is), ``finish_reasons``/``is_reasoning_complete`` say
    every generation stopped normally."""
    best = next((g for g, ok in zip(generations, correctness_math_verify) if ok), generations[0])
    return {
        "problem": problem, "solution": answer, "answer": answer, "problem_type": "Algebra",
        "question_type": "math-word-problem", "source": source, "uuid": uuid,
        "is_reasoning_complete": [True] * len(generations), "generations": list(generations),
        "correctness_math_verify": list(correctness_math_verify), "correctness_llama": correctness_llama,
        "finish_reasons": ["stop"] * len(generations), "correctness_count": sum(correctness_math_verify),
        "messages": [{"role": "user", "content": problem}, {"role": "assistant", "content": best}],
    }


def messages_row(prompt: str, response: str, *, system: str | None = None, layout: str = "messages",
                 roles: tuple[str, str] = ("user", "assistant"), **extra: Any) -> dict:
    """A chat-layout row: ``layout="messages"`` (role/content, AM-Thinking style; ``system`` becomes a system
    message) or ``"conversations"`` (from/value with ``roles``, OpenThoughts style; ``system`` becomes the
    top-level ``system`` column). ``extra`` columns (``difficulty``, ``source``, ...) are added as they are."""
    if layout == "messages":
        turns = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": roles[0], "content": prompt}, {"role": roles[1], "content": response}]
        return {"messages": turns, **extra}
    if layout == "conversations":
        turns = [{"from": roles[0], "value": prompt}, {"from": roles[1], "value": response}]
        return {"system": system or "", "conversations": turns, **extra}
    raise ValueError(f"layout must be 'messages' or 'conversations', got {layout!r}")


def aime_row(unique_id: str, problem: str, answer: str, *, solution: str | None = None,
             instruction: str = "") -> dict:
    """An AIME benchmark row: ``meta`` with the problem and answer, ``messages`` with the user prompt
    (problem plus ``instruction``). ``solution`` defaults to the answer (the released judge reads
    ``meta.solution`` as the gold answer)."""
    return {
        "meta": {"unique_id": unique_id, "problem": problem,
                 "solution": answer if solution is None else solution, "answer": answer},
        "messages": [{"role": "user", "content": problem + instruction}],
    }


def hmmt_row(id: int | str, problem: str, answer: str, *, solution: str | None = None,
             instruction: str = "") -> dict:
    """An HMMT benchmark row: top-level ``id``, ``messages`` (the user prompt: problem plus ``instruction``),
    ``solution`` (defaults to the answer) and ``answer``; no ``meta``."""
    return {"id": id, "messages": [{"role": "user", "content": problem + instruction}],
            "solution": answer if solution is None else solution, "answer": answer}


def lcb_row(question_id: str, question_content: str, contest_date: str, tests: list[dict], *,
            n_public: int = 1, starter_code: str = "", func_name: str | None = None, platform: str = "atcoder",
            difficulty: str = "easy", title: str = "", contest_id: str = "", compress_private: bool = False) -> dict:
    """A LiveCodeBench ``code_generation_lite`` row (the columns of its ``test*.jsonl`` files).

    ``tests`` are LiveCodeBench tests ``{"input", "output", "testtype": "stdin" | "functional"}``; the first
    ``n_public`` go to ``public_test_cases``, the rest to ``private_test_cases``, each a JSON string. With
    ``compress_private`` the private tests are stored as the hub files store them: base64 of zlib-compressed
    pickle of that JSON string. ``func_name`` goes into ``metadata`` (a JSON string), as for LeetCode rows.
    """
    private = json.dumps(tests[n_public:])
    if compress_private:
        private = base64.b64encode(zlib.compress(pickle.dumps(private))).decode("ascii")
    return {
        "question_title": title or question_id, "question_content": question_content, "platform": platform,
        "question_id": question_id, "contest_id": contest_id or question_id, "contest_date": contest_date,
        "starter_code": starter_code, "difficulty": difficulty, "public_test_cases": json.dumps(tests[:n_public]),
        "private_test_cases": private, "metadata": json.dumps({"func_name": func_name} if func_name else {}),
    }


def sft_sample_to_chat(sample: SFTSample | dict) -> dict:
    """The prompt/completion conversational row ``klear_lib.train.sft.run_sft`` takes (loss on the completion).

    ``sample`` is an ``SFTSample`` or a dict with its fields (``prompt`` and ``response`` are the ones used), as
    the selection functions and the synthetic sources of ``klear_lib.data.teachers`` pass them around."""
    prompt, response = (sample["prompt"], sample["response"]) if isinstance(sample, dict) else (
        sample.prompt, sample.response)
    return {"prompt": [{"role": "user", "content": prompt}],
            "completion": [{"role": "assistant", "content": response}]}
