"""KlearGRPOTrainer on a tiny model: what it hands the loss is what the rollout policy computed, its loss is
klear_lib.losses' loss, several updates per rollout make later ones off-policy, and it learns."""

import copy
import dataclasses
import functools
import re
import warnings

import pytest
import torch
from datasets import Dataset
from transformers import PrinterCallback
from trl import GRPOConfig

from klear_lib import models
from klear_lib.data import tasks
from klear_lib.losses import PolicyLossConfig, compute_policy_loss, positive_sample_loss
from klear_lib.recipe import KlearLossConfig
from klear_lib.rewards.result import RewardResult
from klear_lib.train.rl import (
    DataError,
    KlearGRPOTrainer,
    NoUpdatesError,
    klear_from_trl,
)
from klear_lib.train.rl_run import correctness_reward

TEMPERATURE = 0.9  # not 1, so that a missing temperature scaling would show


def make_trainer(tiny, tmp_path, *, klear, reward_funcs=None, steps=2, updates=2, lr=1e-3, max_len=12, seed=0,
                 schedule="linear", rollouts=None, per_device=8, generations=4, weight_decay=0.0, on_rollout=(),
                 **trl_args):
    """A trainer on the tiny task: ``per_device`` completions per optimizer step, at most ``updates`` steps per
    rollout, ``rollouts`` rollouts (default steps // updates)."""
    train, tok, spec = tiny
    model = models.build_tiny_model(tok, spec, seed=seed)
    ds = Dataset.from_list([{"prompt": tasks.prompt_messages(p), "answer": p.answer} for p in train])
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=per_device, steps_per_generation=updates,
        gradient_accumulation_steps=1, num_generations=generations, max_completion_length=max_len,
        temperature=TEMPERATURE, learning_rate=lr, max_steps=steps, beta=0.0, use_cpu=True, bf16=False,
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=seed,
        lr_scheduler_type=schedule, weight_decay=weight_decay, **trl_args,
    )
    trainer = KlearGRPOTrainer(model=model, reward_funcs=reward_funcs or [correctness_reward], args=args,
                               train_dataset=ds, processing_class=tok, klear=klear, rollouts=rollouts,
                               on_rollout=on_rollout)
    trainer.remove_callback(PrinterCallback)
    return trainer


def record_batches(trainer) -> list[dict]:
    """Every mini-batch the trainer computes a loss on, in order (a copy of its inputs)."""
    seen = []
    compute = trainer._compute_loss

    def spy(model, inputs):
        seen.append({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()})
        return compute(model, inputs)

    trainer._compute_loss = spy
    return seen


def naive_logps_entropy(model, inp, temperature):
    """Second implementation: full logits, temperature, log-softmax, gather; entropy of the softmax."""
    ids = torch.cat([inp["prompt_ids"], inp["completion_ids"]], 1)
    att = torch.cat([inp["prompt_mask"], inp["completion_mask"]], 1)
    T = inp["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=att).logits[:, -T - 1 : -1] / temperature  # (B, T, V)
    logp = torch.log_softmax(logits.float(), -1)
    tok_logp = logp.gather(-1, inp["completion_ids"].unsqueeze(-1)).squeeze(-1)  # (B, T)
    entropy = -(logp.exp() * logp).sum(-1)  # (B, T)
    return tok_logp, entropy


def test_rollout_entropies_and_logps_are_the_rollout_policys(tiny, tmp_path):
    trainer = make_trainer(tiny, tmp_path, klear=KlearLossConfig(loss_name="gppo", filter_groups=False), steps=2,
                           rollouts=1)
    batches = record_batches(trainer)
    before = copy.deepcopy(trainer.model)
    trainer.train()
    inp = batches[0]
    for key in ("old_per_token_logps", "old_entropy", "advantages", "klear_keep", "klear_positive"):
        assert key in inp, f"{key} missing from the rollout batch; keys: {sorted(inp)}"
    assert inp["old_entropy"].shape == inp["completion_ids"].shape
    with torch.no_grad():
        logp, ent = naive_logps_entropy(before, inp, TEMPERATURE)
    m = inp["completion_mask"].bool()
    assert torch.allclose(inp["old_entropy"][m], ent[m], atol=1e-4)
    assert torch.allclose(inp["old_per_token_logps"][m], logp[m], atol=1e-4)


def test_trainer_loss_is_the_library_loss(tiny, tmp_path):
    klear = KlearLossConfig(loss_name="gppo", policy_loss=PolicyLossConfig(erc_low=0.9, erc_high=1.1), sft_alpha=0.1,
                            filter_groups=False)
    trainer = make_trainer(tiny, tmp_path, klear=klear, steps=2, rollouts=1)
    batches = record_batches(trainer)
    trainer.train()
    assert len(batches) == 2
    inp = batches[1]  # the second mini-batch, after one update: off-policy
    model = trainer.model
    loss = trainer._compute_loss(model, inp) * trainer.current_gradient_accumulation_steps
    logp, ent = naive_logps_entropy(model, inp, TEMPERATURE)
    mask = inp["completion_mask"] * inp["klear_keep"].unsqueeze(1)
    expected, _ = compute_policy_loss("gppo", old_log_prob=inp["old_per_token_logps"], log_prob=logp,
                                      advantages=inp["advantages"], response_mask=mask, config=klear.policy_loss,
                                      entropy=ent, old_entropy=inp["old_entropy"])
    expected = expected + 0.1 * positive_sample_loss(logp, mask, inp["klear_positive"])
    assert torch.allclose(loss, expected, atol=1e-5), (loss.item(), expected.item())


def test_later_updates_of_a_rollout_are_off_policy(tiny, tmp_path):
    klear = KlearLossConfig(loss_name="gppo", policy_loss=PolicyLossConfig(erc_low=0.999, erc_high=1.001),
                            filter_groups=False)
    def length_mod_3(completions, **kw):
        return [float(len(c[-1]["content"]) % 3) for c in completions]

    trainer = make_trainer(tiny, tmp_path, klear=klear, steps=2, updates=2, lr=1e-2, reward_funcs=[length_mod_3])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "actor/ratio_max" in h]
    assert len(logs) == 2
    first, second = logs
    assert first["actor/ratio_max"] == pytest.approx(1.0, abs=1e-5)  # first update: the rollout policy itself
    assert first["actor/erc_frac_low"] + first["actor/erc_frac_high"] == 0
    assert abs(second["actor/ratio_max"] - 1.0) > 1e-4  # after one update the ratio moved
    assert second["actor/erc_frac_low"] + second["actor/erc_frac_high"] > 0


