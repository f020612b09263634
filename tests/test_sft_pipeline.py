"""The SFT data pipeline end to end on data in the real hub schemas (written here, loaded through the real
loaders), Top-K selection with K-center inside sources, and the SFT stage's helpers."""

import random

import numpy as np
import pytest
import torch

from klear_lib import models
from klear_lib.config import RLExperimentConfig, SFTExperimentConfig, checkpointing
from klear_lib.data import hub, pipeline, rows, selection, tasks, teachers
from klear_lib.train import sft

AIME_PROBLEM = ("Find the number of ordered pairs of positive integers such that the sum of their squares "
                "equals two hundred and fifty")


@pytest.fixture
def hub_sources(tmp_path):
    """Two SFT sources in two real schemas and one benchmark file, on disk."""
    openr1 = [
        rows.openr1_row("What is 1 + 1?", ["<think>1+1=2</think> \\boxed{2}", "<think>1+1=3</think> \\boxed{3}"],
                       [True, False]),
        rows.openr1_row(AIME_PROBLEM + " exactly?", ["<think>...</think> \\boxed{4}"], [True]),  # contaminated
        rows.openr1_row("What is 1 + 1?", ["<think>1+1=2</think> \\boxed{2}"], [True]),  # duplicate of row 0
    ]
    chat = [rows.messages_row("Compute 2 + 2.", "<think>2+2=4</think> \\boxed{4}", layout="conversations",
                             roles=("human", "gpt")),
            rows.messages_row("What is 1 + 1?", "<think>1+1=2</think> \\boxed{2}", layout="conversations",
                             roles=("human", "gpt"))]
    paths = {"openr1": rows.write_jsonl(openr1, tmp_path / "openr1.jsonl"),
             "chat": rows.write_jsonl(chat, tmp_path / "chat.jsonl"),
             "aime": rows.write_jsonl([rows.aime_row("2024-I-1", AIME_PROBLEM, "4")], tmp_path / "aime.jsonl")}
    return paths, tmp_path / "cache"


def test_prepare_pool_on_real_schemas(hub_sources):
    paths, cache = hub_sources
    by_source = {"openr1": hub.load_sft_source("openr1", paths["openr1"], cache_dir=cache),
                 "chat": hub.load_sft_source("chat", paths["chat"], cache_dir=cache)}
    refs = [p.problem for p in hub.load_eval_problems(paths["aime"], cache_dir=cache)]
    pool, report = pipeline.prepare_pool(by_source, refs)
    rep = {r["source"]: r for r in report}
    # openr1's verdicts: True, False (row 0), True (contaminated), True (duplicate): 3 of 4 right, 1 of 2 kept
    assert rep["openr1"] == {"source": "openr1", "samples": 4, "contaminated": 1, "duplicates": 1, "kept": 2,
                             "teacher_correct": 0.75, "kept_correct": 0.5, "expected_correct": None}
    assert rep["chat"] == {"source": "chat", "samples": 2, "contaminated": 0, "duplicates": 0, "kept": 2,
                           "teacher_correct": None, "kept_correct": None, "expected_correct": None}
    # the same problem answered by two sources is two samples: de-duplication is per source
    assert sum(s["prompt"] == "What is 1 + 1?" for s in pool) == 3
    assert all(s["source"] in ("openr1", "chat") for s in pool)
    only_true = selection.filter_by_correctness([s for s in pool if s["source"] == "openr1"], "only_true")
    assert [s["response"] for s in only_true] == ["<think>1+1=2</think> \\boxed{2}"]
    rows = sft.chat_rows(pool)
    assert rows[0] == {"prompt": [{"role": "user", "content": "What is 1 + 1?"}],
                       "completion": [{"role": "assistant", "content": "<think>1+1=2</think> \\boxed{2}"}]}


