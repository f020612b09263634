"""The rollout's old-log-prob pass runs over the kept groups' rows only (issue 34, item 6): a profile put the pass
over every generated row at 16% of one RL unit of notebook 03, while dynamic sampling trains on the groups that
pass the filter (and the cap) only. The kept rows' old log-probs and entropies are those of the pass over every
row (float tolerance: a forward over fewer rows may round differently), the dropped rows never reach the model or
the loss, and training matches the old path step for step."""

from __future__ import annotations

import pytest
import torch
from test_rl_trainer import _scripted_reward, make_trainer, record_batches

from klear_lib.recipe import KlearLossConfig
from klear_lib.train.rl import KlearGRPOTrainer

G = 4
INFORMATIVE = {0, 2, 4, 6, 8}  # answers whose groups pass the filter (the others are all right: dropped)


def _run(tiny, tmp_path, kept_only: bool, monkeypatch, *, max_gen_batches=1):
    """One rollout of 3 steps (3 prompts kept of 6 generated) with the pass over kept rows or over every row; the
    batches trained on, the rows each old-log-prob pass ran on, and the generation batches' outputs."""
    monkeypatch.setattr(KlearGRPOTrainer, "old_pass_kept_only", kept_only)
    klear = KlearLossConfig(loss_name="gppo", sft_alpha=0.0, oversample_factor=2.0, max_gen_batches=max_gen_batches)
    trainer = make_trainer(tiny, tmp_path / str(kept_only), klear=klear, steps=3, updates=3, rollouts=1,
                           per_device=G, generations=G, reward_funcs=[_scripted_reward(INFORMATIVE, [], G)])
    passes, parts = [], []
    inner, score = trainer._logps_and_entropies, trainer._generate_and_score_completions

    def spy_pass(model, input_ids, *a, **kw):
        if not torch.is_grad_enabled():  # the old-log-prob pass (the loss's pass runs with gradients)
            passes.append(input_ids.shape[0])
        return inner(model, input_ids, *a, **kw)

    def spy_score(rows):
        out = score(rows)
        parts.append(out)
        return out

    trainer._logps_and_entropies, trainer._generate_and_score_completions = spy_pass, spy_score
    batches = record_batches(trainer)
    trainer.train()
    return trainer, batches, passes, parts


@pytest.mark.parametrize("max_gen_batches", [1, 3])
def test_the_old_pass_over_kept_rows_equals_the_pass_over_every_row(tiny, tmp_path, monkeypatch, max_gen_batches):
    torch.manual_seed(0)
    old, old_batches, old_passes, _ = _run(tiny, tmp_path, False, monkeypatch, max_gen_batches=max_gen_batches)
    torch.manual_seed(0)
    new, new_batches, new_passes, parts = _run(tiny, tmp_path, True, monkeypatch, max_gen_batches=max_gen_batches)
    assert len(old_batches) == len(new_batches) >= 1
    for a, b in zip(old_batches, new_batches):
        assert torch.equal(a["completion_ids"], b["completion_ids"])  # the same rows, trained in the same order
        m = a["completion_mask"].bool()
        for key in ("old_per_token_logps", "old_entropy"):
            assert not torch.isnan(b[key]).any(), key  # no row the pass skipped reaches the loss
            assert torch.allclose(a[key][m], b[key][m], atol=1e-5, rtol=1e-5), key
    # the pass ran on the kept groups' rows only: 3 groups of G, against every generated row before
    kept_rows = sum(b["completion_ids"].shape[0] for b in new_batches)
    assert sum(new_passes) == kept_rows == 3 * G and sum(old_passes) == 6 * G * len(parts)
    # the dropped rows were never computed: they still read NaN in their generation batch
    never = sum(int(torch.isnan(p["old_per_token_logps"]).all(1).sum()) for p in parts)
    assert never == 6 * G * len(parts) - kept_rows
    # and the runs trained alike: the same weights after the rollout, within float tolerance
    for (name, p), q in zip(old.model.named_parameters(), new.model.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name


def test_a_process_without_a_kept_group_gets_a_finite_placeholder_row(tiny, tmp_path):
    """The placeholder row (``klear_keep`` 0) may be a dropped row, whose old values were never computed: they are
    made finite, since 0 x NaN is NaN in the masked loss."""
    trainer = make_trainer(tiny, tmp_path, klear=KlearLossConfig(loss_name="gppo", sft_alpha=0.0), steps=2, updates=2,
                           rollouts=1, per_device=G, generations=G)
    nan = torch.full((G, 3), float("nan"))
    part = {"completion_ids": torch.zeros(G, 3, dtype=torch.long), "prompt_ids": torch.zeros(G, 2, dtype=torch.long),
            "klear_keep": torch.ones(G), "old_per_token_logps": nan, "old_entropy": nan.clone()}
    batch = trainer._local_mini_batch([part], [])
    assert batch["klear_keep"].tolist() == [0.0]
    assert torch.equal(batch["old_per_token_logps"], torch.zeros(1, 3))
    assert torch.equal(batch["old_entropy"], torch.zeros(1, 3))
