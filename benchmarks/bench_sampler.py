"""``klear_lib.sampler`` against transformers ``generate`` on the tiny Qwen3 stand-in: CPU time per decoding step.

The setting is an RL generation batch of notebook 03's tiny unit: the stand-in at hidden 128, 4 layers, 4 heads,
2 KV heads (``models.TinyModelSpec``), 32 chat prompts × 8 completions = 256 left-padded rows, 56 new tokens,
one torch thread, both samplers in this process from the same weights and seed (their outputs are checked equal).
Per decoding step = (CPU time of a call for 56 tokens - CPU time of a call for 1 token) / (steps - 1): the prompt's
pass and the call's set-up cancel out. The whole call per token is printed too (the sampler computes a prompt
repeated in a batch once, which HF does not). Each figure is the fastest of ``--repeats`` alternated runs (two by
default; on a shared machine noise only adds time). Settings: TRL's RL sampling (T 1, no filter; the headline) and
the paper's evaluation protocol (T 0.6, top-p 0.95, top-k 20, repetition penalty 1.05, as ``HFEngine`` uses it).
``--rl`` also times one rollout of notebook 03's tiny unit (``bench_old_pass``'s: 32 prompts × 8 completions,
16 updates) with ``KLEAR_SAMPLER`` on and off.

Target (issue 46): HF's time per decoding step / the sampler's >= 1.5.
Run: `.venv/bin/python benchmarks/bench_sampler.py [--rows 256] [--new 56] [--repeats 2] [--rl]`; `--quick` runs
the same code at tiny sizes (seconds: what the test suite runs, its ratios mean nothing). Headline:
`RATIO sampler_decode_step_hf_over_klear <value> TARGET >= 1.5` (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import torch

from klear_lib import models, sampler
from klear_lib.data import tasks
from klear_lib.notebook import quiet

TARGET = 1.5
GENERATIONS = 8
RL = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=None, repetition_penalty=None)
EVAL = dict(do_sample=True, temperature=0.6, top_p=0.95, top_k=20, repetition_penalty=1.05)


def hf_generate(model, ids, mask, **kw):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(input_ids=ids, attention_mask=mask, **kw)


def klear_generate(model, ids, mask, **kw):
    return sampler.generate(model, ids, mask, **kw)


def timed(fn, model, ids, mask, kw, seed=0) -> tuple[float, torch.Tensor]:
    torch.manual_seed(seed)
    t0 = time.process_time()
    out = fn(model, ids, mask, **kw)
    return time.process_time() - t0, out


def per_step(model, tok, ids, mask, setting: dict, new: int, repeats: int) -> dict:
    """Fastest CPU seconds per decoding step and per generated token of each sampler, and whether they agree."""
    kw = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **setting)
    best = {name: [float("inf"), float("inf")] for name in ("hf", "klear")}
    outs = {}
    for _ in range(repeats):  # alternated, so drifts in machine load hit both alike
        for name, fn in (("hf", hf_generate), ("klear", klear_generate)):
            t_one, _ = timed(fn, model, ids, mask, dict(kw, max_new_tokens=1))
            t_all, out = timed(fn, model, ids, mask, dict(kw, max_new_tokens=new))
            steps = out.shape[1] - ids.shape[1]
            best[name][0] = min(best[name][0], (t_all - t_one) / max(steps - 1, 1))
            best[name][1] = min(best[name][1], t_all / steps)
            outs[name] = out
    same = outs["hf"].shape == outs["klear"].shape and bool(torch.equal(outs["hf"], outs["klear"]))
    return {"best": best, "same": same, "steps": outs["klear"].shape[1] - ids.shape[1]}


def rl_rollout(on: bool, tok, spec, ds, *, prompts: int, max_len: int) -> float:
    """CPU seconds of ``train()`` for one rollout of notebook 03's tiny unit, the sampler on or off."""
    import tempfile

    from transformers import PrinterCallback
    from trl import GRPOConfig

    from klear_lib.recipe import KlearLossConfig
    from klear_lib.train.rl import KlearGRPOTrainer

    os.environ[sampler.ENV] = "on" if on else "off"
    torch.manual_seed(0)
    model = models.build_tiny_model(tok, spec, seed=0)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=GENERATIONS, steps_per_generation=prompts,
        gradient_accumulation_steps=1, num_generations=GENERATIONS, max_completion_length=max_len, temperature=1.0,
        learning_rate=5e-5, max_steps=prompts, beta=0.0, use_cpu=True, bf16=False, report_to="none",
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
    )
    klear = KlearLossConfig(loss_name="gppo", sft_alpha=0.0, oversample_factor=2.0)

    def reward(completions, **kw):  # every group informative (bench_old_pass's rule)
        return [1.0 if i % GENERATIONS == 0 else 0.0 for i in range(len(completions))]

    trainer = KlearGRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=ds,
                               processing_class=tok, klear=klear, rollouts=1)
    trainer.remove_callback(PrinterCallback)
    t0 = time.process_time()
    trainer.train()
    return time.process_time() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--new", type=int, default=56)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--rl", action="store_true", help="also time one RL rollout with the sampler on and off")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 repeat (seconds; the test suite's)")
    args = p.parse_args(argv)
    rows, new, hidden = (16, 6, 32) if args.quick else (args.rows, args.new, 128)
    repeats = 1 if args.quick else args.repeats
    quiet()
    torch.set_num_threads(1)  # a unit's (klear_lib.experiment.run_jobs)
    os.environ.pop(sampler.ENV, None)
    train, _ = tasks.make_splits(0, 600, 10)
    tok = models.build_tokenizer(tasks.corpus(train))
    spec = models.TinyModelSpec(hidden_size=hidden, num_hidden_layers=4, intermediate_size=3 * hidden)
    model = models.build_tiny_model(tok, spec, seed=0).eval()
    prompts = max(rows // GENERATIONS, 1)
    texts = [tok.apply_chat_template(tasks.prompt_messages(q), tokenize=False, add_generation_prompt=True)
             for q in train[:prompts] for _ in range(GENERATIONS)][:rows]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    print(f"stand-in hidden {hidden}, 4 layers, vocab {len(tok)}; {len(texts)} rows ({prompts} prompts x "
          f"{GENERATIONS}), prompt width {ids.shape[1]}, {new} new tokens, 1 thread, CPU time, fastest of "
          f"{repeats} alternated runs")
    ratios = {}
    for name, setting in (("rl", RL), ("eval", EVAL)):
        r = per_step(model, tok, ids, mask, setting, new, repeats)
        (hf_step, hf_tok), (k_step, k_tok) = r["best"]["hf"], r["best"]["klear"]
        print(f"[{name}] {r['steps']} steps, outputs identical: {r['same']}")
        print(f"[{name}]   per decoding step: hf {1e3 * hf_step:6.1f} ms, klear {1e3 * k_step:6.1f} ms, "
              f"ratio {hf_step / k_step:.2f}")
        print(f"[{name}]   per token, whole call: hf {1e3 * hf_tok:6.1f} ms, klear {1e3 * k_tok:6.1f} ms, "
              f"ratio {hf_tok / k_tok:.2f}")
        ratios[name] = (hf_step / k_step, hf_tok / k_tok)
    print(f"RATIO sampler_decode_step_hf_over_klear {ratios['rl'][0]:.3f} TARGET >= {TARGET}")
    print(f"RATIO sampler_call_hf_over_klear {ratios['rl'][1]:.3f} TARGET >= {TARGET}")
    print(f"RATIO sampler_decode_step_eval_hf_over_klear {ratios['eval'][0]:.3f} TARGET >= {TARGET}")
    if args.rl or args.quick:
        from datasets import Dataset

        ds = Dataset.from_list([{"prompt": tasks.prompt_messages(q), "answer": q.answer} for q in train])
        n, length = (2, 6) if args.quick else (16, new)
        times = {True: float("inf"), False: float("inf")}
        for _ in range(repeats):
            for on in (False, True):
                times[on] = min(times[on], rl_rollout(on, tok, spec, ds, prompts=n, max_len=length))
        os.environ.pop(sampler.ENV, None)
        print(f"[rl unit] one rollout ({2 * n} prompts x {GENERATIONS} generated, {n} updates): "
              f"hf {times[False]:.2f} CPU-s, klear {times[True]:.2f} CPU-s")
        print(f"RATIO rl_rollout_klear_over_hf {times[True] / times[False]:.3f} TARGET <= 1.0")
    return ratios


if __name__ == "__main__":
    main()
