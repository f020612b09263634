"""The GPU check: every GPU path of the package on one locally built model, in stages that fail independently.

Run by ``scripts/gpu_check.sh`` on a bare CUDA machine (no model hub, possibly no package registry; ≤ 10 minutes on
one H100/H200-class GPU). It builds a Qwen3-architecture model of ~300M parameters with random weights and the
package's own small tokenizer, saves it in bf16 (as Qwen3's checkpoints are) and runs, each stage recorded as
passed, failed (with its error; the next stage still runs) or skipped (with the reason):

- ``environment``: the device, the versions of torch, transformers, trl, datasets, accelerate, peft, vLLM;
- ``sft``: SFT steps through ``train.sft.run_sft`` (TRL's SFTTrainer, bf16 autocast on fp32 weights): the loss on
  the training samples falls;
- ``fp32_master_weights``: the bf16 checkpoint loaded for training is fp32, and one SFT step at lr 1e-6 moves the
  weights by less than bf16 could hold (``weights_dtype: bfloat16`` would have rounded them away);
- ``logprob_backends``: the klear log-prob backend (``klear_lib.logprobs`` through the wrapped forward) against
  TRL's fused LM head on the same batch, log-probs, entropies and parameter gradients, in fp32 and under bf16
  autocast;
- ``rl_hf``: RL through ``KlearGRPOTrainer`` with GPPO+ERC, Klear's dynamic sampling (2x oversampling, the
  fully-correct filter) and α = 0.1, HF generation; the reward is 1 for a completion of even length, so that an
  untrained model's groups vary and the filter keeps some: every kept mini-batch makes one step, the first step
  of a rollout is on-policy, the weights move and stay fp32;
- ``gpu_tests``: pytest on the ``gpu``-marked test files, named one by one (``GPU_TEST_FILES``);
- ``rl_vllm``: the same as ``rl_hf`` with vLLM colocate rollouts, where vLLM is installed (skipped otherwise, and
  on a CPU).

Each stage records its seconds, tokens per second (what it processed) and peak memory (CUDA: the allocator's
peak in the stage; CPU: the process's peak RSS so far). Everything goes to one flat JSON file,
``<out>/gpu_check.json`` (``--out``, default ``$OUT``, else ``outputs/gpu_check``), rewritten after every stage so
that a stopped run leaves what it did. Exit status 1 if a stage failed. ``--cpu``: the same path on the CPU at
tiny sizes (seconds to a minute), so that the test suite proves the check starts and runs
(``tests/test_gpu_check.py``); vLLM is skipped there.

``--wheels``: print the ``NAME==VERSION`` of the wheels a bare CUDA image needs for this check (``WHEELS``; read
by ``scripts/gpu_wheels.sh``) and exit; this mode imports nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The packages this check imports that a bare CUDA image with torch, transformers 5.17, accelerate, peft, numpy,
# pandas, pyarrow, tokenizers, safetensors, huggingface_hub, tqdm, xxhash, fsspec and pytest lacks: TRL and
# datasets at the versions pyproject.toml pins, and the dependencies of theirs such an image does not hold
# (datasets' dill and multiprocess, at the versions the CPU environment resolves). scripts/gpu_wheels.sh downloads
# exactly these; tests/test_gpu_check.py checks them against pyproject.toml and each package's Requires-Dist.
WHEELS = {"trl": "1.16.0", "datasets": "5.2.0", "dill": "0.4.1", "multiprocess": "0.70.19"}
# What the bare image is taken to hold already (the Requires-Dist of WHEELS not in WHEELS must be among these).
BARE_IMAGE = ("accelerate", "filelock", "fsspec", "huggingface-hub", "jinja2", "numpy", "packaging", "pandas",
              "psutil", "pyarrow", "pyyaml", "tqdm", "transformers", "xxhash", "torch", "tokenizers", "safetensors",
              "peft", "pytest", "requests", "httpx", "regex")
GPU_TEST_FILES = ("tests/test_gpu.py",)

SIZES = {
    # a ~300M-parameter Qwen3 (24 layers of width 1024), batches a GPU does in seconds
    "gpu": dict(hidden=1024, layers=24, heads=16, kv_heads=8, intermediate=3072, vocab=1024,
                sft_samples=1280, sft_batch=32, sft_lr=3e-4, sft_max_length=256,
                lp_rows=8, lp_length=512, lp_keep=384,
                rl_prompts=16, rl_mini=8, rl_generations=8, rl_completion=128, rl_rollouts=2, rl_lr=1e-5),
    # the same path at the smallest sizes that still exercise it
    "cpu": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=300,
                sft_samples=24, sft_batch=8, sft_lr=3e-3, sft_max_length=128,
                lp_rows=4, lp_length=24, lp_keep=12,
                rl_prompts=2, rl_mini=1, rl_generations=4, rl_completion=8, rl_rollouts=1, rl_lr=1e-3),
}
TOL = {"logprob_fp32": 1e-4, "grad_fp32": 1e-4, "logprob_bf16": 1e-3, "grad_bf16": 2e-2}
ERC = (0.8, 1.2)


class Skip(Exception):
    """A stage that cannot run here, with the reason."""


class Check:
    """The run's record: one entry per stage, written to ``<out>/gpu_check.json`` after every stage."""

    def __init__(self, out: Path, device: str, budget_s: float):
        self.out, self.device, self.budget_s = out, device, budget_s
        self.clock = time.perf_counter()
        self.report = {"device": device, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "stages": {}}
        self.cuda = device == "cuda"

    def elapsed(self) -> float:
        return time.perf_counter() - self.clock

    def write(self) -> None:
        self.report["seconds"] = round(self.elapsed(), 2)
        stages = self.report["stages"].values()
        self.report["ok"] = all(s["status"] in ("passed", "skipped") for s in stages)
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.report, indent=2, default=str) + "\n")  # stages in run order
        os.replace(tmp, self.out / "gpu_check.json")

    def peak_mib(self) -> float:
        import resource

        import torch

        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    def stage(self, name: str, fn, *args) -> dict:
        """Run one stage: ``fn(rec, *args)`` appends checks and metrics to ``rec``; whatever it raises is recorded,
        and the next stage runs."""
        import torch

        rec = {"status": "running", "checks": [], "metrics": {}, "error": None, "reason": None}
        self.report["stages"][name] = rec
        print(f"[{self.elapsed():6.1f}s] {name} ...", flush=True)
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            if self.elapsed() > self.budget_s:
                raise Skip(f"the time budget of {self.budget_s:.0f}s was spent before this stage")
            fn(rec, *args)
            ok = bool(rec["checks"]) and all(c["ok"] for c in rec["checks"])
            rec["status"] = "passed" if ok else "failed"
        except Skip as why:
            rec["status"], rec["reason"] = "skipped", str(why)
        except Exception as err:  # recorded; the other stages still run
            rec["status"] = "failed"
            rec["error"] = f"{type(err).__name__}: {err}"
            rec["traceback"] = traceback.format_exc()[-4000:]
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        rec["peak_memory_mib"] = round(self.peak_mib(), 1)
        rec["memory_kind"] = "cuda max_memory_allocated in the stage" if self.cuda else "process peak RSS so far"
        busy = rec.get("tokens_seconds") or rec["seconds"]  # the stage's own timing of its work, where it has one
        if rec.get("tokens") is not None and busy > 0:
            rec["tokens_per_s"] = round(rec["tokens"] / busy, 1)
        gc.collect()
        failed = [c["name"] for c in rec["checks"] if not c["ok"]]
        print(f"[{self.elapsed():6.1f}s] {name}: {rec['status']}"
              + (f" ({rec['reason']})" if rec["reason"] else "") + (f" {rec['error']}" if rec["error"] else "")
              + (f" failed checks: {failed}" if failed else ""), flush=True)
        self.write()
        return rec


