"""GPU paths: the trainer on CUDA with fp32 master weights and bf16 autocast, the klear log-prob backend against
TRL's fused head under bf16 autocast, and vLLM rollouts. Real code, skipped where no GPU is present (never faked on
a CPU). Run on a GPU machine by scripts/gpu_check.sh (its ``gpu_tests`` stage), or
``pytest -m gpu tests/test_gpu.py``; the file imports only what the check's bare machine has (torch, transformers,
TRL and datasets from the check's wheels)."""

import pytest
import torch

from klear_lib import models, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.train.rl_run import run_rl

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny_saved(tmp_path_factory):
    """A tiny untrained model saved in bf16 (as Qwen3's checkpoints are)."""
    train, held = tasks.make_splits(0, 256, 16)
    tok = models.build_tokenizer(tasks.corpus(train))
    model = models.build_tiny_model(tok).to(torch.bfloat16)
    path = models.save_model_and_tokenizer(model, tok, tmp_path_factory.mktemp("tiny") / "model")
    return path, train, held


def _run(tiny_saved, tmp_path, **overrides):
    """Two rollouts of two updates each. The untrained model answers nothing right, so Klear's filter (the
    fully-correct indicator must vary) would keep no group: the filter is off, every group is trained on."""
    path, train, held = tiny_saved
    cfg = RLExperimentConfig(model=str(path), rollouts=2, rollout_prompts=4, mini_batch_prompts=2, num_generations=4,
                             max_completion_length=24, eval_every=1, eval_n=2, use_cpu=False, bf16=True,
                             filter_groups=False, **overrides)
    runs.set_seed(0)
    model, tok = models.load_model_and_tokenizer(path)  # fp32 master weights from the bf16 checkpoint
    with runs.MetricsWriter(tmp_path / "metrics.jsonl") as w:
        model, history = run_rl(cfg, model, tok, train, held, w, tags={"variant": "gpu"},
                                output_dir=str(tmp_path / "trainer"))
    recs = runs.read_metrics(tmp_path / "metrics.jsonl")
    return model, history, [r for r in recs if "actor/pg_loss" in r]


def test_trainer_runs_on_cuda_with_fp32_weights_and_bf16_autocast(tiny_saved, tmp_path):
    model, history, steps = _run(tiny_saved, tmp_path, loss_name="gppo", erc_low=0.8, erc_high=1.2)
    assert next(model.parameters()).device.type == "cuda"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert len(steps) == 4 and len(history) == 3
    assert all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in steps)
    assert steps[0]["actor/ratio_max"] == pytest.approx(1.0, abs=2e-2)  # on-policy first update (bf16 rounding)


def test_klear_backend_equals_trls_fused_head_under_bf16_autocast(tiny_saved):
    """On CUDA under bf16 autocast, with TRL's head in fp32 as ours computes it: the same backbone, so log-probs and
    entropies agree to 1e-3 and the parameter gradients to 2% of their norm."""
    from trl.trainer.utils import add_fused_lm_head

    from klear_lib.train.token_stats import klear_token_stats

    path, _, _ = tiny_saved
    model, _ = models.load_model_and_tokenizer(path)
    model.cuda()
    ids = torch.randint(3, model.config.vocab_size, (6, 40), generator=torch.Generator().manual_seed(0)).cuda()
    mask = torch.ones_like(ids)
    mask[0, :10] = 0
    mask[1, -5:] = 0
    keep = 24
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    add_fused_lm_head(model, temperature=0.9, cast_lm_head_to_fp32=True, outputs=("log_probs", "entropy"))

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16)

    def run(fn):
        model.zero_grad(set_to_none=True)
        logps, ent = fn()
        m = mask[:, -keep:].float()
        ((logps * m).sum() + 0.5 * (ent * m).sum()).backward()
        return logps.detach(), ent.detach(), torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    def trl_head():
        with autocast():
            out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        return out.log_probs[:, -keep:], out.entropy[:, -keep:]

    theirs = run(trl_head)
    ours = run(lambda: klear_token_stats(model, ids, mask, keep, temperature=0.9, autocast=autocast)[:2])
    valid = mask[:, -keep:].bool()
    assert torch.allclose(ours[0][valid], theirs[0][valid], atol=1e-3)
    assert torch.allclose(ours[1][valid], theirs[1][valid], atol=1e-3)
    assert float((ours[2] - theirs[2]).norm() / theirs[2].norm()) < 2e-2


def test_vllm_rollouts(tiny_saved, tmp_path):
    pytest.importorskip("vllm")
    _, history, steps = _run(tiny_saved, tmp_path, loss_name="gppo", use_vllm=True)
    assert len(steps) == 4 and len(history) == 3
    assert all(r["old_entropy"] >= 0 for r in steps)
