"""klear_lib.sampler against transformers ``generate`` on the tiny Qwen3 stand-in: the same logits at every step,
the same tokens (greedy, and sampled from the same seed), the same distribution of sampled tokens from other seeds
(a test that does not lean on identical draws), HF's EOS and padding rule, and HF generate wherever the sampler
does not apply (other models, YaRN, the switch off), in the RL trainer and the evaluation engine too."""

from __future__ import annotations

import copy
import inspect
import math
import warnings

import pytest
import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, PrinterCallback
from trl import GRPOConfig, GRPOTrainer

from klear_lib import models, sampler
from klear_lib.data import tasks
from klear_lib.rollout import HFEngine, SamplingConfig, yarn_rope_parameters


@pytest.fixture(scope="module")
def tok():
    train, _ = tasks.make_splits(0, 200, 10)
    return models.build_tokenizer(tasks.corpus(train))


@pytest.fixture(scope="module")
def model(tok):
    """The stand-in as the notebooks build it (hidden 128, 4 layers, 4 heads, 2 KV heads, fp32), eval mode."""
    return models.build_tiny_model(tok, seed=0).eval()


@pytest.fixture(scope="module")
def sharp(tok):
    """The stand-in with its final norm's weight × 10: a random model's next-token distribution is nearly uniform
    over the vocabulary (≈ 295 tokens effective); this one's is peaked as a trained model's (≈ 48 at T 1, ≈ 11 at
    T 0.6), so that temperature and top-p change what is drawn and a distribution test has power."""
    m = models.build_tiny_model(tok, seed=0).eval()
    with torch.no_grad():
        m.model.norm.weight.mul_(10)
    return m


def batch(tok, n: int, seed: int = 1):
    """``n`` left-padded chat prompts of mixed lengths (some cut short, so the padding differs row to row)."""
    problems = tasks.make_splits(seed, n, 1)[0]
    texts = [tok.apply_chat_template(tasks.prompt_messages(p), tokenize=False, add_generation_prompt=True)
             for p in problems]
    texts = [t[-(12 + 5 * (i % 7)):] if i % 3 == 0 else t for i, t in enumerate(texts)]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    lengths = enc["attention_mask"].sum(1)
    assert lengths.min() < lengths.max() - 5  # mixed lengths: real left padding
    return enc["input_ids"], enc["attention_mask"]


def settings(tok, **kw):
    return dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **kw)


def explicit(kw: dict) -> dict:
    """``sampler.generate`` passes each filter on, None included; HF generate given None switches the filter off
    (left out, top_k would be HF's default, 50). Both sides get the same keywords."""
    return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None, "repetition_penalty": None, **kw}


def hf(model, ids, mask, **kw):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(input_ids=ids, attention_mask=mask, **explicit(kw))


def ours(model, ids, mask, **kw):
    before = sampler.PATHS_USED["klear"]
    out = sampler.generate(model, ids, mask, **explicit(kw))
    assert sampler.PATHS_USED["klear"] == before + 1  # the fast path, not a fallback
    return out


# (a) the forward ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)])
def test_teacher_forced_logits_equal_hf_generates_at_every_step(tok, model, dtype, atol):
    """HF generate's own raw logits (``output_logits``) at each of 24 steps, against ``_Forward`` fed the same
    tokens: prefill, then one step per token, over a left-padded batch of mixed prompt lengths. fp32: within 1e-5
    (measured 5e-7); bf16 weights: within two bf16 steps at |logit| < 2 (measured 0.0078, one step)."""
    model = copy.deepcopy(model).to(dtype)
    ids, mask = batch(tok, 24)
    out = hf(model, ids, mask, max_new_tokens=24, do_sample=True, temperature=1.0, return_dict_in_generate=True,
             output_logits=True, **settings(tok))
    B, L = ids.shape
    steps = len(out.logits)
    assert steps == 24
    seq = out.sequences
    fwd = sampler._Forward(model, B, L + steps)
    m = mask.long()
    pos = (m.cumsum(-1) - 1).masked_fill(m == 0, 0)
    bias = torch.zeros(B, 1, 1, L + steps)
    bias[:, 0, 0, :L].masked_fill_(m == 0, float("-inf"))
    with torch.no_grad():
        mine = [fwd.prefill(ids, m, pos)]
        for t in range(steps - 1):
            mine.append(fwd.step(seq[:, L + t], L + t, pos[:, -1] + 1 + t, bias[..., : L + t + 1]))
    for t, (a, b) in enumerate(zip(out.logits, mine, strict=True)):
        assert a.abs().max() > 0.05  # logits worth comparing
        assert a.abs().max() < 2
        torch.testing.assert_close(b.float(), a, rtol=0, atol=atol, msg=lambda s, t=t: f"step {t}: {s}")


