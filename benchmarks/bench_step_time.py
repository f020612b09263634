"""Step time of KlearGRPOTrainer (gppo + ERC) against TRL's own GRPOTrainer with its built-in `dapo` loss.

Same model weights, same batch, same machine, same run; interleaved repeats, medians. Generation is excluded
(it is the same code in both trainers); what is timed is what differs: the rollout's scoring pass (Klear's also
returns the entropies ERC needs) and one optimizer step (loss, backward, AdamW update).

Target: ratio <= 1.10. Run: `.venv/bin/python benchmarks/bench_step_time.py [--repeats N] [--hidden H]`;
`--quick` runs the same code on a tiny model and batch (seconds: what the test suite runs, its ratio means nothing).
The headline figure is printed as `RATIO step_time_klear_over_trl <value> TARGET <= 1.10` (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from klear_lib import models
from klear_lib.data import tasks
from klear_lib.losses import PolicyLossConfig
from klear_lib.notebook import quiet
from klear_lib.recipe import KlearLossConfig
from klear_lib.train.rl import KlearGRPOTrainer
from klear_lib.train.rl_run import correctness_reward


def build(trainer_cls, model, tok, ds, batch, **extra):
    # max_steps covers one rollout of steps_per_generation optimizer steps: KlearGRPOTrainer refuses a budget of
    # fewer steps than its rollouts need (the loop is bypassed here; the value only has to be valid).
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch, steps_per_generation=2,
        num_generations=8, max_completion_length=64, learning_rate=1e-5, beta=0.0, use_cpu=True, bf16=False,
        report_to="none", disable_tqdm=True, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, max_steps=2,
    )
    t = trainer_cls(model=model, reward_funcs=[correctness_reward], args=args, train_dataset=ds, processing_class=tok,
                    **extra)
    t.create_optimizer_and_scheduler(num_training_steps=1)
    t.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, which this bypasses
    t.model.train()
    return t


def synthetic_batch(tok, batch, prompt_len, completion_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    V = len(tok)
    prompt_ids = torch.randint(3, V, (batch, prompt_len), generator=g)
    completion_ids = torch.randint(3, V, (batch, completion_len), generator=g)
    lengths = torch.randint(completion_len // 2, completion_len + 1, (batch,), generator=g)
    completion_mask = (torch.arange(completion_len)[None] < lengths[:, None]).long()  # (B, T)
    return {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": torch.randn(batch, generator=g),
        "num_items_in_batch": completion_mask.sum() * 2,  # TRL's dapo normaliser spans the generation batch
        "klear_keep": torch.ones(batch), "klear_positive": torch.rand(batch, generator=g) < 0.3,
    }


def rollout_pass(trainer, model, inputs, entropy: bool):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logps, ent, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, model, ids, mask, inputs["completion_ids"].shape[1], compute_entropy=entropy)
    return logps, ent


def step(trainer, inputs, entropy: bool):
    model = trainer.model
    t0 = time.perf_counter()
    old_logps, old_ent = rollout_pass(trainer, model, inputs, entropy)
    inputs = dict(inputs, old_per_token_logps=old_logps * 1.0 - 0.01 * torch.randn_like(old_logps))  # off-policy
    if entropy:
        inputs["old_entropy"] = old_ent * 1.05
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="tiny model, batch and repeats (seconds; the test suite's)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.hidden, args.batch = 2, 32, 16
    quiet()
    torch.manual_seed(0)
    train, _ = tasks.make_splits(0, 500, 10)
    tok = models.build_tokenizer(tasks.corpus(train))
    spec = models.TinyModelSpec(hidden_size=args.hidden, intermediate_size=3 * args.hidden)
    base = models.build_tiny_model(tok, spec)
    ds = Dataset.from_list([{"prompt": tasks.prompt_messages(q), "answer": q.answer} for q in train])
    klear_model = models.build_tiny_model(tok, spec)
    klear_model.load_state_dict(base.state_dict())
    trl_t = build(GRPOTrainer, base, tok, ds, args.batch)
    klear_t = build(KlearGRPOTrainer, klear_model, tok, ds, args.batch, rollouts=1, klear=KlearLossConfig(
        loss_name="gppo", policy_loss=PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, erc_low=0.8,
                                                       erc_high=1.2)))
    inputs = synthetic_batch(tok, args.batch, prompt_len=24, completion_len=64)
    for _ in range(1 if args.quick else 3):  # warm-up
        step(trl_t, inputs, False)
        step(klear_t, inputs, True)
    trl_times, klear_times = [], []
    for _ in range(args.repeats):  # interleaved, so drifts in machine load hit both alike
        trl_times.append(step(trl_t, inputs, False))
        klear_times.append(step(klear_t, inputs, True))
    t_trl, t_klear = statistics.median(trl_times), statistics.median(klear_times)
    n_params = models.count_parameters(base)
    print(f"model: Qwen3 {n_params / 1e6:.1f}M params, vocab {len(tok)}; batch {args.batch} x 64 completion tokens; "
          f"{args.repeats} interleaved repeats, medians, {torch.get_num_threads()} threads")
    print(f"TRL GRPOTrainer, loss_type=dapo : {t_trl * 1e3:8.1f} ms / step")
    print(f"KlearGRPOTrainer, gppo + ERC    : {t_klear * 1e3:8.1f} ms / step")
    ratio = t_klear / t_trl
    print(f"ratio klear / trl = {ratio:.3f}  (target <= 1.10: {'met' if ratio <= 1.10 else 'NOT met'})")
    print(f"RATIO step_time_klear_over_trl {ratio:.3f} TARGET <= 1.10")
    return ratio


if __name__ == "__main__":
    main()
