"""Loaders of real data (klear_lib/data/hub.py): fixtures written in the real schemas by the module's own row
builders, loaded from JSONL (json module, line by line), Parquet and save_to_disk directories (`datasets`); exact
mapped values, every schema error's message (dataset, row, field, expectation), every malformed record named by
file and line (or rows), and the memory a large JSONL file costs. Nothing is downloaded."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
import re
import tracemalloc

import datasets
import pytest

from klear_lib.data.hub import (
    SFT_FAMILIES,
    EvalProblem,
    RLRecord,
    SchemaError,
    SFTSample,
    load_chat,
    load_columns,
    load_eval_problems,
    load_klear_rl,
    load_openr1,
    load_sft_source,
)
from klear_lib.data.rows import (
    aime_row,
    hmmt_row,
    klear_rl_row,
    messages_row,
    openr1_row,
    sft_sample_to_chat,
    write_jsonl,
)
from klear_lib.data.selection import filter_by_correctness

FORMATS = ("jsonl", "parquet", "disk")
INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.fixture(autouse=True)
def _quiet_progress_bars():
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    yield
    if was_enabled:
        datasets.enable_progress_bars()


@pytest.fixture
def cache(tmp_path):
    """A datasets cache under tmp_path, so that no test writes into ~/.cache."""
    return tmp_path / "hf-cache"


def save(rows: list[dict], tmp_path, fmt: str, name: str = "data") -> str:
    """Write `rows` as a .jsonl file, a .parquet file or a save_to_disk directory; returns the path."""
    if fmt == "jsonl":
        return str(write_jsonl(rows, tmp_path / f"{name}.jsonl"))
    ds = datasets.Dataset.from_list(rows)
    if fmt == "parquet":
        ds.to_parquet(str(tmp_path / f"{name}.parquet"))
        return str(tmp_path / f"{name}.parquet")
    ds.save_to_disk(str(tmp_path / name))
    return str(tmp_path / name)


def error_at(path: str, row: int, field: str) -> str:
    """The start of a SchemaError message for `field` of `row` in the dataset at `path`, as a regex."""
    return re.escape(f"{path} row {row}: field '{field}'")


# ---------------------------------------------------------------------------------------------------------
# Klear RL records
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_klear_rl_math_rows_map_exactly_in_every_format(tmp_path, cache, fmt):
    rows = [klear_rl_row("What is 2+2?", "4"), klear_rl_row("Compute $\\frac{1}{2}+\\frac{1}{2}$.", "1")]
    rows[1]["__index_level_0__"] = "29999"  # the released file carries this pandas column; it is ignored
    rows[0]["__index_level_0__"] = "0"
    path = save(rows, tmp_path, fmt)
    assert load_klear_rl(path, cache_dir=cache) == [
        RLRecord("math_longcot_math_verify", [{"role": "user", "content": "What is 2+2?"}], "math", "4", 0),
        RLRecord("math_longcot_math_verify", [{"role": "user", "content": "Compute $\\frac{1}{2}+\\frac{1}{2}$."}],
                 "math", "1", 1),
    ]


def test_code_tests_with_integers_past_pythons_digit_limit_load_exactly(tmp_path, cache):
    """json.loads raises past 4,300 digits (int_max_str_digits): such an expected value loads, and compares
    exactly with the same digits."""
    digits = "7" * 5000
    row = klear_rl_row("Write big().", {"fn_name": "big", "inputs": [[]], "outputs": [0]})
    row["reward_model"]["ground_truth"] = '{"fn_name": "big", "inputs": [[]], "outputs": [' + digits + "]}"
    (record,) = load_klear_rl(save([row], tmp_path, "parquet"), cache_dir=cache)
    (test,) = record.ground_truth  # converted to the reward code's function-call test
    value = test["expected"]
    assert value.text == digits and value == type(value)(digits)


def test_klear_rl_code_ground_truth_is_parsed_into_tests(tmp_path, cache):
    stdio = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]
    calls = {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}
    rows = [klear_rl_row("Read a b, print a+b.", stdio), klear_rl_row("Write add(a, b).", calls),
            klear_rl_row("Same, taco source.", stdio, data_source="taco_longcot", ability="coding")]
    assert rows[0]["reward_model"]["ground_truth"].startswith('[{"input"')  # stored as a JSON string
    records = load_klear_rl(save(rows, tmp_path, "parquet"), cache_dir=cache)
    # the parallel-list layout (APPS/TACO) becomes the reward code's function-call tests
    assert [r.ground_truth for r in records] == [stdio, [{"fn_name": "add", "args": [1, 2], "expected": 3}], stdio]
    assert [(r.data_source, r.ability) for r in records] == [
        ("coder1_longcot", "code"), ("coder1_longcot", "code"), ("taco_longcot", "coding")]


def test_klear_rl_ability_filter_keeps_rows_and_their_indices(tmp_path, cache):
    rows = [klear_rl_row("p0", "1"), klear_rl_row("p1", [{"input": "", "output": "x"}]), klear_rl_row("p2", "3")]
    path = save(rows, tmp_path, "jsonl")
    assert [(r.ability, r.source_row) for r in load_klear_rl(path, ability="math", cache_dir=cache)] == [
        ("math", 0), ("math", 2)]
    assert [r.source_row for r in load_klear_rl(path, ability="code", cache_dir=cache)] == [1]
    with pytest.raises(ValueError, match=re.escape("no record has ability 'chemistry'; abilities present: "
                                                   "['code', 'math']")):
        load_klear_rl(path, ability="chemistry", cache_dir=cache)


def test_klear_rl_wrong_type_in_row_17_is_named_exactly(tmp_path, cache):
    rows = [klear_rl_row(f"problem {i}", str(i)) for i in range(20)]
    rows[17]["reward_model"]["ground_truth"] = 5
    path = save(rows, tmp_path, "jsonl")
    with pytest.raises(SchemaError, match=re.escape(
            f"{path} row 17: field 'reward_model.ground_truth' must be str, got int (5)") + "$"):
        load_klear_rl(path, cache_dir=cache)


def _set(row: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    target = row
    for key in parents:
        target = target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return row


_DELETE = object()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize("dotted, value, field, tail", [
    ("ability", _DELETE, "ability", "is missing or null; expected str"),
    ("data_source", 3, "data_source", "must be str, got int (3)"),
    ("reward_model.style", _DELETE, "reward_model.style", "is missing or null; expected str"),
    ("reward_model", "4", "reward_model", "must be dict, got str ('4')"),
    ("prompt", [], "prompt", "must be a non-empty list of messages, got []"),
    ("prompt", "What is 2+2?", "prompt", "must be list, got str ('What is 2+2?')"),
])
def test_klear_rl_schema_errors_name_dataset_row_and_field(tmp_path, cache, fmt, dotted, value, field, tail):
    # Every row is broken the same way (a Parquet column has one type); the error names the first, row 0.
    rows = [_set(klear_rl_row(f"p{i}", "1"), dotted, value) for i in range(3)]
    path = save(rows, tmp_path, fmt)
    with pytest.raises(SchemaError, match=error_at(path, 0, field) + " " + re.escape(tail)):
        load_klear_rl(path, cache_dir=cache)


def test_klear_rl_message_content_of_wrong_type_is_named_with_its_index(tmp_path, cache):
    rows = [klear_rl_row("ok", "1"), klear_rl_row("ok", "1")]
    rows[1]["prompt"].append({"role": "user", "content": 7})
    path = save(rows, tmp_path, "jsonl")
    with pytest.raises(SchemaError, match=error_at(path, 1, "prompt[1].content") + re.escape(" must be str")):
        load_klear_rl(path, cache_dir=cache)


@pytest.mark.parametrize("truth, tail", [
    ("not json", "must be a JSON string of tests (list or dict), got invalid JSON"),
    ("42", "must be a JSON string of tests (list or dict), got JSON int (42)"),
    ("[]", "holds no tests ([])"),
])
def test_klear_rl_code_ground_truth_that_is_not_tests(tmp_path, cache, truth, tail):
    rows = [klear_rl_row("fine", [{"input": "1", "output": "1"}]), klear_rl_row("bad", "x")]
    rows[1] = {**rows[1], "data_source": "coder1_longcot", "ability": "code",
               "reward_model": {"ground_truth": truth, "style": "rule"}}
    path = save(rows, tmp_path, "jsonl")
    with pytest.raises(SchemaError, match=error_at(path, 1, "reward_model.ground_truth") + " " + re.escape(tail)):
        load_klear_rl(path, cache_dir=cache)


# ---------------------------------------------------------------------------------------------------------
# Where data comes from: files, directories, empty data, paths that do not exist
# ---------------------------------------------------------------------------------------------------------
def test_empty_datasets_are_errors(tmp_path, cache):
    empty_file = tmp_path / "empty.jsonl"
    empty_file.write_text("\n")
    with pytest.raises(SchemaError, match=re.escape(f"{empty_file}: dataset is empty")):
        load_klear_rl(empty_file, cache_dir=cache)
    empty = datasets.Dataset.from_dict({"data_source": [], "ability": []})
    empty.to_parquet(str(tmp_path / "empty.parquet"))
    empty.save_to_disk(str(tmp_path / "empty_dir"))
    for path in (tmp_path / "empty.parquet", tmp_path / "empty_dir"):
        with pytest.raises(SchemaError, match=re.escape(f"{path}: dataset is empty")):
            load_klear_rl(path, cache_dir=cache)


def test_missing_local_path_is_an_error_not_a_hub_lookup(tmp_path, cache):
    for path in (tmp_path / "nope.jsonl", "./nope", "data/train.parquet"):
        with pytest.raises(FileNotFoundError, match="no such file or directory"):
            load_klear_rl(path, cache_dir=cache)


def test_unsupported_file_type_lists_the_supported_ones(tmp_path, cache):
    (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=re.escape("unsupported file type '.csv'; expected one of "
                                                   "['.jsonl', '.json', '.parquet']")):
        load_klear_rl(tmp_path / "rows.csv", cache_dir=cache)


def test_directory_of_data_files_and_dataset_dict_splits(tmp_path, cache):
    folder = tmp_path / "folder"
    write_jsonl([klear_rl_row("p0", "0"), klear_rl_row("p1", "1")], folder / "train.jsonl")
    assert [r.ground_truth for r in load_klear_rl(folder, cache_dir=cache)] == ["0", "1"]

    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list([klear_rl_row("a", "1")]),
                                   "test": datasets.Dataset.from_list([klear_rl_row("b", "2")])})
    splits.save_to_disk(str(tmp_path / "dd"))
    assert [r.ground_truth for r in load_klear_rl(tmp_path / "dd", split="test")] == ["2"]
    with pytest.raises(ValueError, match=re.escape("no split 'dev'; splits: ['test', 'train']")):
        load_klear_rl(tmp_path / "dd", split="dev")


# ---------------------------------------------------------------------------------------------------------
# SFT families
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_openr1_row_with_three_generations_gives_three_samples(tmp_path, cache, fmt):
    gens = ["<think>a</think> \\boxed{4}", "<think>b</think> \\boxed{5}", "<think>c</think> \\boxed{4}"]
    rows = [openr1_row("What is 2+2?", gens, [True, False, True], answer="4"),
            openr1_row("What is 1+1?", ["<think>d</think> \\boxed{2}", "<think>e</think>"], [True, False])]
    path = save(rows, tmp_path, fmt)
    assert load_openr1(path, source="openr1", cache_dir=cache) == [
        SFTSample("What is 2+2?", gens[0], "openr1", True, None, 0),
        SFTSample("What is 2+2?", gens[1], "openr1", False, None, 0),
        SFTSample("What is 2+2?", gens[2], "openr1", True, None, 0),
        SFTSample("What is 1+1?", "<think>d</think> \\boxed{2}", "openr1", True, None, 1),
        SFTSample("What is 1+1?", "<think>e</think>", "openr1", False, None, 1),
    ]
    # without `source`, the dataset name (here the path) is the source
    assert {s.source for s in load_openr1(path, cache_dir=cache)} == {path}


def test_openr1_verdicts_feed_the_correctness_filter(tmp_path, cache):
    path = save([openr1_row("q", ["g0", "g1", "g2"], [False, True, False])], tmp_path, "jsonl")
    kept = filter_by_correctness([s.to_dict() for s in load_openr1(path, cache_dir=cache)], "only_true")
    assert [k["response"] for k in kept] == ["g1"]


def test_openr1_llama_judge_is_or_ed_only_on_request(tmp_path, cache):
    rows = [openr1_row("q0", ["g0", "g1"], [False, False], correctness_llama=[True, False]),
            openr1_row("q1", ["g2"], [True], correctness_llama=None)]
    path = save(rows, tmp_path, "parquet")
    assert [s.verdict for s in load_openr1(path, cache_dir=cache)] == [False, False, True]
    assert [s.verdict for s in load_openr1(path, use_llama_judge=True, cache_dir=cache)] == [True, False, True]


def test_openr1_schema_errors(tmp_path, cache):
    path = save([openr1_row("q", ["g0", "g1"], [True, False]),
                 {**openr1_row("q", ["g0", "g1"], [True, False]), "correctness_math_verify": [True]}],
                tmp_path, "jsonl", "short")
    with pytest.raises(SchemaError, match=error_at(path, 1, "correctness_math_verify")
                       + re.escape(" must have one verdict per generation (2), got 1")):
        load_openr1(path, cache_dir=cache)
    path = save([{**openr1_row("q", ["g"], [True]), "problem": None}], tmp_path, "parquet", "noproblem")
    with pytest.raises(SchemaError, match=error_at(path, 0, "problem") + " is missing or null"):
        load_openr1(path, cache_dir=cache)
    path = save([{**openr1_row("q", ["g"], [True]), "correctness_math_verify": [1]}], tmp_path, "jsonl", "ints")
    with pytest.raises(SchemaError, match=error_at(path, 0, "correctness_math_verify[0]")
                       + re.escape(" must be bool, got int (1)")):
        load_openr1(path, cache_dir=cache)


@pytest.mark.parametrize("fmt", FORMATS)
def test_chat_messages_layout(tmp_path, cache, fmt):
    rows = [messages_row("Prove it.", "<think>x</think> Done.", system="You are helpful."),
            messages_row("Sum 1..3?", "<think>1+2+3</think> 6")]
    path = save(rows, tmp_path, fmt)
    assert load_chat(path, source="am", cache_dir=cache) == [
        SFTSample("Prove it.", "<think>x</think> Done.", "am", None, None, 0),
        SFTSample("Sum 1..3?", "<think>1+2+3</think> 6", "am", None, None, 1),
    ]


def test_chat_conversations_layout_with_sharegpt_roles_and_difficulty(tmp_path, cache):
    rows = [messages_row("Q0", "A0", layout="conversations", system="Think first.", difficulty=7),
            messages_row("Q1", "A1", layout="conversations", roles=("human", "gpt"), difficulty=3)]
    path = save(rows, tmp_path, "parquet")
    assert rows[0]["conversations"][0] == {"from": "user", "value": "Q0"}
    assert load_chat(path, source="ot", cache_dir=cache) == [
        SFTSample("Q0", "A0", "ot", None, "7", 0), SFTSample("Q1", "A1", "ot", None, "3", 1)]


def test_chat_schema_errors(tmp_path, cache):
    multi = messages_row("Q", "A")
    multi["messages"] += [{"role": "user", "content": "more?"}, {"role": "assistant", "content": "no"}]
    path = save([messages_row("Q", "A"), multi], tmp_path, "jsonl", "multi")
    with pytest.raises(SchemaError, match=re.escape(f"{path} row 1: turns must be one user turn then one "
                                                    "assistant turn (system turns aside), got roles "
                                                    "['user', 'assistant', 'user', 'assistant']")):
        load_chat(path, cache_dir=cache)
    bad_role = messages_row("Q", "A", layout="conversations", roles=("person", "gpt"))
    path = save([bad_role], tmp_path, "jsonl", "role")
    with pytest.raises(SchemaError, match=error_at(path, 0, "conversations[0].from") + " must be one of"):
        load_chat(path, cache_dir=cache)
    path = save([{"prompt": "Q", "response": "A"}], tmp_path, "jsonl", "neither")
    with pytest.raises(SchemaError, match=error_at(path, 0, "messages") + re.escape(
            " (role/content) or 'conversations' (from/value) is missing or null")):
        load_chat(path, cache_dir=cache)


def test_columns_family_maps_named_fields(tmp_path, cache):
    rows = [{"question": "Q0", "answer": "A0", "ok": True, "meta": {"level": "hard"}},
            {"question": "Q1", "answer": "A1", "ok": False, "meta": {"level": "easy"}}]
    path = save(rows, tmp_path, "disk")
    got = load_columns(path, prompt_field="question", response_field="answer", verdict_field="ok",
                       difficulty_field="meta.level", source="mine")
    assert got == [SFTSample("Q0", "A0", "mine", True, "hard", 0), SFTSample("Q1", "A1", "mine", False, "easy", 1)]
    plain = load_columns(path, prompt_field="question", response_field="answer")
    assert [(s.verdict, s.difficulty) for s in plain] == [(None, None), (None, None)]
    with pytest.raises(SchemaError, match=error_at(path, 0, "response") + " is missing or null"):
        load_columns(path, prompt_field="question", response_field="response")


def test_registry_dispatches_and_bad_family_lists_valid_ones(tmp_path, cache):
    path = save([openr1_row("q", ["g0", "g1"], [True, False])], tmp_path, "jsonl")
    assert load_sft_source("openr1", path, source="s", cache_dir=cache) == load_openr1(path, source="s",
                                                                                        cache_dir=cache)
    assert SFT_FAMILIES == {"openr1": load_openr1, "chat": load_chat, "columns": load_columns}
    with pytest.raises(ValueError, match=re.escape("unknown SFT family 'sharegpt'; valid families: "
                                                   "['chat', 'columns', 'openr1']")):
        load_sft_source("sharegpt", path)
    with pytest.raises(TypeError):
        load_sft_source("chat", path, prompt_field="question")


def test_sft_sample_to_chat_is_the_prompt_completion_format():
    sample = SFTSample("Q", "<think>t</think> A", "s", True, None, 0)
    assert sft_sample_to_chat(sample) == {"prompt": [{"role": "user", "content": "Q"}],
                                          "completion": [{"role": "assistant", "content": "<think>t</think> A"}]}


# ---------------------------------------------------------------------------------------------------------
# Benchmark problems: AIME (meta) and HMMT (top-level) schemas
# ---------------------------------------------------------------------------------------------------------
AIME_PROBLEM = "Find the number of ordered pairs $(x, y)$ of integers with $x^2 + y^2 = 25$."
HMMT_PROBLEM = "Compute the sum of all positive divisors of $2025$."


@pytest.mark.parametrize("fmt", FORMATS)
def test_aime_and_hmmt_files_both_load_problem_and_answer(tmp_path, cache, fmt):
    aime = save([aime_row("aime25/1", AIME_PROBLEM, "12", instruction=INSTRUCTION),
                 aime_row("aime25/2", "Second problem.", "070")], tmp_path, fmt, "aime")
    hmmt = save([hmmt_row(0, HMMT_PROBLEM, "3751", solution="long worked solution", instruction=INSTRUCTION),
                 hmmt_row(1, "Another one.", "\\frac{1}{2}")], tmp_path, fmt, "hmmt")
    assert load_eval_problems(aime, cache_dir=cache) == [
        EvalProblem("aime25/1", AIME_PROBLEM, "12", 0), EvalProblem("aime25/2", "Second problem.", "070", 1)]
    assert load_eval_problems(hmmt, cache_dir=cache) == [
        EvalProblem("0", HMMT_PROBLEM, "3751", 0), EvalProblem("1", "Another one.", "\\frac{1}{2}", 1)]


def test_eval_rows_of_both_schemas_in_one_file_and_integer_answers(tmp_path, cache):
    path = save([aime_row("a1", AIME_PROBLEM, "12"), hmmt_row("h1", HMMT_PROBLEM, "3751")], tmp_path, "jsonl")
    assert [(p.id, p.problem) for p in load_eval_problems(path, cache_dir=cache)] == [
        ("a1", AIME_PROBLEM), ("h1", HMMT_PROBLEM)]
    ints = save([{**aime_row("a", "P.", "0"), "meta": {"unique_id": 7, "problem": "P.", "solution": "x",
                                                       "answer": 12}}], tmp_path, "jsonl", "ints")
    assert load_eval_problems(ints, cache_dir=cache) == [EvalProblem("7", "P.", "12", 0)]


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_mixed_type_json_column_keeps_values_as_written(tmp_path, cache, suffix):
    # datasets gives a column with str and int values its Json type and decodes "070" to 70; the loader reads
    # local JSON with the json module, so "070" stays "070" (a .json file may hold one JSON list).
    rows = [aime_row("a0", "P0.", "070"), {**aime_row("a1", "P1.", "0"), "meta": {
        "unique_id": "a1", "problem": "P1.", "solution": "12", "answer": 12}}]
    path = tmp_path / f"mixed{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        write_jsonl(rows, path)
    assert load_eval_problems(path, cache_dir=cache) == [EvalProblem("a0", "P0.", "070", 0),
                                                         EvalProblem("a1", "P1.", "12", 1)]


def test_eval_schema_errors(tmp_path, cache):
    row = aime_row("a1", AIME_PROBLEM, "12")
    del row["meta"]["answer"], row["meta"]["solution"]
    path = save([aime_row("a0", "P.", "1"), row], tmp_path, "jsonl", "aime")
    with pytest.raises(SchemaError, match=error_at(path, 1, "meta.answer") + " is missing or null, and so is "
                       "'meta.solution'; expected the gold answer"):
        load_eval_problems(path, cache_dir=cache)
    row = hmmt_row(0, HMMT_PROBLEM, "1")
    row["messages"] = [{"role": "assistant", "content": "no user turn"}]
    path = save([row], tmp_path, "jsonl", "hmmt_no_user")
    with pytest.raises(SchemaError, match=error_at(path, 0, "messages") + " must contain a user message"):
        load_eval_problems(path, cache_dir=cache)
    path = save([{k: v for k, v in hmmt_row(0, HMMT_PROBLEM, "1").items() if k not in ("answer", "solution")}],
                tmp_path, "parquet", "hmmt_no_answer")
    with pytest.raises(SchemaError, match=error_at(path, 0, "answer") + " is missing or null, and so is 'solution'"):
        load_eval_problems(path, cache_dir=cache)


# ---------------------------------------------------------------------------------------------------------
# Malformed records: named by file and line (JSONL) or rows (Parquet), never datasets' generic error
# ---------------------------------------------------------------------------------------------------------
GOOD = json.dumps(klear_rl_row("What is 1+1?", "2"))


@pytest.mark.parametrize("bad, message", [
    (b'{"data_source": "x", "prompt": [', ("malformed JSON (Expecting value at column 33): "
                                           "'{\"data_source\": \"x\", \"prompt\": ['")),
    (b'{"data_source": "caf\xe9"}', ("invalid UTF-8 (byte 0xe9 at byte 21 of the line): "
                                    "b'{\"data_source\": \"caf\\xe9\"}'")),
    (b"null", "must be a JSON object, got null (None)"),
    (b"[1, 2]", "must be a JSON object, got array ([1, 2])"),
    (b"5", "must be a JSON object, got number (5)"),
    (b'"a string"', "must be a JSON object, got string ('a string')"),
    (GOOD.encode() + b" " + GOOD.encode(), "malformed JSON (Extra data at column "),  # two records on one line
])
def test_malformed_jsonl_record_is_named_by_file_and_line(tmp_path, cache, bad, message):
    path = tmp_path / "rl.jsonl"
    # line 4 is the bad one: the blank line 3 counts as a line, not as a row
    path.write_bytes(b"\n".join([GOOD.encode(), GOOD.encode(), b"", bad, GOOD.encode()]) + b"\n")
    with pytest.raises(SchemaError) as e:
        load_klear_rl(path, cache_dir=cache)
    assert str(e.value).startswith(f"{path} line 4: {message}")


@pytest.mark.parametrize("text, message", [
    (f"[{json.dumps(hmmt_row(1, 'P.', '2'))},\n 7]", "row 1: must be a JSON object, got number (7)"),
    ('[{"id": 1},\n {"id": ]', "line 2: malformed JSON (Expecting value at column 9)"),
    ('{\n  "id": 1,\n  "answer" 2\n}', "line 3: malformed JSON (Expecting ':' delimiter at column 12)"),
])
def test_malformed_json_document_is_named_by_line_or_row(tmp_path, cache, text, message):
    path = tmp_path / "doc.json"
    path.write_text(text)
    with pytest.raises(SchemaError, match=re.escape(f"{path} {message}")):
        load_eval_problems(path, cache_dir=cache)


def test_json_documents_still_load(tmp_path, cache):
    """A .json file may hold one list of rows, or one row pretty-printed over several lines (as datasets reads)."""
    row = hmmt_row(3, HMMT_PROBLEM, "42")
    listed, pretty = tmp_path / "list.json", tmp_path / "one.json"
    listed.write_text(json.dumps([row, row]))
    pretty.write_text(json.dumps(row, indent=2))
    problem = EvalProblem("3", HMMT_PROBLEM, "42", 0)
    assert load_eval_problems(listed, cache_dir=cache) == [problem, EvalProblem("3", HMMT_PROBLEM, "42", 1)]
    assert load_eval_problems(pretty, cache_dir=cache) == [problem]
    bom = tmp_path / "bom.jsonl"  # a UTF-8 byte-order mark before the first line is not an error
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\n")
    assert load_eval_problems(bom, cache_dir=cache) == [problem]


@pytest.mark.parametrize("content, why", [
    (b"", "Parquet file size is 0 bytes"),
    (b"garbage", "Parquet file size is 7 bytes, smaller than the minimum file footer (8 bytes)"),
])
def test_broken_parquet_file_is_named(tmp_path, cache, content, why):
    path = tmp_path / "rl.parquet"
    path.write_bytes(content)
    with pytest.raises(SchemaError, match=re.escape(f"{path}: not a readable Parquet file ({why})")):
        load_klear_rl(path, cache_dir=cache)


def test_damaged_parquet_row_group_is_named_by_its_rows(tmp_path, cache):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rl.parquet"
    pq.write_table(pa.Table.from_pylist([klear_rl_row(f"problem {i}", str(i)) for i in range(6)]), path,
                   row_group_size=2, compression="snappy")
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)  # rows 2-3
    data = bytearray(path.read_bytes())
    start = column.data_page_offset + 4
    data[start:column.data_page_offset + column.total_compressed_size] = b"\xab" * (
        column.total_compressed_size - 4)  # the page's contents overwritten, the footer intact
    path.write_bytes(bytes(data))
    with pytest.raises(SchemaError, match=re.escape(f"{path} rows 2-3 (row group 1): cannot be read (")):
        load_klear_rl(path, cache_dir=cache)


def test_malformed_file_in_a_directory_is_named(tmp_path, cache):
    folder = tmp_path / "data"
    write_jsonl([klear_rl_row("q", "1")] * 3, folder / "train.jsonl")
    with (folder / "train.jsonl").open("ab") as f:
        f.write(b'{"data_source": \n')
    with pytest.raises(SchemaError, match=re.escape(f"{folder}/train.jsonl line 4: malformed JSON")):
        load_klear_rl(folder, cache_dir=cache)


def test_single_file_has_only_the_train_split(tmp_path, cache):
    path = write_jsonl([klear_rl_row("q", "1")], tmp_path / "rl.jsonl")
    with pytest.raises(ValueError, match=re.escape("a single data file has one split, 'train'; got split 'test'")):
        load_klear_rl(path, split="test", cache_dir=cache)


def test_large_jsonl_is_read_without_holding_it_twice(tmp_path, cache):
    """A ~30 MB JSONL file through a loader: the peak of Python allocations stays below 2x the file (the
    samples themselves are ~1.2x; reading the whole text, then its lines, then the rows was ~4x). Mixed-type
    difficulty values (int and str), the case that made datasets lose the types."""
    path = tmp_path / "big.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i in range(30_000):
            f.write(json.dumps(messages_row(f"problem {i} " + "x" * 200, "<think>" + "y" * 800 + f"</think> {i}",
                                            difficulty=i if i % 2 else str(i))) + "\n")
    size = path.stat().st_size
    assert size > 25 * 2**20
    tracemalloc.start()
    try:
        samples = load_chat(path, cache_dir=cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(samples) == 30_000 and samples[7].difficulty == "7" and samples[8].difficulty == "8"
    assert peak < 2 * size, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"