# (b) greedy, (c) sampling -------------------------------------------------------------------------------------


@pytest.mark.parametrize("penalty", [None, 1.3])
def test_greedy_output_is_hf_generates(tok, model, penalty):
    ids, mask = batch(tok, 32)
    kw = settings(tok, max_new_tokens=40, do_sample=False, repetition_penalty=penalty)
    a = hf(model, ids, mask, **kw)
    b = ours(model, ids, mask, **kw)
    assert b.shape == a.shape and torch.equal(b, a)
    assert torch.equal(b[:, : ids.shape[1]], ids)  # the prompt, padding included, is returned as given


def test_weights_are_read_at_each_call(tok):
    """A weight changed in place between two calls (as an optimizer step does) is used by the next call."""
    m = models.build_tiny_model(tok, seed=1).eval()
    ids, mask = batch(tok, 8)
    kw = settings(tok, max_new_tokens=12, do_sample=False)
    before = ours(m, ids, mask, **kw)
    with torch.no_grad():
        m.model.layers[1].self_attn.q_proj.weight.mul_(-3)
        m.model.layers[2].mlp.up_proj.weight.add_(0.05)
    after = ours(m, ids, mask, **kw)
    assert not torch.equal(after, before) and torch.equal(after, hf(m, ids, mask, **kw))


SAMPLING = {"T1": dict(temperature=1.0), "T0.6_p0.95": dict(temperature=0.6, top_p=0.95),
            "eval_protocol": dict(temperature=0.6, top_p=0.95, top_k=20, repetition_penalty=1.05)}


@pytest.mark.parametrize("name", list(SAMPLING))
def test_sampled_output_from_the_same_seed_is_hf_generates(tok, sharp, name):
    """Identical logits make identical draws (the same processors, one ``torch.multinomial`` per step on the global
    generator); a row may differ only where a float difference in the logits crosses a sampling boundary.
    Measured: every row identical in all three settings (64 rows × 48 tokens, mixed lengths)."""
    ids, mask = batch(tok, 64, seed=2)
    kw = settings(tok, max_new_tokens=48, do_sample=True, **SAMPLING[name])
    torch.manual_seed(123)
    a = hf(sharp, ids, mask, **kw)
    after_hf = torch.rand(1)
    torch.manual_seed(123)
    b = ours(sharp, ids, mask, **kw)
    after_ours = torch.rand(1)
    width = min(a.shape[1], b.shape[1])
    same = (a[:, :width] == b[:, :width]).all(1).float().mean().item()
    print(f"{name}: {same:.1%} of rows identical")
    assert same >= 0.9, same
    if same == 1.0:
        assert a.shape == b.shape
        assert torch.equal(after_hf, after_ours)  # and the generator is left where HF leaves it