def test_dedup_by_prompt_keeps_the_first_response_of_each_prompt():
    # a deterministic teacher: identical right answers, distinct wrong ones (level 1 right 3 of 4, level 2 1 of 2)
    raw = [{"prompt": "q1", "response": "right", "verdict": True, "level": 1},
           {"prompt": "q1", "response": "right", "verdict": True, "level": 1},
           {"prompt": "q1", "response": "wrong a", "verdict": False, "level": 1},
           {"prompt": "q1", "response": "right", "verdict": True, "level": 1},
           {"prompt": "q2", "response": "wrong b", "verdict": False, "level": 2},
           {"prompt": "q2", "response": "right 2", "verdict": True, "level": 2}]
    _, (by_response,) = pipeline.prepare_pool({"s": raw}, [], dedup="response")
    pool, (by_prompt,) = pipeline.prepare_pool({"s": raw}, [], dedup="prompt")
    _, (none,) = pipeline.prepare_pool({"s": raw}, [], dedup=None)
    # exact dedup keeps right, wrong a (level 1), wrong b, right 2 (level 2): 2 of 4 right where the teacher is
    # 4 of 6 right; the teacher's accuracy at the kept levels: (2 * 0.75 + 2 * 0.5) / 4 = 0.625
    assert (by_response["kept"], by_response["kept_correct"]) == (4, 0.5)
    assert by_response["teacher_correct"] == pytest.approx(4 / 6)
    assert by_response["expected_correct"] == pytest.approx(0.625)
    # by prompt: the first response of q1 (right) and of q2 (wrong b)
    assert [s["response"] for s in pool] == ["right", "wrong b"]
    assert (by_prompt["kept"], by_prompt["duplicates"], by_prompt["kept_correct"]) == (2, 4, 0.5)
    assert by_prompt["expected_correct"] == pytest.approx((0.75 + 0.5) / 2)
    assert (none["kept"], none["kept_correct"]) == (6, pytest.approx(4 / 6))
    with pytest.raises(ValueError, match="dedup must be one of"):
        pipeline.prepare_pool({"s": raw}, [], dedup="exact")


def test_dedup_by_prompt_keeps_a_synthetic_teachers_accuracy():
    """The defect the issue found: exact dedup on a careful deterministic teacher enriches errors; by prompt the
    kept share of correct responses is the teacher's accuracy at the kept levels (within sampling noise)."""
    train, _ = tasks.make_splits(0, 3000, 0)
    raw = {"clean": teachers.source_samples(teachers.SOURCES["clean"], train, 3000, seed=0)}
    _, (exact,) = pipeline.prepare_pool(raw, [], dedup="response")
    _, (by_prompt,) = pipeline.prepare_pool(raw, [], dedup="prompt")
    assert exact["kept_correct"] < exact["expected_correct"] - 0.1
    assert abs(by_prompt["kept_correct"] - by_prompt["expected_correct"]) < 0.03


def test_prepare_pool_rejects_samples_without_text():
    with pytest.raises(ValueError, match="sample 1 of source 'a'"):
        pipeline.prepare_pool({"a": [{"prompt": "p", "response": "r"}, {"prompt": "p"}]}, [])
    with pytest.raises(TypeError, match="sample 0 of source 'a'"):
        pipeline.prepare_pool({"a": ["text"]}, [])


def _pool(n_per_source=30):
    out = []
    for src in ("a", "b", "c"):
        for i in range(n_per_source):
            out.append({"source": src, "prompt": f"{src} problem {i % 10}", "response": "r"})
    return out


def test_top_k_with_a_pick_uses_it_inside_each_source():
    calls = []

    def first_ones(source_samples, count, rng):
        calls.append((source_samples[0]["source"], len(source_samples), count))
        return list(range(count))

    chosen = selection.top_k_sources(_pool(), {"a": 3, "b": 2, "c": 1}, 2, 10, seed=0, pick=first_ones)
    assert sorted(calls) == [("a", 30, 5), ("b", 30, 5)]
    assert [s["prompt"] for s in chosen] == [f"a problem {i}" for i in range(5)] + [f"b problem {i}" for i in range(5)]


@pytest.mark.parametrize("bad", [lambda s, c, r: [0] * c, lambda s, c, r: list(range(c + 1)),
                                 lambda s, c, r: [len(s)] + list(range(c - 1))])
def test_top_k_rejects_a_bad_pick(bad):
    with pytest.raises(ValueError, match="pick returned"):
        selection.top_k_sources(_pool(), {"a": 1, "b": 0, "c": 0}, 1, 4, seed=0, pick=bad)


def test_k_center_pick_takes_every_distinct_prompt_before_any_repeat():
    # 30 samples per source over 10 distinct prompts: a budget of 10 from one source is the 10 distinct ones
    chosen = selection.top_k_sources(_pool(), {"a": 1, "b": 0, "c": 0}, 1, 10, seed=3,
                                     pick=selection.k_center_pick(dim=64))
    assert sorted(s["prompt"] for s in chosen) == sorted(f"a problem {i}" for i in range(10))
    uniform = selection.top_k_sources(_pool(), {"a": 1, "b": 0, "c": 0}, 1, 10, seed=3)
    assert len({s["prompt"] for s in uniform}) < 10  # a uniform draw of 10 of 30 repeats (P(no repeat) ≈ 2e-4)


