"""Packed SFT batches (issue 46, ``SFTStageConfig.packed``, ``sft.pack_batch``): the same samples in the same batches
as TRL's padded batches, laid out in fewer rows, with the same numbers. Checked against the padded batch that TRL's
own collator makes for the same examples, through the tiny Qwen3 (sdpa attention) and SFTTrainer's own loss: each
sequence's logits and loss, the batch loss, its token count and its gradients; that no sequence attends to another
(with a control showing the test would see it); that a training run gives the model the same samples in the same
batches and order; and the padding share on the task's length distribution."""

from __future__ import annotations

import random

import pytest
import torch
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from klear_lib import models
from klear_lib.data import tasks
from klear_lib.train import sft


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny model, TRL's tokenized samples of levels 1-4 (39 to 83 tokens) and its collator and loss."""
    torch.manual_seed(0)
    train, _ = tasks.make_splits(0, 96, 4, [1, 2, 3, 4])
    tok = models.build_tokenizer(tasks.corpus(train), vocab_size=300)
    model = models.build_tiny_model(tok, seed=0)
    args = SFTConfig(output_dir=str(tmp_path_factory.mktemp("sft")), per_device_train_batch_size=16,
                     completion_only_loss=True, use_cpu=True, bf16=False, report_to="none", max_length=256,
                     disable_tqdm=True, gradient_checkpointing=False)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(sft.sft_samples(train, seed=0)),
                         processing_class=tok)
    trainer.current_gradient_accumulation_steps = 1
    model.train()  # no dropout in the tiny Qwen3: train mode is deterministic
    return trainer, model, tok


def padded_and_packed(trainer, indices):
    collate = trainer.data_collator
    padded = collate([trainer.train_dataset[i] for i in indices])
    return padded, sft.pack_batch(padded, collate.pad_token_id)


def placements(padded):
    """(row, start, length) of each padded row's sequence in the packed layout (``pack_rows``'s)."""
    lengths = padded["attention_mask"].sum(1).tolist()
    rows, _ = sft.pack_rows(lengths)
    where = {}
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            where[i] = (r, at, lengths[i])
            at += lengths[i]
    return [where[i] for i in range(len(lengths))]


def sequence_losses(logits, ids, labels):
    """Per sequence: the mean over its scored tokens of -log p(next token), from the logits (the padded rows)."""
    logp = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    scored = labels[:, 1:] != -100
    return (-(logp * scored).sum(1) / scored.sum(1)).tolist()


def test_layout_is_the_same_tokens_and_labels_in_fewer_rows(setup):
    trainer, _, tok = setup
    padded, packed = padded_and_packed(trainer, range(16))
    ids, labels, pos = packed["input_ids"], packed["labels"], packed["position_ids"]
    assert set(packed) == {"input_ids", "labels", "position_ids"}
    assert ids.shape[0] < 16 and ids.shape[1] <= 2 * padded["input_ids"].shape[1]
    seen = torch.zeros_like(ids, dtype=torch.bool)
    for i, (r, a, n) in enumerate(placements(padded)):
        assert torch.equal(ids[r, a:a + n], padded["input_ids"][i, :n])
        assert torch.equal(pos[r, a:a + n], torch.arange(n))
        assert labels[r, a] == -100 and torch.equal(labels[r, a + 1:a + n], padded["labels"][i, 1:n])
        seen[r, a:a + n] = True
    # everything else is padding: the pad token, label -100, positions from 0 (a sequence of its own)
    assert (ids[~seen] == tok.pad_token_id).all() and (labels[~seen] == -100).all()
    for r in range(ids.shape[0]):
        tail = (~seen[r]).nonzero().flatten()
        assert torch.equal(pos[r, tail], torch.arange(len(tail)))
        assert len(tail) == 0 or tail[0] == int(seen[r].sum())  # at the row's end
    # the counts Trainer and the fused LM head use: labels[..., 1:] not -100
    assert int((labels[:, 1:] != -100).sum()) == int((padded["labels"][:, 1:] != -100).sum()) > 0
    flash = type("M", (), {"config": type("C", (), {"_attn_implementation": "flash_attention_2"})()})()
    assert not sft.packs(flash, sft.SFTStageConfig(packed=True))  # left padded: its mask is not checked here
    with pytest.raises(ValueError, match="right-padded"):
        sft.pack_batch({**padded, "attention_mask": padded["attention_mask"].flip(1)}, tok.pad_token_id)
    with pytest.raises(ValueError, match="position_ids"):
        sft.pack_batch({**padded, "position_ids": padded["attention_mask"]}, tok.pad_token_id)