def check(rec: dict, name: str, value, ok: bool, expect: str) -> None:
    """One check of a stage: the value measured, what was expected, whether it holds."""
    if isinstance(value, float):
        value = value if math.isfinite(value) else str(value)
    rec["checks"].append({"name": name, "value": value, "expect": expect, "ok": bool(ok)})


# -- the model -----------------------------------------------------------------------------------------------------
def build_model(work: Path, size: dict, seed: int = 0):
    """The task split, and a Qwen3 of ``size`` with random weights and the package's tokenizer, saved in bf16."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from klear_lib import models, real_models
    from klear_lib.data import tasks

    train, heldout = tasks.make_splits(seed, max(size["sft_samples"], 64), 16)
    tok = models.build_tokenizer(tasks.corpus(train), vocab_size=size["vocab"])
    config = Qwen3Config(
        vocab_size=len(tok), hidden_size=size["hidden"], intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"],
        head_dim=size["hidden"] // size["heads"], max_position_embeddings=2048, tie_word_embeddings=True,
        rope_theta=10000.0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    real_models.align_special_tokens(model, tok)
    path = models.save_model_and_tokenizer(model.to(torch.bfloat16), tok, work / "model")
    return path, train, heldout, models.count_parameters(model)


def stage_environment(rec: dict, check_: Check, size: dict, work: Path, state: dict) -> None:
    import torch

    from klear_lib import runs

    versions = runs.package_versions(("torch", "transformers", "trl", "datasets", "accelerate", "peft", "vllm",
                                      "numpy", "pyarrow", "tokenizers"))
    rec["metrics"].update({"versions": versions, "python": sys.version.split()[0], "torch_cuda": torch.version.cuda})
    if check_.cuda:
        rec["metrics"]["gpu"] = torch.cuda.get_device_name()
        rec["metrics"]["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    check(rec, "device available", check_.device, (not check_.cuda) or torch.cuda.is_available(), "CUDA where asked")
    for name, pin in (("trl", WHEELS["trl"]), ("transformers", "5.17.0")):
        check(rec, f"{name} version", versions.get(name), versions.get(name) == pin, f"== {pin} (the pinned stack)")
    path, train, heldout, n_params = build_model(work, size)
    state.update(path=path, train=train, heldout=heldout)
    rec["metrics"]["parameters"] = n_params
    check(rec, "model built and saved in bf16", n_params, (path / "config.json").exists(), "a saved checkpoint")


# -- SFT --------------------------------------------------------------------------------------------------------------
def _sft_cfg(check_: Check, size: dict, **changes):
    from klear_lib.train.sft import SFTStageConfig

    values = dict(learning_rate=size["sft_lr"], epochs=1.0, batch_size=size["sft_batch"], warmup_ratio=0.05,
                  max_length=size["sft_max_length"], resume=False, use_cpu=not check_.cuda, bf16=check_.cuda)
    return SFTStageConfig(**{**values, **changes})


def _mean_loss(model, tokenizer, rows, device) -> float:
    """Mean next-token loss of ``model`` on the chat rows (prompt and completion), in fp32, no grad."""
    import torch

    text = [tokenizer.apply_chat_template(r["prompt"] + r["completion"], tokenize=False) for r in rows]
    enc = tokenizer(text, return_tensors="pt", padding=True).to(device)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    with torch.no_grad():
        return float(model.to(device)(**enc, labels=labels).loss)


def stage_sft(rec: dict, check_: Check, size: dict, work: Path, state: dict) -> None:
    from klear_lib import models
    from klear_lib.train import sft

    samples = sft.sft_samples(state["train"][: size["sft_samples"]], seed=0)
    device = "cuda" if check_.cuda else "cpu"
    start, tok = models.load_model_and_tokenizer(state["path"])
    before = _mean_loss(start, tok, samples[:16], device)
    del start
    t0 = time.perf_counter()
    model, _ = sft.sft_from(state["path"], samples, work / "sft", _sft_cfg(check_, size))
    rec["tokens_seconds"] = round(time.perf_counter() - t0, 2)  # loading, TRL's tokenization and training
    texts = [tok.apply_chat_template(s["prompt"] + s["completion"], tokenize=False) for s in samples]
    rec["tokens"] = sum(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"])
    rec["tokens_kind"] = "training tokens (prompt + completion) per second of sft_from"
    steps = math.ceil(len(samples) / size["sft_batch"])
    after = _mean_loss(model, tok, samples[:16], device)
    rec["metrics"].update(steps=steps, loss_before=round(before, 4), loss_after=round(after, 4))
    check(rec, "SFT trained on the device", str(next(model.parameters()).device),
          next(model.parameters()).device.type == device, device)
    check(rec, "SFT loss on its samples falls", round(after / before, 4), after < before, "after / before < 1")
    check(rec, "weights fp32 after SFT", str({p.dtype for p in model.parameters()}),
          all(p.dtype.is_floating_point and p.element_size() == 4 for p in model.parameters()), "float32")


def _moved(after, before) -> tuple[float, float]:
    """Share of weights that moved from ``before`` (a bf16 model), and share back at the start once rounded to bf16."""
    import torch

    moved = back = total = 0
    for a, b in zip(after.parameters(), before.parameters()):
        a, b = a.detach().float().cpu(), b.detach().cpu()
        moved += int((a != b.float()).sum())
        back += int((a.to(torch.bfloat16) == b).sum())
        total += a.numel()
    return moved / total, back / total


def stage_master_weights(rec: dict, check_: Check, size: dict, work: Path, state: dict) -> None:
    import torch

    from klear_lib import models
    from klear_lib.train import sft

    samples = sft.sft_samples(state["train"][: size["sft_batch"]], seed=1)
    start, _ = models.load_model_and_tokenizer(state["path"], dtype="auto")
    loaded, _ = sft.load_for_sft(state["path"], bf16=check_.cuda)
    check(rec, "bf16 checkpoint loaded for training as", str(loaded.dtype), loaded.dtype == torch.float32, "float32")
    del loaded
    cfg = _sft_cfg(check_, size, learning_rate=1e-6, warmup_ratio=0.0, bf16=True)  # bf16 autocast on CPU too
    model, _ = sft.sft_from(state["path"], samples, work / "master", cfg)
    moved, back = _moved(model, start)
    rec["metrics"].update(moved_frac=round(moved, 4), back_in_bf16_frac=round(back, 4))
    check(rec, "share of weights one 1e-6 step moved", round(moved, 4), moved > 0.5, "> 0.5")
    check(rec, "share of those updates bf16 would have rounded away", round(back, 4), back > 0.9, "> 0.9")


# -- log-prob backends ------------------------------------------------------------------------------------------------
def _stats_and_grads(model, fn, mask, keep):
    model.zero_grad(set_to_none=True)
    logps, ent = fn()
    m = mask[:, -keep:].float()
    ((logps.float() * m).sum() + 0.5 * (ent.float() * m).sum()).backward()
    import torch

    grad = torch.cat([p.grad.reshape(-1).float() for p in model.parameters() if p.grad is not None])
    return logps.detach().float(), ent.detach().float(), grad


def stage_logprob_backends(rec: dict, check_: Check, size: dict, work: Path, state: dict) -> None:
    import torch

    from klear_lib import models

    device = "cuda" if check_.cuda else "cpu"
    model, _ = models.load_model_and_tokenizer(state["path"])
    model.to(device)
    T = 0.9
    rows, length, keep = size["lp_rows"], size["lp_length"], size["lp_keep"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (rows, length), generator=g).to(device)
    mask = torch.ones_like(ids)
    mask[0, : length // 4] = 0  # a left-padded prompt
    mask[1, -keep // 3:] = 0  # a completion that ended early
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    rec["tokens"] = 0
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here (TF32 would round both heads to 1e-3)
    try:
        for mode in ("fp32", "bf16"):
            _compare_backends(rec, model, ids, mask, labels, keep, T, device, mode)
            rec["tokens"] += 2 * rows * length
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    rec["tokens_kind"] = "tokens through forward and backward per second, both backends, fp32 and bf16"


def _compare_backends(rec, model, ids, mask, labels, keep, T, device, mode) -> None:
    """klear against TRL's fused head on one batch, without autocast (``fp32``) or under bf16 autocast."""
    import torch
    from trl.trainer.utils import add_fused_lm_head

    from klear_lib.train.token_stats import klear_token_stats

    valid = mask[:, -keep:].bool()

    def autocast():
        return torch.autocast(device, dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext()

    # TRL's fused head, as GRPOTrainer adds it (with the head in fp32, as the klear backend computes it)
    add_fused_lm_head(model, temperature=T, cast_lm_head_to_fp32=True, outputs=("log_probs", "entropy"))

    def trl_head():
        with autocast():
            out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        return out.log_probs[:, -keep:], out.entropy[:, -keep:]

    def klear_head():
        lp, ent, _ = klear_token_stats(model, ids, mask, keep, temperature=T, autocast=autocast)
        return lp, ent

    t0 = time.perf_counter()
    lp_t, ent_t, g_t = _stats_and_grads(model, trl_head, mask, keep)
    t1 = time.perf_counter()
    lp_k, ent_k, g_k = _stats_and_grads(model, klear_head, mask, keep)
    t2 = time.perf_counter()
    model.__dict__.pop("forward", None)  # TRL's patch off again
    rec["metrics"][f"{mode}_trl_seconds"] = round(t1 - t0, 3)
    rec["metrics"][f"{mode}_klear_seconds"] = round(t2 - t1, 3)
    d_lp = float((lp_k - lp_t)[valid].abs().max())
    d_ent = float((ent_k - ent_t)[valid].abs().max())
    d_g = float((g_k - g_t).norm() / g_t.norm().clamp(min=1e-12))
    tol_v, tol_g = TOL[f"logprob_{mode}"], TOL[f"grad_{mode}"]
    check(rec, f"{mode}: log-prob |klear - TRL| max", d_lp, d_lp <= tol_v, f"<= {tol_v}")
    check(rec, f"{mode}: entropy |klear - TRL| max", d_ent, d_ent <= tol_v, f"<= {tol_v}")
    check(rec, f"{mode}: gradient ||klear - TRL|| / ||TRL||", d_g, d_g <= tol_g, f"<= {tol_g}")
    padded = bool((lp_k[~valid] == 0).all() and (ent_k[~valid] == 0).all())
    check(rec, f"{mode}: padding scores 0", padded, padded, "True")


# -- RL ---------------------------------------------------------------------------------------------------------------
def stage_rl(rec: dict, check_: Check, size: dict, work: Path, state: dict, use_vllm: bool) -> None:
    import torch

    from klear_lib import models, runs
    from klear_lib.config import RLExperimentConfig
    from klear_lib.data import tasks
    from klear_lib.train.rl_run import run_rl

    if use_vllm:
        if not check_.cuda:
            raise Skip("--cpu: vLLM colocate rollouts need a GPU")
        if importlib.util.find_spec("vllm") is None:
            raise Skip("vLLM is not installed (pip install -e '.[gpu]' installs it)")
    generated = []

    def even_length(completions, completion_ids=None, **kw) -> list[float]:
        generated.append(sum(len(c) for c in completion_ids) if completion_ids is not None else 0)
        return [1.0 if len(c[-1]["content"]) % 2 == 0 else 0.0 for c in completions]

    s = size
    cfg = RLExperimentConfig(
        model=str(state["path"]), loss_name="gppo", erc_low=ERC[0], erc_high=ERC[1], sft_alpha=0.1,
        filter_groups=True, filter_rule="klear", oversample_factor=2.0, rollouts=s["rl_rollouts"],
        rollout_prompts=s["rl_prompts"], mini_batch_prompts=s["rl_mini"], num_generations=s["rl_generations"],
        max_completion_length=s["rl_completion"], rl_lr=s["rl_lr"], warmup_steps=0, weight_decay=0.0,
        temperature=1.0, eval_every=10**6, use_cpu=not check_.cuda, bf16=check_.cuda, use_vllm=use_vllm,
        vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, gradient_checkpointing=check_.cuda)
    rows = [{"prompt": tasks.prompt_messages(p), "answer": p.answer} for p in state["train"]]
    runs.set_seed(0)
    model, tok = models.load_model_and_tokenizer(state["path"])
    start, _ = models.load_model_and_tokenizer(state["path"], dtype="auto")
    name = "rl_vllm" if use_vllm else "rl_hf"
    with runs.MetricsWriter(work / name / "metrics.jsonl") as writer:
        model, _ = run_rl(cfg, model, tok, [], [], writer, tags={"variant": name}, rows=rows,
                          reward_funcs=[even_length], evaluate=lambda m: {"avg_at_n": 0.0, "n": 0},
                          output_dir=str(work / name / "trainer"), progress=lambda m: None)
    records = runs.read_metrics(work / name / "metrics.jsonl")
    steps = [r for r in records if "actor/pg_loss" in r]
    rollouts = [r for r in records if "klear/kept_groups" in r]
    rec["tokens"] = sum(generated)
    rec["tokens_kind"] = "completion tokens generated per second of the stage (generation, scoring and training)"
    planned = sum(int(r["klear/updates_this_rollout"]) for r in rollouts)
    kept = [int(r["klear/kept_groups"]) for r in rollouts]
    rec["metrics"].update(
        steps=len(steps), kept_groups=kept, generated_groups=[int(r["klear/generated_groups"]) for r in rollouts],
        erc_stopped_frac=[round(r["actor/erc_frac_low"] + r["actor/erc_frac_high"], 4) for r in steps],
        ratio_max=[round(r["actor/ratio_max"], 4) for r in steps],
        positive_loss=[round(r["actor/positive_loss"], 4) for r in steps], generated_tokens=sum(generated))
    check(rec, "rollouts run", len(rollouts), len(rollouts) == cfg.rollouts, f"== {cfg.rollouts}")
    check(rec, "generated 2x the target groups each rollout", rec["metrics"]["generated_groups"],
          all(g == 2 * cfg.rollout_prompts for g in rec["metrics"]["generated_groups"]), f"{2 * cfg.rollout_prompts}")
    check(rec, "kept groups within the target, some kept", kept,
          all(k <= cfg.rollout_prompts for k in kept) and sum(kept) > 0, f"1..{cfg.rollout_prompts} in total")
    check(rec, "one optimizer step per kept mini-batch", len(steps), len(steps) == planned and planned > 0,
          f"== {planned}")
    finite = all(math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["actor/positive_loss"]) for r in steps)
    check(rec, "policy and positive-sample losses finite", finite, finite, "True")
    first = steps[0]["actor/ratio_max"] if steps else float("nan")
    check(rec, "first step of a rollout on-policy: ratio max", first, abs(first - 1.0) <= 2e-2, "1 ± 0.02")
    on_device = next(model.parameters()).device.type == ("cuda" if check_.cuda else "cpu")
    check(rec, "trained on the device", str(next(model.parameters()).device), on_device, "the check's device")
    fp32 = all(p.dtype == torch.float32 for p in model.parameters())
    check(rec, "weights fp32 after RL (bf16 checkpoint)", fp32, fp32, "True")
    moved, _ = _moved(model, start)
    rec["metrics"]["moved_frac"] = round(moved, 4)
    check(rec, "RL moved the weights", round(moved, 4), moved > 0.1, "> 0.1 of the weights")


