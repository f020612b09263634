"""CPU time of one SFT unit with packed batches (``SFTStageConfig.packed``) against TRL's padded ones (issue 46).

The unit is notebook 03's SFT start at ``tiny`` (6,000 teacher samples of levels 1-4 with its fork facts, the tiny
Qwen3 of 128 hidden and 4 layers, vocabulary 1,024, 2 epochs of batch 16: 750 steps, lr 2e-3), trained by
``train.sft.run_sft`` from the same initial weights, padded and packed in turns in this one process (one torch
thread; run it with ``OMP_WAIT_POLICY=PASSIVE``), ``--runs`` times each. Both see the same batches in the same order
(``tests/test_sft_packing.py``), so also printed: each run's padding share (``sft_tokens.json``), its last logged
training loss (the mean of the last 10 steps) and its mean over all steps, and where the CPU time of
``Trainer.train`` went: building the batches (the collator, packing included), ``training_step`` (forward and
backward), gradient clipping, the optimizer step, and the rest (Trainer's own per-step work: callbacks, logging,
the scheduler, the data loader).

Headline: ``RATIO sft_unit_cpu_packed_over_padded`` (the fastest run of each, ``Trainer.train``'s and the whole
``run_sft``'s; target <= 0.85). ``--control`` adds a padded run with each batch's rows in reverse order: the same
numbers but for float rounding, to tell how far rounding alone moves the losses over the unit. ``--samples`` and
``--epochs`` take a fixed shorter slice of the unit; ``--quick``: 64 samples, 1 epoch, batch 8, one run each
(seconds; its ratio means nothing). Run: ``OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_sft_packing.py
[--samples 6000] [--epochs 2] [--runs 2] [--control]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from klear_lib import models, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.notebook import quiet
from klear_lib.train import sft

TARGET = 0.85


class TimedTrainer(sft.SFTTrainer):
    """SFTTrainer that adds up the CPU time of ``train``, ``training_step``, gradient clipping, the optimizer step
    and the collator, and keeps the logged training losses."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cpu = dict.fromkeys(("train", "collate", "training_step", "clip", "optimizer"), 0.0)
        self.losses: list[float] = []
        self.train_loss = float("nan")
        timed = self

        class Clock(TrainerCallback):
            def on_pre_optimizer_step(self, *_args, **_kw):
                timed._opt_from = time.process_time()

            def on_optimizer_step(self, *_args, **_kw):
                timed.cpu["optimizer"] += time.process_time() - timed._opt_from

        self.add_callback(Clock())

    reverse_rows = False
    """The control: each padded batch's rows in reverse order (the same numbers but for float rounding)."""

    def train(self, *args, **kwargs):
        collate = self.data_collator

        def timed_collate(examples):
            t = time.process_time()
            batch = collate(examples)
            if self.reverse_rows:
                batch = {k: v.flip(0) for k, v in batch.items()}
            self.cpu["collate"] += time.process_time() - t
            return batch

        self.data_collator = timed_collate
        t = time.process_time()
        try:
            return super().train(*args, **kwargs)
        finally:
            self.cpu["train"] += time.process_time() - t
            self.data_collator = collate

    def training_step(self, *args, **kwargs):
        t = time.process_time()
        out = super().training_step(*args, **kwargs)
        self.cpu["training_step"] += time.process_time() - t
        return out

    def _clip_grad_norm(self, *args, **kwargs):
        t = time.process_time()
        out = super()._clip_grad_norm(*args, **kwargs)
        self.cpu["clip"] += time.process_time() - t
        return out

    def log(self, logs, *args, **kwargs):
        if "loss" in logs:
            self.losses.append(float(logs["loss"]))
        if "train_loss" in logs:
            self.train_loss = float(logs["train_loss"])
        return super().log(logs, *args, **kwargs)


def unit_config(samples: int, epochs: float, batch: int) -> RLExperimentConfig:
    """Notebook 03's ``tiny`` SFT fields (params/03_rl_clip_variants/tiny.yaml), at ``samples``/``epochs``/``batch``."""
    return RLExperimentConfig(model="tiny", n_train=samples, n_heldout=128, levels="1,2,3,4", sft_lr=0.002,
                              sft_epochs=epochs, sft_batch_size=batch, fork_facts="2+3->6,5+1->7,7+2->8,9+3->1",
                              fork_wrong_rate=0.8, use_cpu=True, bf16=False, seed=0)


