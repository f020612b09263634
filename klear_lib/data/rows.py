"""Rows in the real schemas, for fixtures and notebooks: ``write_jsonl`` and one row builder per schema
(``klear_rl_row``, ``openr1_row``, ``messages_row``, ``aime_row``, ``hmmt_row``, ``lcb_row``), so tests and notebooks
write their own small fixtures instead of shipping downloaded data (``klear_lib.data.hub`` reads them);
``sft_sample_to_chat`` turns a sample into the prompt/completion format ``klear_lib.train.sft.run_sft`` trains on."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path
from typing import Any

from klear_lib.data.hub import SFTSample


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
