"""GPU paths: the same trainer on CUDA in bf16, and vLLM rollouts. Real code, skipped where no GPU is present
(never faked on a CPU). Run on a GPU machine with `pytest -m gpu tests/test_gpu.py`."""

import pytest
import torch

from klear_lib import models, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.train.rl import run_rl

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny_saved(tmp_path_factory):
    train, held = tasks.make_splits(0, 256, 16)
    tok = models.build_tokenizer(tasks.corpus(train))
    model = models.build_tiny_model(tok)
    path = models.save_model_and_tokenizer(model, tok, tmp_path_factory.mktemp("tiny") / "model")
    return path, train, held


def _run(tiny_saved, tmp_path, **overrides):
    path, train, held = tiny_saved
    cfg = RLExperimentConfig(model=str(path), rollouts=2, rollout_prompts=4, mini_batch_prompts=2, num_generations=4,
                             max_completion_length=24, eval_every=1, eval_n=2, use_cpu=False, bf16=True, **overrides)
    runs.set_seed(0)
    model, tok = models.load_model_and_tokenizer(path, dtype=torch.float32)
    with runs.MetricsWriter(tmp_path / "metrics.jsonl") as w:
        model, history = run_rl(cfg, model, tok, train, held, w, tags={"variant": "gpu"})
    recs = runs.read_metrics(tmp_path / "metrics.jsonl")
    return model, history, [r for r in recs if "actor/pg_loss" in r]


def test_trainer_runs_on_cuda_in_bf16(tiny_saved, tmp_path):
    model, history, steps = _run(tiny_saved, tmp_path, loss_name="gppo", erc_low=0.8, erc_high=1.2)
    assert next(model.parameters()).device.type == "cuda"
    assert len(steps) == 4 and len(history) == 3
    assert all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in steps)
    assert steps[0]["actor/ratio_max"] == pytest.approx(1.0, abs=2e-2)  # on-policy first update (bf16 rounding)


def test_vllm_rollouts(tiny_saved, tmp_path):
    pytest.importorskip("vllm")
    _, history, steps = _run(tiny_saved, tmp_path, loss_name="gppo", use_vllm=True)
    assert len(steps) == 4 and len(history) == 3
    assert all(r["old_entropy"] >= 0 for r in steps)