def test_first_fit_decreasing_and_the_row_width_by_hand():
    # longest first, each into the first row with room: 5 -> r0 (1 left), 4 -> r1 (2), 3 -> r2 (3), 2 -> r1 (0),
    # 1 -> r0 (0)
    assert sft.first_fit_decreasing([5, 3, 4, 2, 1], 6) == [[0, 4], [2, 3], [1]]
    assert sft.first_fit_decreasing([3, 3, 3], 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="does not fit"):
        sft.first_fit_decreasing([7], 6)
    # [5, 4, 3, 3]: capacity 5: four rows (20 positions); 6: [0] [1] [2, 3] (18); 7: 21; 8: [0, 2] [1, 3] (16);
    # 9 and 10: 18; 15: one row (15)
    assert sft.pack_rows([5, 4, 3, 3], widest=1.0) == ([[0], [1], [2], [3]], 5)
    assert sft.pack_rows([5, 4, 3, 3], widest=2.0) == ([[0, 2], [1, 3]], 8)
    assert sft.pack_rows([5, 4, 3, 3], widest=3.0) == ([[0, 1, 2, 3]], 15)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_each_sequence_gets_the_same_logits_and_loss_packed(setup, attention):
    """(a) On a batch of mixed lengths, each sequence's logits and loss from the packed rows equal those from its
    padded row (1e-5 relative; measured: ~1e-7), with either attention ``run_sft`` packs for (``sft.packs``)."""
    trainer, model, _ = setup
    padded, packed = padded_and_packed(trainer, range(16))
    assert len(set(padded["attention_mask"].sum(1).tolist())) >= 4  # mixed lengths
    model.set_attn_implementation(attention)
    try:
        assert model.config._attn_implementation == attention
        assert sft.packs(model, sft.SFTStageConfig()) and not sft.packs(model, sft.SFTStageConfig(use_unsloth=True))
        with torch.no_grad():
            logits_padded = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]).logits
            logits_packed = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits
    finally:
        model.set_attn_implementation("sdpa")
    width = padded["input_ids"].shape[1]
    rebuilt = torch.zeros_like(logits_padded)
    for i, (r, a, n) in enumerate(placements(padded)):
        rebuilt[i, :n] = logits_packed[r, a:a + n]
        torch.testing.assert_close(logits_packed[r, a:a + n], logits_padded[i, :n], rtol=1e-5, atol=1e-5)
    losses_padded = sequence_losses(logits_padded, padded["input_ids"], padded["labels"])
    losses_packed = sequence_losses(rebuilt[:, :width], padded["input_ids"], padded["labels"])
    assert losses_packed == pytest.approx(losses_padded, rel=1e-5)


def batch_loss_and_grads(trainer, model, batch):
    """SFTTrainer's training loss (fused LM head, sum over the batch's scored tokens / ``num_items_in_batch``, which
    Trainer counts over ``labels[..., 1:]``) and the gradients of every parameter."""
    model.zero_grad(set_to_none=True)
    n = (batch["labels"][..., 1:] != -100).sum()
    loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=n)
    loss.backward()
    return loss.item(), int(n), {k: p.grad.clone() for k, p in model.named_parameters()}


def test_batch_loss_and_gradients_are_the_padded_batchs(setup):
    """(b) The batch loss SFTTrainer trains on, its token count and the gradients of every parameter are the padded
    batch's to float rounding (measured: gradients within ~5e-7 of their largest entry); also where every token has
    a label, so that a packed sequence's first label would be scored after the previous sequence were it kept."""
    trainer, model, _ = setup
    for indices, every_token in ((range(16), False), (range(40, 64), False), (range(16, 32), True)):
        padded, packed = padded_and_packed(trainer, indices)
        if every_token:  # labels on every real token (no prompt masked), first ones included: scored nowhere
            padded["labels"] = padded["input_ids"].masked_fill(padded["attention_mask"] == 0, -100)
            packed = sft.pack_batch(padded, trainer.data_collator.pad_token_id)
        loss_a, n_a, grads_a = batch_loss_and_grads(trainer, model, padded)
        loss_b, n_b, grads_b = batch_loss_and_grads(trainer, model, packed)
        assert n_a == n_b
        assert loss_b == pytest.approx(loss_a, rel=1e-5)
        for name, g in grads_a.items():
            scale = float(g.abs().max())
            assert scale > 0, name
            assert float((grads_b[name] - g).abs().max()) <= 1e-5 * scale, name
    model.zero_grad(set_to_none=True)


def test_no_sequence_attends_to_another(setup):
    """(c) Changing every other sequence of a packed row changes none of a sequence's logits; the same change with
    the boundaries hidden (positions 0..width-1 over the row: one sequence) does, so the check can fail."""
    trainer, model, tok = setup
    padded, packed = padded_and_packed(trainer, range(16))
    where = placements(padded)
    row = max(range(packed["input_ids"].shape[0]), key=lambda r: sum(w[0] == r for w in where))
    members = sorted((a, n) for r, a, n in where if r == row)  # in row order
    assert len(members) >= 2
    ids, pos = packed["input_ids"][row:row + 1], packed["position_ids"][row:row + 1]
    plain = torch.arange(ids.shape[1])[None]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        base = model(input_ids=ids, position_ids=pos).logits
        base_plain = model(input_ids=ids, position_ids=plain).logits
        for k, (a, n) in enumerate(members):
            changed = ids.clone()
            for j, (b, m) in enumerate(members):
                if j != k:
                    changed[0, b:b + m] = torch.randint(3, len(tok), (m,), generator=g)
            torch.testing.assert_close(model(input_ids=changed, position_ids=pos).logits[0, a:a + n],
                                       base[0, a:a + n], rtol=1e-6, atol=1e-6)
            if k > 0:  # a sequence with one before it: without the boundaries it would see that one
                moved = model(input_ids=changed, position_ids=plain).logits[0, a:a + n] - base_plain[0, a:a + n]
                assert float(moved.abs().max()) > 1e-3