def test_a_rollout_that_keeps_no_group_makes_no_optimizer_step(tiny, tmp_path):
    """Every completion gets the same reward, so every group is filtered: with weight decay > 0, neither the
    parameters nor the optimizer state may change (no AdamW step on a mini-batch without a response token)."""
    records = []
    klear = KlearLossConfig(loss_name="ppo_clip", sft_alpha=0.0)
    trainer = make_trainer(tiny, tmp_path, klear=klear, steps=4, rollouts=2, weight_decay=0.1, lr=1e-2,
                           reward_funcs=[lambda completions, **kw: [1.0] * len(completions)],
                           on_rollout=(lambda tr, rec: records.append(rec),))
    params_before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(NoUpdatesError, match=r"made 0 of 4 planned optimizer steps: filter_rule='klear' kept 0 of 16 "):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(params_before, trainer.model.parameters()))
    assert trainer.optimizer is None or not trainer.optimizer.state
    assert [r["rollout"] for r in records] == [0, 1, 2]
    assert [r.get("klear/kept_groups") for r in records[1:]] == [0, 0]
    assert [r.get("klear/updates_this_rollout") for r in records[1:]] == [0, 0]
    assert records[-1]["final"] and not records[1]["final"]


def test_no_updates_names_the_judges_reasons_and_the_format_rule(tiny, tmp_path):
    """A think-less model under the released format rule: every response is a format failure (−0.5), every group is
    filtered, and the error says so: the judge's reasons, the rule, and that the chat template has no think format."""
    def judge(completions, **kw):
        judge.last_results = [RewardResult(-0.5, "no_think_close") for _ in completions]
        return [-0.5] * len(completions)

    judge.format_rule = "released"
    trainer = make_trainer(tiny, tmp_path, klear=KlearLossConfig(loss_name="gppo"), steps=4, rollouts=2,
                           reward_funcs=[judge])
    with pytest.raises(NoUpdatesError) as err:
        trainer.train()
    text = str(err.value)
    seen = re.search(r"The judge's reasons for the (\d+) responses it saw: (\d+) no_think_close;", text)
    assert seen and seen[1] == seen[2] and int(seen[1]) > 0, text
    assert f"{seen[1]} of {seen[1]} have no <think>...</think> format, and the format rule is 'released'" in text
    assert "this model's chat template has no think format. Fix: set format_rule: none" in text


def _scripted_reward(informative: set, log: list, generations: int):
    """A reward that makes exactly the prompts whose answer is in ``informative`` informative (one completion of
    each such group right, the others wrong) and every other group uninformative (all right); ``log`` gets
    (question, informative) for each group, in the order the rollout drew them."""
    def reward(completions, prompts, answer, **kw):
        out = []
        for i, (p, a) in enumerate(zip(prompts, answer)):
            first = i % generations == 0
            if first:
                log.append((p[-1]["content"], a in informative))
            out.append((1.0 if first else 0.0) if a in informative else 1.0)
        return out
    return reward


def _questions(trainer, batch) -> list[str]:
    texts = trainer.processing_class.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    return [t.split("user\n", 1)[1].split("\n", 1)[0] for t in texts]


