"""One RL rollout of notebook 03's tiny unit with the old-log-prob pass over the kept groups' rows only
(``KlearGRPOTrainer.old_pass_kept_only``, the default) against the pass over every generated row (TRL's).

The setting is 03's `tiny` preset: the tiny Qwen3 (hidden 128, 4 layers), 32 prompts generated for 16 trained
(``oversample_factor`` 2), 8 completions each, up to 56 tokens, one prompt per optimizer step (16 updates), one
torch thread (a unit's). The reward is scripted so that every group passes the filter: the cap at 16 of 32 then
keeps half the rows, the most a 03 rollout ever keeps, so the ratio is the smallest win the preset can see (fewer
groups pass on a real run, and the pass shrinks with them). Both sides start from the same weights and seeds, and
alternate; each side's figure is its fastest repeat (on a shared machine noise only adds time: the median of the
same rollout was 4.47 s in one run and 6.45 s in the next, 2026-12-05). What is timed: ``trainer.train()`` for one
rollout (generation, scoring, the old pass, 16 optimizer steps), and apart from it the time inside the old passes.

Targets: rollout time ratio <= 0.95 (a profile put the pass over every row at 16% of a 03 unit; half of it is ~8%),
and the passes' own time ratio <= 0.6 (half the rows, plus a fixed cost per call).
Run: `.venv/bin/python benchmarks/bench_old_pass.py [--repeats N]`; `--quick` runs the same code on a smaller
rollout (seconds: what the test suite runs, its ratio means nothing). The headline figure is printed as
`RATIO rollout_time_kept_pass_over_full_pass <value> TARGET <= 0.95` (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from datasets import Dataset
from transformers import PrinterCallback
from trl import GRPOConfig

from klear_lib import models
from klear_lib.data import tasks
from klear_lib.notebook import quiet
from klear_lib.recipe import KlearLossConfig
from klear_lib.train.rl import KlearGRPOTrainer

TARGET = 0.95


def every_group_informative(completions, prompts, answer, **kw):
    """The first completion of each group right, the others wrong: every group passes Klear's filter."""
    return [1.0 if i % GENERATIONS == 0 else 0.0 for i in range(len(completions))]


GENERATIONS = 8


def one_rollout(kept_only: bool, tok, spec, ds, *, prompts: int, max_len: int) -> tuple[float, float]:
    """Seconds of ``train()`` for one rollout, and of the old-log-prob passes inside it."""
    torch.manual_seed(0)
    model = models.build_tiny_model(tok, spec, seed=0)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=GENERATIONS, steps_per_generation=prompts,
        gradient_accumulation_steps=1, num_generations=GENERATIONS, max_completion_length=max_len, temperature=1.0,
        learning_rate=5e-5, max_steps=prompts, beta=0.0, use_cpu=True, bf16=False, report_to="none",
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
    )
    klear = KlearLossConfig(loss_name="gppo", sft_alpha=0.0, oversample_factor=2.0)
    trainer = KlearGRPOTrainer(model=model, reward_funcs=[every_group_informative], args=args, train_dataset=ds,
                               processing_class=tok, klear=klear, rollouts=1)
    trainer.remove_callback(PrinterCallback)
    trainer.old_pass_kept_only = kept_only
    in_pass = [0.0]
    inner = trainer._logps_and_entropies

    def timed(model, *a, **kw):
        if torch.is_grad_enabled():  # the loss's pass
            return inner(model, *a, **kw)
        t0 = time.perf_counter()
        try:
            return inner(model, *a, **kw)
        finally:
            in_pass[0] += time.perf_counter() - t0

    trainer._logps_and_entropies = timed
    t0 = time.perf_counter()
    trainer.train()
    return time.perf_counter() - t0, in_pass[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--quick", action="store_true", help="a smaller rollout, 1 repeat (seconds; the test suite's)")
    args = p.parse_args(argv)
    prompts, max_len, hidden = (4, 16, 32) if args.quick else (16, 56, 128)
    repeats = 1 if args.quick else args.repeats
    quiet()
    torch.set_num_threads(1)  # a unit's (klear_lib.experiment.run_jobs)
    train, _ = tasks.make_splits(0, 600, 10)
    tok = models.build_tokenizer(tasks.corpus(train))
    # 03's model (RLExperimentConfig's tiny_hidden 128, tiny_layers 4; models.model_for), smaller at --quick
    spec = models.TinyModelSpec(hidden_size=hidden, num_hidden_layers=4, intermediate_size=3 * hidden)
    ds = Dataset.from_list([{"prompt": tasks.prompt_messages(q), "answer": q.answer} for q in train])
    one_rollout(True, tok, spec, ds, prompts=prompts, max_len=max_len)  # warm-up
    full, kept = [], []
    for _ in range(repeats):  # alternated, so drifts in machine load hit both alike
        full.append(one_rollout(False, tok, spec, ds, prompts=prompts, max_len=max_len))
        kept.append(one_rollout(True, tok, spec, ds, prompts=prompts, max_len=max_len))
    t_full, t_kept = (min(t for t, _ in runs) for runs in (full, kept))
    p_full, p_kept = (min(s for _, s in runs) for runs in (full, kept))
    print(f"one rollout: {2 * prompts} prompts x {GENERATIONS} completions generated, {prompts} kept (the cap), "
          f"{prompts} updates; hidden {hidden}; {repeats} alternated repeats, the fastest of each, 1 thread")
    print(f"old pass over every row   : {t_full:7.2f} s / rollout, of which the pass {p_full:6.2f} s "
          f"({p_full / t_full:.1%})")
    print(f"old pass over kept rows   : {t_kept:7.2f} s / rollout, of which the pass {p_kept:6.2f} s "
          f"({p_kept / t_kept:.1%})")
    rest = [min(t - s for t, s in runs) for runs in (full, kept)]
    print(f"the rest of the rollout (generation, scoring, updates): {rest[0]:.2f} s and {rest[1]:.2f} s (the same "
          "work: their gap is the machine's noise)")
    ratio = t_kept / t_full
    print(f"pass time ratio kept / every = {p_kept / p_full:.3f}")
    print(f"RATIO old_pass_time_kept_over_every {p_kept / p_full:.3f} TARGET <= 0.6")
    print(f"ratio kept / every = {ratio:.3f}  (target <= {TARGET}: {'met' if ratio <= TARGET else 'NOT met'})")
    print(f"RATIO rollout_time_kept_pass_over_full_pass {ratio:.3f} TARGET <= {TARGET}")
    return ratio


if __name__ == "__main__":
    main()