def one_run(cfg, train, packed: bool, out: Path, reverse_rows: bool = False) -> dict:
    runs.set_seed(cfg.seed)
    model, tokenizer = models.model_for(cfg, tasks.corpus(train))
    samples = sft.sft_samples(train, error_rate=cfg.sft_error_rate, seed=cfg.data_seed,
                              fork_facts=tasks.parse_fork_facts(cfg.fork_facts), fork_wrong_rate=cfg.fork_wrong_rate)
    made = []
    real = sft.SFTTrainer
    timed = type("Timed", (TimedTrainer,), {"reverse_rows": reverse_rows})
    sft.SFTTrainer = lambda *a, **k: made.append(timed(*a, **k)) or made[-1]
    try:
        t = time.process_time()
        sft.run_sft(model, tokenizer, samples, out, sft.SFTStageConfig.from_experiment(cfg, packed=packed,
                                                                                       resume=False))
        total = time.process_time() - t
    finally:
        sft.SFTTrainer = real
    trainer = made[-1]
    tokens = sft.sft_token_stats(out)
    return {"run_sft": total, **trainer.cpu, "steps": trainer.state.global_step,
            "loss": trainer.losses[-1] if trainer.losses else float("nan"), "train_loss": trainer.train_loss,
            "padding_share": tokens["padding_share"], "packed": tokens["packed"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=6000)
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--control", action="store_true", help="also one padded run with each batch's rows reversed: "
                   "how far float rounding alone moves the losses")
    p.add_argument("--quick", action="store_true", help="64 samples, 1 epoch, batch 8, one run each (seconds)")
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.epochs, args.batch, args.runs = 64, 1.0, 8, 1
    quiet()
    torch.set_num_threads(1)
    cfg = unit_config(args.samples, args.epochs, args.batch)
    train, _ = tasks.make_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, cfg.level_list)
    print(f"03's SFT unit: {args.samples} samples, {args.epochs:g} epochs, batch {args.batch}; one thread, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; CPU seconds")
    results = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.runs):
            for packed in (False, True):
                res = one_run(cfg, train, packed, Path(tmp) / f"run{r}_{packed}")
                results[packed].append(res)
                other = res["train"] - res["collate"] - res["training_step"] - res["clip"] - res["optimizer"]
                print(f"{'packed' if packed else 'padded'} run {r}: run_sft {res['run_sft']:.1f}, train "
                      f"{res['train']:.1f} (collate {res['collate']:.1f}, training_step {res['training_step']:.1f}, "
                      f"clip {res['clip']:.1f}, optimizer {res['optimizer']:.1f}, rest {other:.1f} = "
                      f"{other / res['train']:.1%}); {res['steps']} steps, padding {res['padding_share']:.3f}, "
                      f"last logged loss {res['loss']:.6f}, mean loss {res['train_loss']:.6f}")
        if args.control:
            res = one_run(cfg, train, False, Path(tmp) / "control", reverse_rows=True)
            print(f"control (padded, rows reversed): run_sft {res['run_sft']:.1f}; padding {res['padding_share']:.3f}, "
                  f"last logged loss {res['loss']:.6f}, mean loss {res['train_loss']:.6f}")
    best = {k: min(v, key=lambda r: r["train"]) for k, v in results.items()}
    ratio_train = best[True]["train"] / best[False]["train"]
    ratio_all = min(r["run_sft"] for r in results[True]) / min(r["run_sft"] for r in results[False])
    print(f"packed / padded, fastest of {args.runs}: Trainer.train {ratio_train:.3f}, run_sft {ratio_all:.3f} "
          f"(target <= {TARGET}: {'met' if ratio_all <= TARGET else 'NOT met'})")
    print(f"RATIO sft_unit_cpu_packed_over_padded {ratio_all:.3f} TARGET <= {TARGET}")
    print(f"RATIO sft_train_cpu_packed_over_padded {ratio_train:.3f} TARGET <= {TARGET}")
    return ratio_all


if __name__ == "__main__":
    main()