# -- the gpu-marked tests ---------------------------------------------------------------------------------------------
def stage_gpu_tests(rec: dict, check_: Check, size: dict, work: Path, state: dict) -> None:
    import subprocess
    import xml.etree.ElementTree as ET

    junit = work / "gpu_tests.xml"
    remaining = max(60.0, check_.budget_s + 100 - check_.elapsed())
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs",
           f"--junitxml={junit}", *GPU_TEST_FILES]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=remaining)
    rec["metrics"]["command"] = " ".join(cmd[1:])
    rec["metrics"]["output_tail"] = (proc.stdout + proc.stderr)[-3000:]
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    cases = []
    for case in suite.iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        reason = next((c.get("message", "") for c in case if c.tag in ("failure", "error", "skipped")), "")
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "reason": reason[:300]})
    rec["metrics"].update(counts=counts, cases=cases)
    check(rec, "pytest exit status", proc.returncode, proc.returncode == 0, "0")
    check(rec, "gpu tests collected", counts["tests"], counts["tests"] > 0, "> 0")
    check(rec, "failures + errors", counts["failures"] + counts["errors"],
          counts["failures"] + counts["errors"] == 0, "0")
    if check_.cuda:
        ran = counts["tests"] - counts["skipped"]
        check(rec, "gpu tests that ran on the GPU", ran, ran > 0, "> 0")