def test_k_center_pick_names_a_sample_without_the_field():
    pick = selection.k_center_pick(field="question")
    with pytest.raises(ValueError, match="needs a str 'question'"):
        pick([{"source": "a", "prompt": "x"}], 1, random.Random(0))


def test_sft_experiment_config_is_strict_and_feeds_the_sft_stage():
    cfg = SFTExperimentConfig.from_params({"sft_lr": 1e-3, "seed": 3})
    stage = sft.SFTStageConfig.from_experiment(cfg, epochs=0.5)
    assert (stage.learning_rate, stage.seed, stage.batch_size, stage.epochs, stage.max_length) == (1e-3, 3, 8, 0.5, 256)
    with pytest.raises(ValueError, match="unknown key.*sft_rate"):
        SFTExperimentConfig.from_params({"sft_rate": 1e-3})
    with pytest.raises(TypeError, match="SFTExperimentConfig.n_val must be int"):
        SFTExperimentConfig.from_params({"n_val": "64"})
    assert cfg.replace(levels="1,4").level_list == (1, 4)


def test_load_for_sft_without_unsloth_is_plain_transformers(tmp_path):
    train, _ = tasks.make_splits(0, 50, 4)
    tok = models.build_tokenizer(tasks.corpus(train), vocab_size=300)
    models.save_model_and_tokenizer(models.build_tiny_model(tok), tok, tmp_path / "m")
    if not sft.unsloth_available():
        model, tok2 = sft.load_for_sft(tmp_path / "m", bf16=False)
        assert type(model).__name__ == "Qwen3ForCausalLM" and model.dtype == torch.float32
        with pytest.raises(RuntimeError, match="unsloth"):
            sft.load_for_sft(tmp_path / "m", use_unsloth=True)


def test_sft_from_learns_the_selected_samples(tmp_path):
    """Continued SFT from a saved model lowers the loss on the samples it was given (learning happened)."""
    train, _ = tasks.make_splits(0, 200, 4)
    tok = models.build_tokenizer(tasks.corpus(train), vocab_size=300)
    models.save_model_and_tokenizer(models.build_tiny_model(tok, seed=0), tok, tmp_path / "start")
    samples = teachers.source_samples(teachers.SOURCES["clean"], train, 64, seed=0)
    rows = sft.chat_rows(samples)

    def loss(model):
        text = [tok.apply_chat_template(r["prompt"] + r["completion"], tokenize=False) for r in rows[:16]]
        enc = tok(text, return_tensors="pt", padding=True)
        with torch.no_grad():
            return model(**enc, labels=enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)).loss.item()

    before = loss(models.load_model_and_tokenizer(tmp_path / "start", dtype=torch.float32)[0])
    model, _ = sft.sft_from(tmp_path / "start", samples, tmp_path / "out",
                            sft.SFTStageConfig(learning_rate=3e-3, epochs=3, batch_size=8, resume=False))
    assert (tmp_path / "out" / "final" / "config.json").exists()
    assert loss(model) < 0.6 * before
    with pytest.raises(ValueError, match="no samples"):
        sft.sft_from(tmp_path / "start", [], tmp_path / "o2", sft.SFTStageConfig())