def test_dynamic_sampling_trains_on_the_kept_groups_only_in_full_mini_batches(tiny, tmp_path):
    """Oversampled prompts, the filter, the cap at the target and the packing: every optimizer step but the last of
    a rollout holds exactly mini_batch_prompts whole kept groups; nothing from a dropped group is trained on."""
    G, drawn, records = 4, [], []
    klear = KlearLossConfig(loss_name="gppo", sft_alpha=0.0, oversample_factor=2.0)
    # 1 prompt (4 completions) per step, at most 3 steps per rollout: target 3 prompts, 6 generated
    trainer = make_trainer(tiny, tmp_path, klear=klear, steps=9, updates=3, rollouts=3, per_device=G,
                           generations=G, reward_funcs=[_scripted_reward({0, 2, 4, 6, 8}, drawn, G)],
                           on_rollout=(lambda tr, rec: records.append(rec),))
    batches = record_batches(trainer)
    trainer.train()
    assert trainer.gen_prompts == 6 and trainer.target_prompts == 3
    rollouts = [drawn[i:i + 6] for i in range(0, len(drawn), 6)]
    assert len(rollouts) == 3
    trained = [_questions(trainer, b) for b in batches]
    expected_steps = []
    for groups in rollouts:
        kept = [q for q, informative in groups if informative][:3]
        expected_steps += [[q] * G for q in kept]
    assert trained == expected_steps  # whole groups, in draw order, capped at the target, no dropped sibling
    for rec, groups in zip(records[1:], rollouts):
        n_kept = min(3, sum(i for _, i in groups))
        assert rec["klear/generated_groups"] == 6 and rec["klear/kept_groups"] == n_kept
        assert rec["klear/updates_this_rollout"] == n_kept
    steps = [h for h in trainer.state.log_history if "klear/informative_completions" in h]
    assert len(steps) == len(batches) == trainer.state.global_step
    assert all(h["klear/informative_completions"] == G for h in steps)


def test_a_short_rollout_packs_its_last_mini_batch_short(tiny, tmp_path):
    """2 prompts per step, target 4 prompts: a rollout that keeps 3 groups makes one full step and one of 1 group."""
    G, drawn = 4, []
    klear = KlearLossConfig(loss_name="ppo_clip", sft_alpha=0.0, oversample_factor=1.0)
    trainer = make_trainer(tiny, tmp_path, klear=klear, steps=2, updates=2, rollouts=1, per_device=2 * G,
                           generations=G, reward_funcs=[_scripted_reward({0, 1, 2, 3, 4}, drawn, G)])
    batches = record_batches(trainer)
    trainer.train()
    kept = [q for q, informative in drawn if informative]
    assert len(drawn) == 4
    sizes = [b["klear_informative"] for b in batches]
    assert sizes == [min(2, len(kept)) * G, (len(kept) - 2) * G][: (len(kept) + 1) // 2], (kept, sizes)
    assert all(b["completion_ids"].shape[0] == b["klear_informative"] for b in batches)


def test_more_generation_batches_until_the_target_is_kept(tiny, tmp_path):
    """max_gen_batches > 1: a rollout draws again while it has kept fewer groups than the target, packs groups of
    both generation batches (padded to one length) and never more than the target."""
    G, drawn, records = 4, [], []
    klear = KlearLossConfig(loss_name="gppo", sft_alpha=0.0, oversample_factor=1.0, max_gen_batches=5)
    trainer = make_trainer(tiny, tmp_path, klear=klear, steps=4, updates=4, rollouts=1, per_device=G,
                           generations=G, reward_funcs=[_scripted_reward({1, 3, 5}, drawn, G)],
                           on_rollout=(lambda tr, rec: records.append(rec),))
    batches = record_batches(trainer)
    trainer.train()
    n_batches = records[-1]["klear/gen_batches"]
    informative = [i for _, i in drawn]
    assert len(drawn) == 4 * n_batches
    assert sum(informative[:4 * (n_batches - 1)]) < 4 <= sum(informative) or n_batches == 5
    kept = [q for q, i in drawn if i][:4]
    assert [_questions(trainer, b)[0] for b in batches] == kept
    for b in batches:
        assert b["completion_mask"].shape == b["completion_ids"].shape


@pytest.mark.parametrize("loss_name", ["gppo", "ppo_clip"])
def test_rl_learns_a_simple_preference(tiny, tmp_path, loss_name):
    """Reward: the share of digit characters in the completion. A random tiny model writes few; after a
    few rollouts with several updates each, it writes clearly more."""
    def digit_share(completions, **kw):
        texts = [c[-1]["content"] for c in completions]
        return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]

    klear = KlearLossConfig(loss_name=loss_name, filter_groups=False, sft_alpha=0.0)
    records = []
    trainer = make_trainer(tiny, tmp_path, klear=klear, steps=24, updates=2, lr=1e-2, max_len=6,
                           reward_funcs=[digit_share], schedule="constant",
                           on_rollout=(lambda tr, rec: records.append(rec),))
    trainer.train()
    rewards = [r["reward"] for r in records if "reward" in r]
    assert len(rewards) == 12
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.15, rewards


