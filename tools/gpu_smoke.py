"""GPU smoke check: the tiny model through SFT and GPPO+ERC RL on CUDA, checked against the CPU.

Run by ``scripts/gpu_smoke.sh`` on a GPU machine without network (builds everything locally; < 5 minutes):

1. the tiny tokenizer and model, built here (no hub);
2. SFT on the synthetic teacher on the device (bf16 autocast on CUDA);
3. agreement on one fixed batch of the SFT model's inputs: per-token log-probs and entropies from
   ``klear_lib.logprobs`` (chunked, no (B, T, V) logits) on the device against the full-logits computation on
   the CPU in float32, and the GPPO+ERC loss and its gradient on the device against the CPU;
4. a few GPPO+ERC RL steps through ``KlearGRPOTrainer`` on the device, with vLLM rollouts (colocate) when vLLM
   is installed, logging the ERC-stopped share and peak memory.

Prints one table (check, value, tolerance, ok), writes ``<out>/gpu_smoke.json``, exits 1 if a check fails.
``--device cpu`` runs the same path on the CPU (what tests/test_gpu_smoke.py does, to keep the script working).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import torch

from klear_lib import losses, models, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.logprobs import naive_logprobs_and_entropy, token_logprobs_and_entropy
from klear_lib.train.rl import run_rl
from klear_lib.train.sft import arithmetic_warm_start

TOL = {"logprob": 2e-4, "entropy": 2e-4, "loss": 1e-4, "grad": 1e-3}


def fixed_batch(tokenizer, problems, n: int = 8):
    """(input_ids (n, L), labels (n, L) with -100 outside the response): prompts and teacher responses."""
    import random

    rng = random.Random(0)
    ids, labels = [], []
    for p in problems[:n]:
        prompt = tokenizer.apply_chat_template(tasks.prompt_messages(p), tokenize=False, add_generation_prompt=True)
        a = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        b = tokenizer(tasks.teacher_solution(p, rng) + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        ids.append(a + b)
        labels.append([-100] * len(a) + b)
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
    labels = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
    return ids, labels


def stats(model, ids, labels, *, chunked: bool):
    """Per-token (log-prob, entropy) of the labels (shifted by one), each (n, L-1)."""
    hidden = model.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[:, :-1]
    y = labels[:, 1:]
    fn = token_logprobs_and_entropy if chunked else naive_logprobs_and_entropy
    return fn(hidden, model.lm_head.weight, y)


def loss_and_grad(model, ids, labels, old_lp, old_ent, adv, cfg):
    """GPPO+ERC loss of the model on the fixed batch, and the flat gradient of its parameters."""
    model.zero_grad(set_to_none=True)
    lp, ent = stats(model, ids, labels, chunked=True)
    mask = labels[:, 1:] != -100
    loss, metrics = losses.gppo_loss(old_lp, lp, adv, mask, "token-mean", cfg, entropy=ent, old_entropy=old_ent)
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1).float().cpu() for p in model.parameters() if p.grad is not None])
    return float(loss.detach()), grad, metrics


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--out", default="outputs/gpu_smoke", help="where the models and gpu_smoke.json go")
    ap.add_argument("--rl-steps", type=int, default=8, help="RL optimizer steps (default 8)")
    ap.add_argument("--sft-samples", type=int, default=6000, help="SFT samples (default 6000, two epochs)")
    ap.add_argument("--vllm", choices=("auto", "on", "off"), default="auto", help="vLLM rollouts (auto: if installed)")
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu, or on a GPU machine", file=sys.stderr)
        return 2
    use_vllm = args.vllm == "on" or (args.vllm == "auto" and cuda and importlib.util.find_spec("vllm") is not None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, clock = [], time.perf_counter()

    def check(name, value, tol=None, ok=True):
        """One table row: within ``tol`` when a tolerance is given, else ``ok`` as computed by the caller."""
        passed = value <= tol if tol is not None else bool(ok)
        rows.append({"check": name, "value": value, "tolerance": tol, "ok": passed})

    # 1-2. SFT on the device
    cfg = RLExperimentConfig(model="tiny", n_train=args.sft_samples, n_heldout=32, sft_epochs=2.0, sft_batch_size=32,
                             rollouts=max(1, args.rl_steps // 2), rollout_prompts=8, mini_batch_prompts=4,
                             num_generations=4, max_completion_length=56, eval_every=1, eval_n=2,
                             loss_name="gppo", erc_low=0.8, erc_high=1.2, use_cpu=not cuda, bf16=cuda,
                             use_vllm=use_vllm,
                             filter_groups=False)  # a short SFT answers little: train on every group (plumbing)
    runs.set_seed(0)
    ws = arithmetic_warm_start(cfg, out / "sft", progress=lambda m: print(m, flush=True))
    check("SFT held-out avg@2 (T 1.0; ~0.5 expected at 6000 samples)", round(ws.start["avg_at_n"], 4), ok=True)

    # 3. agreement on a fixed batch: device (chunked) vs CPU float32 (full logits)
    cpu_model, tok = models.load_model_and_tokenizer(ws.sft_dir, dtype=torch.float32)
    dev_model, _ = models.load_model_and_tokenizer(ws.sft_dir, dtype=torch.float32)
    dev_model.to(args.device)
    ids, labels = fixed_batch(tok, ws.heldout)
    with torch.no_grad():
        lp_ref, ent_ref = stats(cpu_model, ids, labels, chunked=False)
        lp_dev, ent_dev = stats(dev_model, ids.to(args.device), labels.to(args.device), chunked=True)
    mask = labels[:, 1:] != -100
    check("log-prob |device chunked - CPU full logits| max", float((lp_dev.cpu() - lp_ref)[mask].abs().max()),
          TOL["logprob"])
    check("entropy |device chunked - CPU full logits| max", float((ent_dev.cpu() - ent_ref)[mask].abs().max()),
          TOL["entropy"])
    g = torch.Generator().manual_seed(0)
    old_lp = lp_ref + 0.3 * torch.randn(lp_ref.shape, generator=g)  # an off-policy rollout policy
    old_ent = ent_ref * (0.7 + 0.6 * torch.rand(ent_ref.shape, generator=g))  # ρ on both sides of (0.8, 1.2)
    adv = torch.randn(ids.shape[0], 1, generator=g).expand_as(lp_ref).contiguous()
    lcfg = cfg.klear_loss.policy_loss
    l_cpu, g_cpu, m_cpu = loss_and_grad(cpu_model, ids, labels, old_lp, old_ent, adv, lcfg)
    d = args.device
    l_dev, g_dev, m_dev = loss_and_grad(dev_model, ids.to(d), labels.to(d), old_lp.to(d), old_ent.to(d), adv.to(d),
                                        lcfg)
    check("GPPO+ERC loss |device - CPU|", abs(l_dev - l_cpu), TOL["loss"])
    check("GPPO+ERC grad ‖device - CPU‖ / ‖CPU‖", float((g_dev - g_cpu).norm() / g_cpu.norm().clamp(min=1e-12)),
          TOL["grad"])
    erc = m_cpu["actor/erc_frac_low"] + m_cpu["actor/erc_frac_high"]
    check("ERC-stopped share, device = CPU", round(erc, 4),
          ok=erc > 0 and abs(erc - m_dev["actor/erc_frac_low"] - m_dev["actor/erc_frac_high"]) < 1e-6)
    del cpu_model, dev_model

    # 4. RL steps on the device
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    runs.set_seed(0)
    model, tok = models.load_model_and_tokenizer(ws.sft_dir, dtype=torch.float32)
    t0 = time.perf_counter()
    with runs.MetricsWriter(out / "metrics.jsonl") as writer:
        run_rl(cfg, model, tok, ws.train, ws.heldout, writer, tags={"variant": "gppo_erc"},
               output_dir=str(out / "rl"), progress=lambda m: print(m, flush=True))
    steps = [r for r in runs.read_metrics(out / "metrics.jsonl") if "actor/pg_loss" in r]
    check("RL steps run", len(steps), ok=len(steps) == cfg.max_steps)
    check("RL pg_loss finite on every step", all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in steps),
          ok=all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in steps))
    check("RL on the device", next(model.parameters()).device.type, ok=(next(model.parameters()).device.type == "cuda")
          == cuda)
    check("RL rollouts by vLLM", use_vllm, ok=True)
    erc_rl = [r.get("actor/erc_frac_low", 0) + r.get("actor/erc_frac_high", 0) for r in steps]
    check("RL mean ERC-stopped share", round(sum(erc_rl) / max(len(erc_rl), 1), 4), ok=True)
    check("RL seconds per step", round((time.perf_counter() - t0) / max(len(steps), 1), 3), ok=True)
    if cuda:
        check("peak GPU memory (GiB)", round(torch.cuda.max_memory_allocated() / 2**30, 3), ok=True)

    width = max(len(r["check"]) for r in rows)
    print(f"\n{'check':<{width}}  {'value':>12}  {'tolerance':>9}  ok")
    for r in rows:
        tol = "" if r["tolerance"] is None else f"{r['tolerance']:.0e}"
        v = r["value"]
        v = f"{v:.3e}" if isinstance(v, float) and r["tolerance"] is not None else str(v)
        print(f"{r['check']:<{width}}  {v:>12}  {tol:>9}  {'ok' if r['ok'] else 'FAIL'}")
    total = time.perf_counter() - clock
    print(f"device {args.device} ({torch.cuda.get_device_name() if cuda else 'cpu'}), torch {torch.__version__}, "
          f"{total:.0f}s")
    (out / "gpu_smoke.json").write_text(runs.to_json_text({"device": args.device, "seconds": total, "rows": rows},
                                                          indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
