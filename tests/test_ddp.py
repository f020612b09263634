"""Data parallel RL on two CPU processes (torchrun, gloo): the replicas stay identical and train on the union of
their data.

``KlearGRPOTrainer`` with the default log-prob backend (``klear``), GPPO+ERC, Klear's dynamic sampling and α, two
processes that generate on different prompts: after several optimizer steps every parameter is identical on both
ranks (checksums), and a single process that trains on the union of the two ranks' mini-batches, step by step, has
the same losses (the mean of the ranks' losses: token-means over the global mini-batch) and the same parameters.
The same for a PEFT LoRA model. The ranks run this file as a script (``python -m torch.distributed.run ...
tests/test_ddp.py KINDS OUT``), every kind in the same two processes, one after the other (one torchrun for the
module: each process start imports TRL again); the tests run the single-process replays and compare.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("full", "lora")  # trained through KlearGRPOTrainer under DDP
G, PER_DEVICE, UPDATES, ROLLOUTS = 4, 4, 2, 2  # 2 processes x 4 completions = 2 prompts per optimizer step


def parity_reward(completions, **kw) -> list[float]:
    """1.0 for a completion of even length, else 0.0: an untrained model gets both within a group, often enough for
    Klear's filter (the fully-correct indicator must vary) to keep most groups and drop some."""
    return [1.0 if len(c[-1]["content"]) % 2 == 0 else 0.0 for c in completions]


def tiny_model_and_tokenizer():
    from klear_lib import models
    from klear_lib.data import tasks

    train, _ = tasks.make_splits(0, 64, 4)
    tok = models.build_tokenizer(tasks.corpus(train), vocab_size=300)
    spec = models.TinyModelSpec(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                intermediate_size=64)
    return models.build_tiny_model(tok, spec, seed=0), tok, train


def make_trainer(kind: str, out: Path, *, per_device: int):
    """The trainer both the ranks and the replay build (the replay with the union's batch size)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback
    from trl import GRPOConfig

    from klear_lib.data import tasks
    from klear_lib.losses import PolicyLossConfig
    from klear_lib.recipe import KlearLossConfig
    from klear_lib.train.rl import KlearGRPOTrainer

    model, tok, train = tiny_model_and_tokenizer()
    ds = Dataset.from_list([{"prompt": tasks.prompt_messages(p), "answer": p.answer} for p in train])
    args = GRPOConfig(
        output_dir=str(out / "trainer"), per_device_train_batch_size=per_device, steps_per_generation=UPDATES,
        gradient_accumulation_steps=1, num_generations=G, max_completion_length=8, temperature=0.9,
        learning_rate=1e-2 if kind == "lora" else 3e-3, max_steps=ROLLOUTS * UPDATES, beta=0.0, use_cpu=True,
        bf16=False, report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
        weight_decay=0.01, dataloader_num_workers=0,
    )
    klear = KlearLossConfig(loss_name="gppo", policy_loss=PolicyLossConfig(erc_low=0.95, erc_high=1.05),
                            filter_groups=True, filter_rule="klear", oversample_factor=2.0, sft_alpha=0.1)
    peft_config = None
    if kind == "lora":
        peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"])
    trainer = KlearGRPOTrainer(model=model, reward_funcs=[parity_reward], args=args, train_dataset=ds,
                               processing_class=tok, klear=klear, rollouts=ROLLOUTS, peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)
    return trainer


def trainable(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def checksum(params: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].contiguous().numpy().tobytes())
    return h.hexdigest()


def _detached(batch: dict) -> dict:
    return {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def spy(trainer) -> tuple[list, list]:
    """Record every rollout's local mini-batches and every loss the trainer computes (its value, as backpropagated)."""
    rollouts, losses = [], []
    generate, compute = trainer._generate_rollout, trainer._compute_loss

    def gen():
        batches, record = generate()
        rollouts.append(([_detached(b) for b in batches], dict(record)))
        return batches, record

    def loss(model, inputs):
        value = compute(model, inputs)
        losses.append(float(value.detach()))
        return value

    trainer._generate_rollout, trainer._compute_loss = gen, loss
    return rollouts, losses