def test_klear_logprob_backend_equals_trls_fused_head(tiny, tmp_path):
    """klear_lib.logprobs on the backbone's hidden states and TRL's fused LM head: same log-probs and entropies
    (1e-5) and the same parameter gradients (1e-4), padding included."""
    from trl import GRPOTrainer

    from klear_lib.train.token_stats import klear_token_stats

    trainer = make_trainer(tiny, tmp_path, klear=KlearLossConfig(loss_name="gppo"), steps=2)
    model = trainer.model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (5, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding of a prompt
    mask[1, -4:] = 0  # a completion that ended early
    keep = 8

    def run(fn):
        model.zero_grad()
        logps, ent, _ = fn()
        m = mask[:, -keep:].float()
        ((logps * m).sum() + 0.5 * (ent * m).sum()).backward()
        return logps.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    trl_out = run(lambda: GRPOTrainer._get_per_token_logps_and_entropies(
        trainer, model, ids, mask, keep, compute_entropy=True))
    ours = run(lambda: klear_token_stats(model, ids, mask, keep, temperature=trainer.temperature, batch_size=2))
    m = mask[:, -keep:].bool()
    assert torch.allclose(ours[0][m], trl_out[0][m], atol=1e-5)
    assert torch.allclose(ours[1][m], trl_out[1][m], atol=1e-5)
    assert (ours[0][~m] == 0).all() and (ours[1][~m] == 0).all()
    for name, grad in trl_out[2].items():
        assert torch.allclose(ours[2][name], grad, atol=1e-4), name
    assert trainer.klear.logprob_backend == "klear"


def test_klear_backend_refuses_scaled_logits(tiny, tmp_path):
    from klear_lib.train.token_stats import klear_token_stats

    trainer = make_trainer(tiny, tmp_path, klear=KlearLossConfig(loss_name="gppo"), steps=2)
    trainer.model.config.final_logit_softcapping = 30.0
    ids = torch.randint(3, 50, (2, 6))
    with pytest.raises(ValueError, match="final_logit_softcapping.*logprob_backend='trl'"):
        klear_token_stats(trainer.model, ids, torch.ones_like(ids), 3)
    with pytest.raises(ValueError, match="logprob_backend"):
        KlearLossConfig(logprob_backend="naive")


def test_klear_backend_calls_the_wrapped_model_peft_lora_included(tiny):
    """A PEFT LoRA model (what ``model`` is under TRL's peft_config) goes through its own forward: values equal the
    full-logits computation and the adapters get its gradients (before, the inner CausalLM was called as the
    backbone: AttributeError)."""
    from peft import LoraConfig, get_peft_model

    from klear_lib.train.token_stats import klear_token_stats

    train, tok, spec = tiny
    torch.manual_seed(0)
    model = get_peft_model(models.build_tiny_model(tok, spec, seed=0),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # non-zero B: the adapters change the output
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    ids = torch.randint(3, len(tok), (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    keep = 6
    inp = {"prompt_ids": ids[:, :-keep], "prompt_mask": mask[:, :-keep], "completion_ids": ids[:, -keep:],
           "completion_mask": mask[:, -keep:]}

    def grads(logps, ent):
        model.zero_grad()
        (logps.sum() + 0.5 * ent.sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    lp, ent, _ = klear_token_stats(model, ids, mask, keep, temperature=TEMPERATURE)
    ours = grads(lp, ent)
    ref_lp, ref_ent = naive_logps_entropy(model, inp, TEMPERATURE)
    m = mask[:, -keep:].bool()
    assert torch.allclose(lp[m], ref_lp[m], atol=1e-5) and torch.allclose(ent[m], ref_ent[m], atol=1e-5)
    ref = grads(torch.where(m, ref_lp, 0.0), torch.where(m, ref_ent, 0.0))
    assert set(ours) == set(ref) and any("lora_A" in n for n in ours)
    for name, g in ref.items():
        assert torch.allclose(ours[name], g, atol=1e-5), name


def test_klear_backend_refuses_a_forward_that_bypasses_the_head_module(tiny):
    """A forward that computes logits from the head's weight without calling the head module, or one that changes
    what the head returned (as a patched forward might), is refused: its output is never read as log-probs."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from klear_lib.train.token_stats import klear_token_stats

    _, tok, spec = tiny
    model = models.build_tiny_model(tok, spec, seed=0)

    def forward(input_ids=None, attention_mask=None, **kw):
        hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return CausalLMOutputWithPast(logits=torch.nn.functional.linear(hidden, model.lm_head.weight))

    model.forward = forward
    ids = torch.randint(3, 50, (2, 6))
    with pytest.raises(RuntimeError, match="called its LM head module 0 time.*logprob_backend='trl'"):
        klear_token_stats(model, ids, torch.ones_like(ids), 3)

    def rounding_forward(input_ids=None, attention_mask=None, **kw):  # calls the head, casts what it returns
        hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return CausalLMOutputWithPast(logits=model.lm_head(hidden).to(torch.bfloat16).float())

    model.forward = rounding_forward
    with pytest.raises(RuntimeError, match="called its LM head module 1 time.*unchanged"):
        klear_token_stats(model, ids, torch.ones_like(ids), 3)


def test_random_stop_control_keeps_the_value_and_drops_the_drawn_tokens_gradient(tiny, tmp_path):
    """The ERC control: the loss value is the plain loss's; the gradient is the loss's with the drawn tokens'
    log-probs detached (the draws replayed from the trainer's own seeded generator)."""
    klear = KlearLossConfig(loss_name="ppo_clip", filter_groups=False, sft_alpha=0.0, random_stop_frac=0.5)
    trainer = make_trainer(tiny, tmp_path, klear=klear, steps=2, rollouts=1)
    batches = record_batches(trainer)
    trainer.train()
    inp = batches[1]
    model = trainer.model
    trainer._random_stop = torch.Generator().manual_seed(7)
    model.zero_grad()
    loss = trainer._compute_loss(model, inp)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    mask = inp["completion_mask"] * inp["klear_keep"].unsqueeze(1)
    stopped = (torch.rand(mask.shape, generator=torch.Generator().manual_seed(7)) < 0.5) & mask.bool()
    assert 0.3 < stopped.sum() / mask.sum() < 0.7
    model.zero_grad()
    logp, ent = naive_logps_entropy(model, inp, TEMPERATURE)
    plain, _ = compute_policy_loss("ppo_clip", old_log_prob=inp["old_per_token_logps"], log_prob=logp,
                                   advantages=inp["advantages"], response_mask=mask)
    masked, _ = compute_policy_loss("ppo_clip", old_log_prob=inp["old_per_token_logps"],
                                    log_prob=torch.where(stopped, logp.detach(), logp),
                                    advantages=inp["advantages"], response_mask=mask)
    assert torch.allclose(loss, plain, atol=1e-5)  # the value is untouched
    masked.backward()
    for name, p in model.named_parameters():
        assert torch.allclose(got[name], p.grad, atol=1e-5), name
    steps = [h for h in trainer.state.log_history if "actor/random_stop_frac" in h]
    assert steps and all(0.2 < h["actor/random_stop_frac"] < 0.8 for h in steps)


def test_fork_token_mask_marks_the_result_digit_of_fork_steps(tiny):
    _, tok, _ = tiny
    facts = tasks.parse_fork_facts("2+3->6")
    text = "<think>\n1 + 1 = 2\n2 + 3 = 6\n6 + 1 = 7\n</think>\n\\boxed{7}"
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"] + [tok.pad_token_id] * 3])
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    fm = tasks.fork_token_mask(tok, ids, mask, facts)
    marked = [tok.decode([i]) for i in ids[0][fm[0]].tolist()]
    assert marked == ["6"]
    # the marked token is the one right after "2 + 3 = "
    pos = int(fm[0].nonzero()[0])
    assert tok.decode(ids[0, :pos].tolist()).endswith("2 + 3 = ")
    assert not tasks.fork_token_mask(tok, ids, mask, ()).any()


def test_random_stop_by_class_stops_only_the_named_classes_at_their_rates(tiny, tmp_path, monkeypatch):
    """The ERC control matched per token class: tokens of the low-entropy bucket are stopped with probability 0.9,
    every other token never; the gradient is the loss's with exactly those log-probs detached (the draws replayed
    from the trainer's seeded generator). An untrained model's entropies are all high, so the replay moves the
    bucket bounds to the batch's median old entropy."""
    from klear_lib.train import rl as rl_module

    klear = KlearLossConfig(loss_name="ppo_clip", filter_groups=False, sft_alpha=0.0,
                            random_stop_classes="low/rest:0.9, mid/rest:0")
    trainer = make_trainer(tiny, tmp_path, klear=klear, steps=2, rollouts=1)
    batches = record_batches(trainer)
    trainer.train()
    inp = batches[1]
    model = trainer.model
    mask = (inp["completion_mask"] * inp["klear_keep"].unsqueeze(1)).bool()
    median = float(inp["old_entropy"][mask].median())
    monkeypatch.setattr(rl_module, "ENTROPY_BUCKETS", (("low", 0.0, median), ("mid", median, 1e9),
                                                       ("high", 1e9, float("inf"))))
    trainer._random_stop = torch.Generator().manual_seed(3)
    model.zero_grad()
    trainer._compute_loss(model, inp).backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    low = mask & (inp["old_entropy"] < median)
    draw = torch.rand(mask.shape, generator=torch.Generator().manual_seed(3))
    stopped = low & (draw < 0.9)
    assert low.any() and (mask & ~low).any()  # both kinds of token are in the batch
    model.zero_grad()
    logp, _ = naive_logps_entropy(model, inp, TEMPERATURE)
    masked, _ = compute_policy_loss("ppo_clip", old_log_prob=inp["old_per_token_logps"],
                                    log_prob=torch.where(stopped, logp.detach(), logp),
                                    advantages=inp["advantages"], response_mask=mask.float())
    masked.backward()
    for name, p in model.named_parameters():
        assert torch.allclose(got[name], p.grad, atol=1e-5), name


@pytest.mark.parametrize("table, message", [
    ("low/fork", "CLASS:P"), ("tiny/rest:0.1", "CLASS one of"), ("low/rest:1.5", r"P in \[0, 1\]"),
    ("low/rest:-0.1", r"P in \[0, 1\]"),
    ("low/rest:x", "CLASS:P"),
])
def test_random_stop_classes_are_checked(table, message):
    with pytest.raises(ValueError, match=message):
        KlearLossConfig(random_stop_classes=table)
    with pytest.raises(ValueError, match="one control at a time"):
        KlearLossConfig(random_stop_classes="low/rest:0.1", random_stop_frac=0.1)
    assert KlearLossConfig(random_stop_classes="low/rest:0.1,high/fork:0.5").stop_classes() == {
        "low/rest": 0.1, "high/fork": 0.5}
    # a class where ERC stopped every token (04 at tiny: a seed's low-entropy fork tokens) is matched by P = 1, which
    # stops all of them (the trainer stops a token when its draw in [0, 1) is below P)
    assert KlearLossConfig(random_stop_classes="low/fork:1.000000").stop_classes() == {"low/fork": 1.0}


def _count_evaluation(seen, model):
    seen.append(1)
    return {"avg_at_n": 0.5, "n": 1}


def test_rollout_recorder_evaluates_at_its_boundaries_and_skips_the_start_when_told(tmp_path):
    """Evaluations at rollouts 0, 2, 4 and the last (5) every 2 rollouts; without eval_start, not at 0; without
    eval_final, not at the last; with neither and eval_every past the last rollout, none (06's default); the probe
    at every boundary every way."""
    import types

    from klear_lib import runs
    from klear_lib.train.rl_run import RolloutRecorder

    handler = types.SimpleNamespace(on_log=lambda *a, **k: None)
    trainer = types.SimpleNamespace(model=None, control=types.SimpleNamespace(should_log=False),
                                    callback_handler=handler, args=None, state=None)
    for start, final, every, expected in ((True, True, 2, [0, 2, 4, 5]), (False, True, 2, [2, 4, 5]),
                                          (False, False, 2, [2, 4]), (False, False, 6, [])):  # 06: no evaluation
        evaluated = []
        with runs.MetricsWriter(tmp_path / f"m{start}{final}{every}.jsonl") as w:
            rec = RolloutRecorder(w, {}, evaluate=functools.partial(_count_evaluation, evaluated),
                                  eval_every=every, probe=lambda m: {"p": 1.0}, progress=lambda *_: None,
                                  eval_start=start, eval_final=final)
            for r in range(6):
                rec(trainer, {"rollout": r, "step": r, "final": r == 5})
        records = runs.read_metrics(tmp_path / f"m{start}{final}{every}.jsonl")
        assert [r["rollout"] for r in records if "eval/avg_at_n" in r] == expected
        assert len(evaluated) == len(expected) and all(r["klear/p"] == 1.0 for r in records)


# -- a trainer that never trains silently wrong ------------------------------------------------------------------
def share_of_a(completions, **kw) -> list[float]:
    """A continuous reward in [0, 1]: the share of the letter 'a' in the completion."""
    texts = [c[-1]["content"] for c in completions]
    return [t.count("a") / max(len(t), 1) for t in texts]


def test_a_continuous_reward_under_the_klear_filter_raises_after_zero_steps_and_dapo_trains(tiny, tmp_path):
    """The default filter (Klear's fully-correct indicator) on a continuous reward: no response is ever exactly 1.0,
    so every group is filtered. Before: train() returned after 0 of 4 steps without a word. Now it raises, naming
    the rule, the share kept and the fix, and the fix (filter_rule='dapo') makes every planned step."""
    trainer = make_trainer(tiny, tmp_path / "klear", klear=KlearLossConfig(), reward_funcs=[share_of_a], steps=4,
                           rollouts=2, lr=1e-2)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(NoUpdatesError) as err:
        trainer.train()
    msg = str(err.value)
    # 2 rollouts × 8 prompts generated (2× the target of 4: two steps of 2 prompts)
    assert msg.startswith("KlearGRPOTrainer made 0 of 4 planned optimizer steps: filter_rule='klear' kept 0 of 16 "
                          "generated groups (0.0%); it keeps a group only when some but not all of its responses "
                          "reach KlearLossConfig.max_reward=1.0 (fully correct)"), msg
    assert "set filter_rule='dapo'" in msg and msg.endswith("the model is unchanged")
    best = float(re.search(r"the highest reward seen was ([0-9.e-]+)\. Fix", msg).group(1))
    assert 0 < best < 1.0  # the rewards it saw, none fully correct
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))

    warned = make_trainer(tiny, tmp_path / "warn", klear=KlearLossConfig(), reward_funcs=[share_of_a], steps=4,
                          rollouts=2, lr=1e-2)
    warned.on_no_updates = "warn"  # run_rl's choice: the same message as a warning, the run's records intact
    with pytest.warns(UserWarning, match=re.escape(msg.removesuffix("; the model is unchanged"))):
        warned.train()
    assert warned.state.global_step == 0

    fixed = make_trainer(tiny, tmp_path / "dapo", klear=KlearLossConfig(filter_rule="dapo"),
                         reward_funcs=[share_of_a], steps=4, rollouts=2, lr=1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every planned step made: no warning
        fixed.train()
    assert fixed.state.global_step == 4
    assert not all(torch.equal(a, b) for a, b in zip(before, fixed.model.parameters()))


def test_fewer_steps_than_planned_warn_with_the_share_kept(tiny, tmp_path):
    """2 prompts per step, target 4, 4 generated; the seeded draw holds one informative group (answers 0 and 1):
    one step of the 2 planned, and the run warns with the counts and the fix."""
    G, drawn = 4, []
    trainer = make_trainer(tiny, tmp_path, klear=KlearLossConfig(loss_name="ppo_clip", sft_alpha=0.0,
                                                                 oversample_factor=1.0),
                           steps=2, updates=2, rollouts=1, per_device=2 * G, generations=G,
                           reward_funcs=[_scripted_reward({0, 1}, drawn, G)])
    with pytest.warns(UserWarning) as caught:
        trainer.train()
    assert [i for _, i in drawn] == [False, False, True, False] and trainer.state.global_step == 1
    msgs = [str(w.message) for w in caught if "planned optimizer steps" in str(w.message)]
    assert msgs == ["KlearGRPOTrainer made 1 of 2 planned optimizer steps: filter_rule='klear' kept 1 of 4 generated "
                    "groups (25.0%); it keeps a group only when some but not all of its responses reach "
                    "KlearLossConfig.max_reward=1.0 (fully correct), and the highest reward seen was 1. Fix: with a "
                    "continuous or differently scaled reward set filter_rule='dapo' (keep groups whose rewards vary) "
                    "or KlearLossConfig.max_reward to what a fully correct response scores; otherwise raise "
                    "oversample_factor or max_gen_batches, or set filter_groups=False"]


def test_a_reward_that_cannot_be_fully_correct_is_refused_before_training(tiny, tmp_path):
    def half(completions, **kw):
        return [0.5 * s for s in share_of_a(completions)]

    half.reward_range = (0.0, 0.5)
    with pytest.raises(ValueError, match=r"declared ranges give totals in \[0.0, 0.5\]: every group would be "
                                         r"filtered and no step made\. Set KlearLossConfig.max_reward"):
        make_trainer(tiny, tmp_path, klear=KlearLossConfig(), reward_funcs=[half], steps=2, rollouts=1)
    # the same reward where it can be met: max_reward at its top, or a filter that does not need it
    make_trainer(tiny, tmp_path, klear=KlearLossConfig(max_reward=0.5), reward_funcs=[half], steps=2, rollouts=1)
    make_trainer(tiny, tmp_path, klear=KlearLossConfig(filter_rule="dapo"), reward_funcs=[half], steps=2, rollouts=1)
    assert correctness_reward.reward_range == (0.0, 1.0)  # the tiny task's reward declares its range


def test_trls_loss_settings_are_honoured_cispo_and_the_clip_range(tiny, tmp_path):
    """GRPOConfig(loss_type='cispo', epsilon=0.05, epsilon_high=5.0) without klear=: before, GPPO at 0.2/0.28 ran;
    now klear's cispo with that clip range, and the trainer's loss is that loss."""
    trainer = make_trainer(tiny, tmp_path, klear=None, steps=2, rollouts=1, loss_type="cispo", epsilon=0.05,
                           epsilon_high=5.0, reward_funcs=[share_of_a])
    k = trainer.klear
    assert (k.loss_name, k.loss_agg_mode) == ("cispo", "token-mean")
    assert (k.policy_loss.clip_ratio_low, k.policy_loss.clip_ratio_high) == (0.05, 5.0)
    trainer.klear = dataclasses.replace(k, filter_rule="dapo", sft_alpha=0.0)
    batches = record_batches(trainer)
    trainer.train()
    inp = batches[1]  # after one update: off-policy, where the clip range acts
    loss = trainer._compute_loss(trainer.model, inp) * trainer.current_gradient_accumulation_steps
    logp, ent = naive_logps_entropy(trainer.model, inp, TEMPERATURE)
    mask = inp["completion_mask"] * inp["klear_keep"].unsqueeze(1)
    want, _ = compute_policy_loss("cispo", old_log_prob=inp["old_per_token_logps"], log_prob=logp,
                                  advantages=inp["advantages"], response_mask=mask,
                                  config=PolicyLossConfig(clip_ratio_low=0.05, clip_ratio_high=5.0))
    assert torch.allclose(loss, want, atol=1e-5), (loss.item(), want.item())


def _args(tmp_path, **kw) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)


def test_trls_settings_map_onto_the_klear_config(tmp_path):
    assert klear_from_trl(_args(tmp_path), None) == KlearLossConfig()  # TRL's defaults: klear's defaults (GPPO)
    k = klear_from_trl(_args(tmp_path, epsilon=0.1), None)  # TRL: epsilon_high defaults to epsilon
    assert (k.loss_name, k.policy_loss.clip_ratio_low, k.policy_loss.clip_ratio_high) == ("gppo", 0.1, 0.1)
    k = klear_from_trl(_args(tmp_path, loss_type="grpo", importance_sampling_level="sequence"), None)
    assert (k.loss_name, k.loss_agg_mode) == ("gspo", "seq-mean-token-mean")
    k = klear_from_trl(_args(tmp_path, loss_type="dr_grpo", max_completion_length=64), None)
    assert (k.loss_name, k.loss_agg_mode, k.policy_loss.loss_scale_factor) == ("ppo_clip", "seq-mean-token-sum-norm",
                                                                               64.0)
    # with klear=: agreement passes, disagreement names the klear field
    mine = KlearLossConfig(loss_name="cispo", policy_loss=PolicyLossConfig(clip_ratio_low=0.05, clip_ratio_high=5.0))
    assert klear_from_trl(_args(tmp_path, loss_type="cispo", epsilon=0.05, epsilon_high=5.0), mine) is mine


@pytest.mark.parametrize("trl_args, klear, message", [
    (dict(loss_type="cispo"), KlearLossConfig(),
     "GRPOConfig.loss_type='cispo' asks for KlearLossConfig.loss_name='cispo', but the klear= config given has "
     "'gppo': set KlearLossConfig.loss_name, and leave GRPOConfig.loss_type at TRL's default (or drop klear= to "
     "take TRL's settings)"),
    (dict(epsilon=0.05), KlearLossConfig(),
     "GRPOConfig.epsilon=0.05 asks for KlearLossConfig.policy_loss.clip_ratio_low=0.05, but the klear= config given "
     "has 0.2: set KlearLossConfig.policy_loss.clip_ratio_low"),
    (dict(epsilon_high=5.0), KlearLossConfig(), "GRPOConfig.epsilon_high=5.0 asks for "
                                                "KlearLossConfig.policy_loss.clip_ratio_high=5.0, but"),
    (dict(importance_sampling_level="sequence"), KlearLossConfig(),
     "GRPOConfig.importance_sampling_level='sequence' asks for KlearLossConfig.loss_name='gspo'"),
    (dict(beta=0.04), None, "GRPOConfig.beta=0.04: Klear's recipe has no KL term and KlearLossConfig none to set; "
                            "set GRPOConfig.beta=0.0"),
    (dict(loss_type="sapo"), None, "GRPOConfig.loss_type='sapo' has no counterpart in klear's registry: set "
                                   "KlearLossConfig.loss_name"),
    (dict(scale_rewards="none"), None, "GRPOConfig.scale_rewards='none' is not read by KlearGRPOTrainer: klear "
                                       "normalises advantages per group itself: KlearLossConfig.adv_std"),
])
def test_trls_settings_klear_cannot_honour_are_refused_naming_the_klear_field(tmp_path, trl_args, klear, message):
    with pytest.raises(ValueError) as err:
        klear_from_trl(_args(tmp_path, **trl_args), klear)
    assert str(err.value).startswith(message), str(err.value)


def test_an_epoch_based_config_says_what_to_set_and_rollouts_alone_suffice(tiny, tmp_path):
    """TRL's defaults count epochs (max_steps=-1): before, `rollouts must be >= 1, got -1`."""
    train, tok, spec = tiny
    ds = Dataset.from_list([{"prompt": tasks.prompt_messages(p), "answer": p.answer} for p in train[:8]])
    args = _args(tmp_path, per_device_train_batch_size=8, num_generations=4, max_completion_length=8, bf16=False,
                 disable_tqdm=True)
    model = models.build_tiny_model(tok, spec)
    with pytest.raises(ValueError) as err:
        KlearGRPOTrainer(model=model, reward_funcs=[share_of_a], args=args, train_dataset=ds, processing_class=tok)
    assert str(err.value) == ("KlearGRPOTrainer counts rollouts, not epochs (GRPOConfig.max_steps=-1, "
                              "num_train_epochs=3.0 is not read): pass rollouts=N to KlearGRPOTrainer (each rollout "
                              "makes at most steps_per_generation=1 optimizer steps), or set GRPOConfig.max_steps to "
                              "a multiple of steps_per_generation")
    trainer = KlearGRPOTrainer(model=model, reward_funcs=[share_of_a], args=args, train_dataset=ds,
                               processing_class=tok, klear=KlearLossConfig(filter_rule="dapo"), rollouts=3)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    assert trainer.args.max_steps == 3 and trainer.state.global_step == 3 and trainer.rollouts_done == 3


def test_a_reward_that_reports_a_data_error_fails_the_batch_before_any_step(tiny, tmp_path):
    """A reward function whose last results carry reason 'data_error' (a malformed dataset row) stops training on
    the first batch that has one, naming the reward and the detail; the weights never move."""
    def judged(completions, **kw):
        judged.last_results = [RewardResult(0.0, "wrong")] * (len(completions) - 1) + [
            RewardResult(0.0, "data_error", detail="row 7: test 2 has no 'output'")]
        return [0.0] * (len(completions) - 1) + [1.0]

    trainer = make_trainer(tiny, tmp_path, klear=KlearLossConfig(filter_rule="dapo"), reward_funcs=[judged], steps=2,
                           rollouts=1)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(DataError, match=re.escape("reward 'judged': 1 of 32 responses of this batch were judged "
                                                  "against malformed data (row 7: test 2 has no 'output'); the "
                                                  "batch is not trained on")):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