def forward_record(model, pad_token_id):
    """A hook on the backbone that records, per forward, the sorted token sequences of the batch it is given (the
    padded rows' real tokens, or the packed rows cut at each position 0, padding tails left out)."""
    seen = []

    def hook(_module, args, kwargs):
        ids = kwargs["input_ids"]
        if kwargs.get("attention_mask") is not None:
            seqs = [tuple(row[:n].tolist()) for row, n in zip(ids, kwargs["attention_mask"].sum(1).tolist())]
        else:
            pos, seqs = kwargs["position_ids"], []
            for r in range(ids.shape[0]):
                starts = (pos[r] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
                seqs += [tuple(ids[r, a:b].tolist()) for a, b in zip(starts[:-1], starts[1:])]
            seqs = [s for s in seqs if any(t != pad_token_id for t in s)]
        seen.append(sorted(seqs))

    return seen, model.model.register_forward_pre_hook(hook, with_kwargs=True)


def test_training_sees_the_same_batches_in_the_same_order_and_learns_the_same(tmp_path):
    """(d) Two epochs of ``run_sft``, packed and not, from the same start: every optimizer step's forward gets the
    same samples in both (so the same batches in the same order), each sample once an epoch; the final weights
    agree to float-noise growth; ``sft_tokens.json`` says which it was, its real tokens and what it padded."""
    train, _ = tasks.make_splits(1, 48, 4, [1, 2, 3, 4])
    tok = models.build_tokenizer(tasks.corpus(train), vocab_size=300)
    samples = sft.sft_samples(train, seed=0)
    start = models.build_tiny_model(tok, seed=0).state_dict()
    steps, weights, stats = {}, {}, {}
    for packed in (False, True):
        model = models.build_tiny_model(tok, seed=0)
        model.load_state_dict(start)
        steps[packed], handle = forward_record(model, tok.pad_token_id)
        stage = sft.SFTStageConfig(learning_rate=3e-3, epochs=2, batch_size=8, resume=False, packed=packed)
        trained = sft.run_sft(model, tok, samples, tmp_path / f"out_{packed}", stage)
        handle.remove()
        weights[packed] = {k: v.detach().clone() for k, v in trained.state_dict().items()}
        stats[packed] = sft.sft_token_stats(tmp_path / f"out_{packed}")
    assert len(steps[False]) == 12  # 48 samples, batch 8, 2 epochs
    assert steps[True] == steps[False]
    epoch1 = sorted(s for batch in steps[True][:6] for s in batch)
    epoch2 = sorted(s for batch in steps[True][6:] for s in batch)
    assert len(epoch1) == len(samples) and epoch1 == epoch2
    assert [stats[p]["samples"] for p in (False, True)] == [96, 96]
    assert stats[True]["tokens"] == stats[False]["tokens"]
    assert stats[True]["packed"] is True and stats[False]["packed"] is False
    assert stats[True]["padding_share"] < stats[False]["padding_share"]
    for k, w in weights[False].items():
        torch.testing.assert_close(weights[True][k], w, rtol=1e-3, atol=1e-4)
    with pytest.raises(TypeError, match="packed must be true or false"):
        sft.SFTStageConfig(packed="yes")


def test_padding_share_on_the_tasks_lengths(setup):
    """(e) On the task's SFT samples of levels 1-4 (400 problems, 39-83 tokens), random batches of 16 pad ~30% of
    their positions; packed, the default rows (up to twice the longest sequence) pad at most 6% (measured 5.7%, on
    03's 6,000 samples too) and rows up to three times at most 5% (measured 4.0%); rows only as wide as the longest
    sequence, still 21%: two of these sequences seldom fit beside each other in the longest's room."""
    train, _ = tasks.make_splits(0, 400, 4, [1, 2, 3, 4])
    tok = models.build_tokenizer(tasks.corpus(train), vocab_size=300)
    lengths = [len(tok.apply_chat_template(s["prompt"] + s["completion"])["input_ids"])
               for s in sft.sft_samples(train, seed=0)]
    assert min(lengths) < 45 and max(lengths) > 75
    order = list(range(len(lengths)))
    random.Random(0).shuffle(order)
    batches = [[lengths[i] for i in order[s:s + 16]] for s in range(0, len(order), 16)]
    real = sum(lengths)

    def share(widest):
        return 1 - real / sum(len(rows) * width for rows, width in (sft.pack_rows(b, widest) for b in batches))

    padded = 1 - real / sum(len(b) * max(b) for b in batches)
    assert padded > 0.25
    assert share(sft.PACK_WIDEST) <= 0.06 and share(3.0) <= 0.05 < share(1.0)