# vLLM last: its engine start is the slowest and least predictable step, and every stage before it is saved
STAGES = ("environment", "sft", "fp32_master_weights", "logprob_backends", "rl_hf", "gpu_tests", "rl_vllm")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the same path on the CPU at tiny sizes (seconds)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "outputs/gpu_check",
                    help="folder of gpu_check.json (default $OUT, else outputs/gpu_check)")
    ap.add_argument("--work", default=None, help="folder for the models and trainer files (default: a temp folder)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="a stage that would start after this many seconds is skipped (default 420: the whole "
                         "check ends within 10 minutes)")
    ap.add_argument("--only", default="", help=f"comma-separated stages to run (default all: {','.join(STAGES)})")
    ap.add_argument("--wheels", action="store_true", help="print the wheels a bare CUDA image needs and exit")
    args = ap.parse_args(argv)
    if args.wheels:
        print("\n".join(f"{k}=={v}" for k, v in WHEELS.items()))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: torch {torch.__version__} sees no CUDA device; run with --cpu for the CPU path",
              file=sys.stderr)
        return 2
    only = [s for s in args.only.split(",") if s] or list(STAGES)
    unknown = sorted(set(only) - set(STAGES))
    if unknown:
        print(f"gpu_check: unknown stage(s) {unknown}; stages: {', '.join(STAGES)}", file=sys.stderr)
        return 2
    size = SIZES[device]
    run = Check(Path(args.out), device, args.budget_s)
    run.report["sizes"] = size
    cleanup = contextlib.ExitStack()
    work = Path(args.work) if args.work else Path(cleanup.enter_context(tempfile.TemporaryDirectory(
        prefix="klear-gpu-check-")))
    state: dict = {}
    with cleanup:
        # the model every other stage starts from is built by `environment`: it always runs
        env = run.stage("environment", stage_environment, run, size, work, state)
        fns = {"sft": stage_sft, "fp32_master_weights": stage_master_weights,
               "logprob_backends": stage_logprob_backends, "gpu_tests": stage_gpu_tests,
               "rl_hf": lambda rec, *a: stage_rl(rec, *a, False), "rl_vllm": lambda rec, *a: stage_rl(rec, *a, True)}
        for name in STAGES[1:]:
            if name not in only:
                continue
            if "path" not in state and name != "gpu_tests":
                run.report["stages"][name] = {"status": "failed", "error": f"no model: environment {env['status']}",
                                              "checks": [], "metrics": {}, "reason": None}
                continue
            run.stage(name, fns[name], run, size, work, state)
    run.write()
    width = max(len(n) for n in run.report["stages"])
    print(f"\n{'stage':<{width}}  status   seconds  tokens/s  peak MiB")
    for name, rec in run.report["stages"].items():
        print(f"{name:<{width}}  {rec['status']:<7}  {rec.get('seconds', 0):7.1f}  "
              f"{rec.get('tokens_per_s', 0) or 0:8.0f}  {rec.get('peak_memory_mib', 0):8.0f}"
              + (f"  {rec.get('reason') or rec.get('error') or ''}"))
    print(f"gpu_check: {'ok' if run.report['ok'] else 'FAILED'} in {run.elapsed():.0f}s -> "
          f"{Path(args.out) / 'gpu_check.json'}")
    return 0 if run.report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