def _chi_square_p(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample chi-square test of homogeneity over token ids (categories expected < 5 times pooled)."""
    V = int(max(a.max(), b.max())) + 1
    ca, cb = torch.bincount(a, minlength=V).double(), torch.bincount(b, minlength=V).double()
    total = ca + cb
    na, nb = ca.sum(), cb.sum()
    ea, eb = total * na / (na + nb), total * nb / (na + nb)
    big = (ea >= 5) & (eb >= 5)
    obs = torch.stack([torch.cat([ca[big], ca[~big].sum()[None]]), torch.cat([cb[big], cb[~big].sum()[None]])])
    exp = torch.stack([torch.cat([ea[big], ea[~big].sum()[None]]), torch.cat([eb[big], eb[~big].sum()[None]])])
    keep = exp.sum(0) > 0
    obs, exp = obs[:, keep], exp[:, keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


@pytest.mark.parametrize("name", ["T1", "T0.6_p0.95"])
def test_the_distribution_of_sampled_tokens_is_hf_generates(tok, sharp, name):
    """2,048 continuations of one prompt from each sampler, from different seeds (so no draw is shared): the
    first three tokens' distributions agree (chi-square homogeneity, p > 0.001 at each position; the seeds are
    fixed, so the test is deterministic). The test has power: the same statistic tells T 1 from T 0.6 + top-p
    0.95 apart at p < 1e-6."""
    ids, mask = batch(tok, 8, seed=3)
    ids, mask = ids[:1].repeat(2048, 1), mask[:1].repeat(2048, 1)
    kw = settings(tok, max_new_tokens=3, do_sample=True, **SAMPLING[name])
    torch.manual_seed(1)
    a = hf(sharp, ids, mask, **kw)[:, -3:]
    torch.manual_seed(2)
    b = ours(sharp, ids, mask, **kw)[:, -3:]
    ps = [_chi_square_p(a[:, k], b[:, k]) for k in range(3)]
    print(f"{name}: p = {[round(p, 4) for p in ps]}")
    assert min(ps) > 0.001, ps
    other = "T0.6_p0.95" if name == "T1" else "T1"
    torch.manual_seed(2)
    c = ours(sharp, ids, mask, **settings(tok, max_new_tokens=1, do_sample=True, **SAMPLING[other]))[:, -1]
    assert _chi_square_p(a[:, 0], c) < 1e-6


# (d) EOS ------------------------------------------------------------------------------------------------------


def test_rows_that_finish_are_pad_afterwards_and_eos_at_the_first_step(tok, model):
    """EOS is made the token that greedy decoding gives row 0 first: row 0 ends at step 1, others whenever that
    token comes; every token after a row's first EOS is pad, as HF writes it."""
    ids, mask = batch(tok, 16)
    first = hf(model, ids, mask, **settings(tok, max_new_tokens=1, do_sample=False))[:, -1]
    eos = int(first[0])
    assert eos != tok.pad_token_id
    kw = dict(max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    a, b = hf(model, ids, mask, **kw), ours(model, ids, mask, **kw)
    assert torch.equal(b, a)
    new = b[:, ids.shape[1]:]
    assert new[0, 0] == eos and (new[0, 1:] == tok.pad_token_id).all()
    finished = 0
    for row in new.tolist():
        if eos in row:
            finished += 1
            assert all(t == tok.pad_token_id for t in row[row.index(eos) + 1:])
    assert finished >= 2  # more than row 0
    # sampled, with two EOS ids: the same rule
    kw = dict(max_new_tokens=30, do_sample=True, temperature=1.0, eos_token_id=[eos, int(first[1])],
              pad_token_id=tok.pad_token_id)
    torch.manual_seed(5)
    a = hf(model, ids, mask, **kw)
    torch.manual_seed(5)
    assert torch.equal(ours(model, ids, mask, **kw), a)


def test_finished_rows_leave_the_forward_and_the_draws_stay_hf_s(tok, sharp, monkeypatch):
    """Rows that finish are dropped from the forward (``_Forward.keep``) while every row is still drawn for: with
    EOS ids that end most rows early, the forward shrinks several times and the tokens stay HF's (sampled, same
    seed). Measured: every row identical."""
    ids, mask = batch(tok, 64, seed=5)
    probe = hf(sharp, ids, mask, **settings(tok, max_new_tokens=16, do_sample=False))[:, ids.shape[1]:]
    eos = torch.bincount(probe.flatten()).topk(3).indices.tolist()
    kept = []
    keep = sampler._Forward.keep
    monkeypatch.setattr(sampler._Forward, "keep", lambda self, rows, used: (kept.append(len(rows)),
                                                                            keep(self, rows, used)))
    kw = dict(max_new_tokens=40, do_sample=True, temperature=1.0, top_p=0.95, eos_token_id=eos,
              pad_token_id=tok.pad_token_id)
    torch.manual_seed(9)
    a = hf(sharp, ids, mask, **kw)
    torch.manual_seed(9)
    b = ours(sharp, ids, mask, **kw)
    assert len(kept) >= 2 and kept == sorted(kept, reverse=True) and kept[-1] < 32, kept
    width = min(a.shape[1], b.shape[1])
    same = (a[:, :width] == b[:, :width]).all(1).float().mean().item()
    print(f"forward rows {kept}: {same:.1%} of rows identical")
    assert same >= 0.9, same


def test_generation_stops_when_every_row_has_finished(tok, model):
    """All rows end at step 1: one new token, the output as long as HF's (not max_new_tokens)."""
    ids, mask = batch(tok, 8)
    first = hf(model, ids, mask, **settings(tok, max_new_tokens=1, do_sample=False))[:, -1]
    kw = dict(max_new_tokens=20, do_sample=False, eos_token_id=sorted(set(first.tolist())),
              pad_token_id=tok.pad_token_id)
    a, b = hf(model, ids, mask, **kw), ours(model, ids, mask, **kw)
    assert b.shape[1] == ids.shape[1] + 1 and torch.equal(b, a)


# (e) where it applies -----------------------------------------------------------------------------------------


def test_supports_only_the_qwen3_forward_it_implements(tok, model, monkeypatch):
    assert sampler.supports(model)
    assert sampler.supports(copy.deepcopy(model).to(torch.bfloat16))
    yarn_cfg = copy.deepcopy(model.config)
    yarn_cfg.rope_parameters = yarn_rope_parameters(4.0, 512, 10000.0)
    yarn = type(model)(yarn_cfg).eval()
    assert not sampler.supports(yarn)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    assert not sampler.supports(llama)
    monkeypatch.setattr(sampler, "MAX_PARAMETERS", sum(p.numel() for p in model.parameters()) - 1)
    assert not sampler.supports(model)  # a real model's size
    monkeypatch.undo()
    sliding = copy.deepcopy(model.config)
    sliding.use_sliding_window, sliding.sliding_window = True, 8
    assert not sampler.supports(type(model)(sliding))
    # where it does not apply, generate is HF's own, tokens and all
    ids, mask = batch(tok, 4)
    kw = settings(tok, max_new_tokens=6, do_sample=False)
    for other in (yarn, llama.eval()):
        before = dict(sampler.PATHS_USED)
        with torch.no_grad():
            got = sampler.generate(other, ids, mask, temperature=None, top_p=None, top_k=None,
                                   repetition_penalty=None, **kw)
        assert sampler.PATHS_USED["hf"] == before.get("hf", 0) + 1
        assert torch.equal(got, hf(other, ids, mask, **kw))


def test_the_switch_turns_it_off(tok, model, monkeypatch):
    ids, mask = batch(tok, 4)
    monkeypatch.setenv(sampler.ENV, "off")
    assert not sampler.enabled() and sampler.setting().startswith("hf generate")
    before = sampler.PATHS_USED["hf"]
    sampler.generate(model, ids, mask, max_new_tokens=3, do_sample=False, **settings(tok))
    assert sampler.PATHS_USED["hf"] == before + 1
    monkeypatch.delenv(sampler.ENV)
    assert sampler.enabled() and sampler.setting().startswith("klear_lib.sampler")


def test_calls_it_does_not_cover_go_to_hf(tok, model):
    """Beams, several sequences per prompt, scores in a dict: HF generate (the same object back)."""
    ids, mask = batch(tok, 2)
    for extra in (dict(num_beams=2), dict(num_return_sequences=2, do_sample=True),
                  dict(return_dict_in_generate=True, output_scores=True)):
        kw = {**settings(tok, max_new_tokens=3, do_sample=False), **extra}
        before = sampler.PATHS_USED["hf"]
        torch.manual_seed(0)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = sampler.generate_like_hf(model, ids, mask, **explicit(kw))
        assert sampler.PATHS_USED["hf"] == before + 1
        torch.manual_seed(0)
        want = hf(model, ids, mask, **kw)
        assert type(got) is type(want)
        if isinstance(want, torch.Tensor):
            assert torch.equal(got, want)


# the wiring: the evaluation engine and the RL trainer ---------------------------------------------------------


def test_the_engine_samples_through_it_with_hf_generates_tokens(tok, sharp, monkeypatch):
    engine = HFEngine(sharp, tok, batch_size=16)
    prompts = [tasks.prompt_messages(p) for p in tasks.make_splits(4, 0, 6)[1]]
    cfg = SamplingConfig(n=4, max_new_tokens=24)  # the paper's protocol: T 0.6, top-p 0.95, top-k 20, rep. 1.05
    before = sampler.PATHS_USED["klear"]
    fast = engine.generate(prompts, cfg, seed=7)
    assert sampler.PATHS_USED["klear"] == before + 2  # 24 rows in batches of 16
    monkeypatch.setenv(sampler.ENV, "off")
    assert engine.generate(prompts, cfg, seed=7) == fast


def test_trl_generation_call_that_the_trainer_hook_relies_on():
    """KlearGRPOTrainer._generate_single_turn swaps ``generate`` on the unwrapped model: TRL's plain branch must
    still call it, with the trainer's generation config."""
    src = inspect.getsource(GRPOTrainer._generate_single_turn)
    assert "unwrapped_model.generate(\n" in src and "generation_config=self.generation_config" in src
    assert list(inspect.signature(GRPOTrainer._generate_single_turn).parameters)[:2] == ["self", "prompt_ids"]


def _one_rollout_completions(tok, tmp_path, monkeypatch, on: bool):
    from klear_lib.recipe import KlearLossConfig
    from klear_lib.train.rl import KlearGRPOTrainer

    monkeypatch.setenv(sampler.ENV, "on" if on else "off")
    train, _ = tasks.make_splits(0, 16, 1)
    ds = Dataset.from_list([{"prompt": tasks.prompt_messages(p), "answer": p.answer} for p in train])
    spec = models.TinyModelSpec(hidden_size=64, num_hidden_layers=2, intermediate_size=128)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, steps_per_generation=1,
                      gradient_accumulation_steps=1, num_generations=4, max_completion_length=16, temperature=0.9,
                      top_p=0.95, learning_rate=1e-3, max_steps=1, beta=0.0, use_cpu=True, bf16=False,
                      report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0)
    seen = []

    def reward(completions, completion_ids, **kw):
        seen.extend(tuple(c) for c in completion_ids)
        return [float(len(c) % 2) for c in completion_ids]

    trainer = KlearGRPOTrainer(model=models.build_tiny_model(tok, spec, seed=0), reward_funcs=[reward], args=args,
                               train_dataset=ds, processing_class=tok,
                               klear=KlearLossConfig(loss_name="gppo", filter_groups=False), rollouts=1)
    trainer.remove_callback(PrinterCallback)
    before = dict(sampler.PATHS_USED)
    trainer.train()
    took = {k: sampler.PATHS_USED[k] - before.get(k, 0) for k in ("klear", "hf")}
    return seen, took