def worker(kinds: str, out: Path) -> None:
    """One rank: each of ``kinds`` (comma-separated) in turn, each into ``out/<kind>``."""
    for kind in kinds.split(","):
        run_kind(kind, out)


def run_kind(kind: str, out: Path) -> None:
    """One rank of ``kind``: train, save what it trained on, its losses and its parameters."""
    rank = int(os.environ["RANK"])
    if kind == "fsdp2":
        return fsdp2_worker(out / kind, rank)
    trainer = make_trainer(kind, out / kind, per_device=PER_DEVICE)
    assert trainer.accelerator.num_processes == 2 and trainer.klear.logprob_backend == "klear"
    init = trainable(trainer)
    rollouts, losses = spy(trainer)
    t0 = time.process_time()
    trainer.train()
    params = trainable(trainer)
    torch.save({"init": init, "params": params, "checksum": checksum(params), "rollouts": rollouts,
                "losses": losses, "steps": trainer.state.global_step, "cpu_s": time.process_time() - t0,
                "wrapped": type(trainer.model_wrapped).__name__},
               out / kind / f"rank{rank}.pt")


def ddp_run(kinds: str, out: Path) -> Path:
    """Both ranks of each of ``kinds`` (comma-separated) under one torchrun; returns the folder of their records."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           __file__, kinds, str(out)], capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    print(f"torchrun, 2 processes, {kinds}: {time.perf_counter() - t0:.0f}s wall")
    return out


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    """Every kind's two ranks, FSDP2's last (it ends the process group)."""
    return ddp_run(",".join((*KINDS, "fsdp2")), tmp_path_factory.mktemp("ddp"))


@pytest.mark.parametrize("kind", KINDS)
def test_ddp_ranks_identical(kind, ddp_runs, tmp_path):
    from klear_lib.train.rl import _concat_rows

    r0, r1 = (torch.load(ddp_runs / kind / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["wrapped"] == "DistributedDataParallel"
    assert r0["steps"] == r1["steps"] >= 3, (r0["steps"], r1["steps"])  # several optimizer steps
    assert len(r0["losses"]) == r0["steps"]
    # the ranks trained on different data ...
    first0, first1 = r0["rollouts"][0][0][0], r1["rollouts"][0][0][0]
    assert first0["prompt_ids"].shape != first1["prompt_ids"].shape or not torch.equal(first0["prompt_ids"],
                                                                                          first1["prompt_ids"])
    # ... under Klear's dynamic sampling: 2x oversampled, the kept groups capped at the target
    for (_, rec), (_, rec1) in zip(r0["rollouts"], r1["rollouts"]):
        assert rec["klear/generated_groups"] == 8 and 0 < rec["klear/kept_groups"] <= 4
        assert rec["klear/kept_groups"] == rec1["klear/kept_groups"]
    # ... and ended with identical parameters, which moved
    assert r0["checksum"] == r1["checksum"], "the replicas diverged: the ranks stepped on different gradients"
    assert torch.equal(torch.stack([p.sum() for p in r0["init"].values()]),
                       torch.stack([p.sum() for p in r1["init"].values()]))
    moved = sum(float((r0["params"][n] - r0["init"][n]).abs().sum()) for n in r0["params"])
    assert moved > 0

    # one process on the union of the two ranks' mini-batches, step by step, from the same start
    trainer = make_trainer(kind, tmp_path / "single", per_device=2 * PER_DEVICE)
    assert trainer.accelerator.num_processes == 1
    with torch.no_grad():
        named = dict(trainer.model.named_parameters())
        assert set(named) >= set(r0["init"])
        for name, value in r0["init"].items():
            named[name].copy_(value)
    pad = trainer.processing_class.pad_token_id
    union = iter([([_concat_rows([b0, b1], pad_id=pad) for b0, b1 in zip(bs0, bs1)], rec)
                  for (bs0, rec), (bs1, _) in zip(r0["rollouts"], r1["rollouts"])])
    _, losses = spy(trainer)
    trainer._generate_rollout = lambda: next(union)  # instead of generating
    trainer.train()
    assert len(losses) == r0["steps"]
    ddp_loss = [(a + b) / 2 for a, b in zip(r0["losses"], r1["losses"])]
    assert losses == pytest.approx(ddp_loss, abs=1e-5, rel=1e-5)
    single = trainable(trainer)
    for name, value in r0["params"].items():
        assert torch.allclose(single[name], value, atol=2e-5), (name, float((single[name] - value).abs().max()))


FSDP_IDS = (4, 10)  # (rows, length) of the scored batch; each rank scores half of the rows
FSDP_KEEP = 5


def fsdp_batch():
    ids = torch.randint(3, 300, FSDP_IDS, generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    mask[3, -2:] = 0  # an early end
    return ids, mask


def fsdp2_worker(out: Path, rank: int) -> None:
    """FSDP2 (``fully_shard`` per decoder layer and at the root, weights sharded over the two ranks): the klear
    backend on this rank's rows, and the gradient FSDP reduce-scatters, gathered back to full tensors. (Through the
    trainer FSDP cannot run here: accelerate 1.15 falls back to DDP on a CPU.)"""
    from torch.distributed.fsdp import fully_shard

    from klear_lib.train.token_stats import klear_token_stats

    if not torch.distributed.is_initialized():  # the DDP kinds before it initialized it through accelerate
        torch.distributed.init_process_group("gloo")
    model, _, _ = tiny_model_and_tokenizer()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    sharded = type(model.lm_head.weight).__name__
    ids, mask = fsdp_batch()
    rows = slice(rank * FSDP_IDS[0] // 2, (rank + 1) * FSDP_IDS[0] // 2)
    logps, ent, _ = klear_token_stats(model, ids[rows], mask[rows], FSDP_KEEP, temperature=0.9)
    (logps.sum() + 0.5 * ent.sum()).backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}  # averaged over the ranks by FSDP
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"logps": logps.detach(), "ent": ent.detach(), "grads": grads, "rows": rows, "sharded": sharded},
               out / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def test_fsdp2_klear_backend_equals_one_process(ddp_runs):
    """Under FSDP2 the klear backend sees the gathered weights and its gradients reach the sharded parameters: each
    rank's log-probs and entropies, and the gradient FSDP averages over the ranks, equal one unsharded process on
    the whole batch (the old backend failed here: the backbone ran on sharded weights)."""
    from klear_lib.train.token_stats import klear_token_stats

    model, _, _ = tiny_model_and_tokenizer()
    ids, mask = fsdp_batch()
    logps, ent, _ = klear_token_stats(model, ids, mask, FSDP_KEEP, temperature=0.9)
    ((logps.sum() + 0.5 * ent.sum()) / 2).backward()  # the mean over two ranks of their sums
    grads = {n: p.grad for n, p in model.named_parameters()}
    for r in (0, 1):
        rec = torch.load(ddp_runs / "fsdp2" / f"rank{r}.pt", weights_only=False)
        assert rec["sharded"] == "DTensor"
        assert torch.allclose(rec["logps"], logps[rec["rows"]], atol=1e-5)
        assert torch.allclose(rec["ent"], ent[rec["rows"]], atol=1e-5)
        assert set(rec["grads"]) == set(grads)
        for name, g in grads.items():
            assert torch.allclose(rec["grads"][name], g, atol=1e-5), (name, float((rec["grads"][name] - g).abs().max()))


if __name__ == "__main__":
    from klear_lib.train.launch import exit_rank

    worker(sys.argv[1], Path(sys.argv[2]))  # an exception ends the rank as usual, with its traceback
    exit_rank(0)