def test_length_grouped_batches_pad_little_and_see_every_sample_once_an_epoch(tmp_path):
    """Issue 46: batches of similar lengths (opt-in: they change what 02's bases learn). Over samples of every level
    (lengths differ by level), both samplers
    give each sample once an epoch and the same real tokens (an invariant of the data, not of the batching); the
    grouped one pads at most 5% of its positions where random batches pad far more; each run records its share."""
    train, _ = tasks.make_splits(0, 400, 4, [1, 2, 3, 4])
    tok = models.build_tokenizer(tasks.corpus(train), vocab_size=300)
    models.save_model_and_tokenizer(models.build_tiny_model(tok, seed=0), tok, tmp_path / "start")
    samples = sft.sft_samples(train, seed=0)
    stats = {}
    for grouped in (False, True):
        stage = sft.SFTStageConfig(learning_rate=3e-3, epochs=1, batch_size=8, resume=False, length_grouped=grouped,
                                   packed=False)  # the samplers' padding alone (packing: tests/test_sft_packing.py)
        sft.sft_from(tmp_path / "start", samples, tmp_path / f"out_{grouped}", stage)
        stats[grouped] = sft.sft_token_stats(tmp_path / f"out_{grouped}")
    random_, grouped_ = stats[False], stats[True]
    assert random_["samples"] == grouped_["samples"] == len(samples)
    assert random_["tokens"] == grouped_["tokens"] > 0
    assert grouped_["sampling"] == "group_by_length" and random_["sampling"] == "random"
    assert grouped_["padding_share"] <= 0.05 < random_["padding_share"], stats
    assert grouped_["padding_share"] == pytest.approx(1 - grouped_["tokens"] / grouped_["positions"], abs=1e-6)
    with pytest.raises(TypeError, match="length_grouped must be true or false"):
        sft.SFTStageConfig(length_grouped="yes")


def test_gradient_checkpointing_defaults_off_on_a_cpu_and_changes_no_weight(tmp_path, monkeypatch):
    """``None`` resolves to recomputation on a GPU only; set, it is what was set. On a CPU, SFT with and without it
    reaches the same weights bit for bit (so the CPU presets may skip its cost), and TRL is given the resolved value."""
    assert [checkpointing(RLExperimentConfig(use_cpu=c)) for c in (True, False)] == [False, True]
    assert checkpointing(RLExperimentConfig(gradient_checkpointing=True)) is True
    assert checkpointing(sft.SFTStageConfig()) is False and checkpointing(sft.SFTStageConfig(use_cpu=False)) is True
    assert sft.SFTStageConfig.from_experiment(RLExperimentConfig(gradient_checkpointing=True)).gradient_checkpointing
    train, _ = tasks.make_splits(0, 100, 4)
    tok = models.build_tokenizer(tasks.corpus(train), vocab_size=300)
    models.save_model_and_tokenizer(models.build_tiny_model(tok, seed=0), tok, tmp_path / "start")
    samples = teachers.source_samples(teachers.SOURCES["clean"], train, 32, seed=0)
    seen = []
    real = sft.SFTConfig
    monkeypatch.setattr(sft, "SFTConfig", lambda **kw: seen.append(kw["gradient_checkpointing"]) or real(**kw))
    weights = []
    for on in (True, None):
        stage = sft.SFTStageConfig(learning_rate=3e-3, epochs=1, batch_size=8, resume=False, gradient_checkpointing=on)
        model, _ = sft.sft_from(tmp_path / "start", samples, tmp_path / f"out_{on}", stage)
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
    assert seen == [True, False]
    start = models.load_model_and_tokenizer(tmp_path / "start", dtype=torch.float32)[0].state_dict()
    assert any(not torch.equal(weights[0][k], start[k]) for k in start)  # it trained
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.gpu
def test_load_for_sft_uses_unsloth_on_a_gpu(tmp_path):
    pytest.importorskip("unsloth")
    train, _ = tasks.make_splits(0, 50, 4)
    tok = models.build_tokenizer(tasks.corpus(train), vocab_size=300)
    models.save_model_and_tokenizer(models.build_tiny_model(tok), tok, tmp_path / "m")
    assert sft.unsloth_available()
    model, tok2 = sft.load_for_sft(tmp_path / "m", max_length=256, bf16=True, use_unsloth=True)  # opt-in
    import sys
    assert "unsloth" in sys.modules and next(model.parameters()).is_cuda
    enc = tok2(["<think>\n1 + 2 = 3\n</think>\n\\boxed{3}"], return_tensors="pt").to("cuda")
    out = model(**enc, labels=enc["input_ids"])
    out.loss.backward()  # full fine-tuning: every parameter gets a gradient
    assert torch.isfinite(out.loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_hashed_embedding_is_what_k_center_pick_uses():
    # k_center_pick's first pick comes from the source rng, the rest are K-center greedy on the hashed embedding
    samples = [{"source": "a", "prompt": p} for p in ("x y", "x y", "far away text", "x z")]
    rng = random.Random(0)
    first = random.Random(0).randrange(4)
    got = selection.k_center_pick(dim=32)(samples, 3, rng)
    emb = selection.hashed_ngram_embedding([s["prompt"] for s in samples], dim=32)
    assert got == selection.k_center_greedy(emb, 3, first=first)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0)