def test_the_rl_trainer_samples_through_it_with_hf_generates_tokens(tok, tmp_path, monkeypatch):
    fast, took = _one_rollout_completions(tok, tmp_path / "on", monkeypatch, on=True)
    assert took["klear"] >= 1 and took["hf"] == 0
    slow, took = _one_rollout_completions(tok, tmp_path / "off", monkeypatch, on=False)
    assert took["klear"] == 0
    assert len(fast) >= 8 and fast == slow  # same seed, same completions (8 a generation batch)
    assert "generate" not in vars(models.build_tiny_model(tok))  # (the swap is on an instance, undone after)


def test_chi_square_helper_against_a_hand_computed_case():
    """Counts 30/10 against 20/20: expected 25/15 twice, statistic 2·(25/25 + 25/15) = 5.333, df 1,
    p = erfc(sqrt(5.333 / 2)) = 0.0209."""
    a = torch.tensor([0] * 30 + [1] * 10)
    b = torch.tensor([0] * 20 + [1] * 20)
    assert _chi_square_p(a, b) == pytest.approx(math.erfc(math.sqrt(16 / 3 / 2)), rel=1e-9)


def test_every_notebook_run_records_its_generation_path(tmp_path, monkeypatch):
    """``versions.json`` says which path a run's stand-in took (issue 46): ours by default, HF's when switched off."""
    import json

    from klear_lib import notebook, runs

    monkeypatch.delenv(sampler.ENV, raising=False)
    notebook.start_run("x", str(tmp_path / "on"), {"x": 1})
    on = json.loads((tmp_path / "on" / runs.VERSIONS_FILE).read_text())["sampler"]
    assert on.startswith("klear_lib.sampler") and on == sampler.setting()
    monkeypatch.setenv(sampler.ENV, "off")
    notebook.start_run("x", str(tmp_path / "off"), {"x": 1})
    off = json.loads((tmp_path / "off" / runs.VERSIONS_FILE).read_text())["sampler"]
    assert off == "hf generate (KLEAR_SAMPLER=off)"
