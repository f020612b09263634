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

Writers of rows in these schemas, for fixtures and notebooks, are in ``klear_lib.data.rows``; a code record's tests
are checked by ``klear_lib.data.code_tests``; the field checks and ``SchemaError`` are ``klear_lib.data.schema``.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from datasets.exceptions import DatasetGenerationError

from klear_lib.data.code_tests import CODE_TEST_LIMITS, _parse_tests, check_code_tests, is_code_record
from klear_lib.data.schema import SchemaError, _field, _messages, _show, _typed_list, _wrong

__all__ = [
    "SchemaError", "RLRecord", "SFTSample", "EvalProblem",
    "load_klear_rl", "load_openr1", "load_chat", "load_columns", "SFT_FAMILIES", "load_sft_source",
    "load_eval_problems", "check_code_tests", "CODE_TEST_LIMITS", "is_code_record",
]

JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)

# Chat layouts: "messages" rows use role/content; "conversations" rows (OpenThoughts) use from/value with
# ShareGPT role names (OpenThoughts-114k says user/assistant, OpenThoughts3 human/gpt).
_CONVERSATION_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
                       "system": "system"}


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
# 1. Klear RL records
# ---------------------------------------------------------------------------------------------------------
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


