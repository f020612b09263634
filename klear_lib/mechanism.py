"""The clip variants' mechanism, isolated: their gradient coefficients, and a policy that is only fork tokens.

``gradient_coefficients`` computes, by autograd through ``klear_lib.losses``, the coefficient F of each loss's
per-token gradient ``-F·A·∇log π`` at a grid of ratios r, for A > 0 and A < 0 (reference §1's table, measured
from the code rather than drawn by hand).

``simulate_forks`` trains a softmax policy over ``forks`` independent binary choices (a table of logits, right
with probability ``p0`` at the start; the reward is 1 when every choice is right) with GRPO advantages, Adam and
each registered loss, ``updates`` optimizer steps per rollout (one group of ``group`` samples per step; a group
whose rewards all agree is skipped, as the trainer's dynamic sampling skips it). Every seed is run at once
(a batch of independent policies) from its own start and sampling stream, so that a loss sees the same first
rollout as every other loss at that seed: with one update per rollout the ratio is 1 and every loss must give
the same trajectory (the built-in control). It runs in seconds, so the dose-response of each loss's advantage
over PPO-clip in updates per rollout and learning rate can be measured over many seeds.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from klear_lib.advantages import grpo_advantages
from klear_lib.losses import PolicyLossConfig, compute_policy_loss

# The clip-variant arms of notebook 03: name -> (registered loss, its config)
CLIP_ARMS = {
    "ppo_clip": ("ppo_clip", PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28)),
    "cispo": ("cispo", PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28)),
    "gppo": ("gppo", PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28)),
    "gppo_beta_low_0.5": ("gppo", PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, beta_low=0.5)),
}


def gradient_coefficients(arms: dict, ratios) -> pd.DataFrame:
    """F(r) of each arm (name -> (loss name, PolicyLossConfig)) at ``ratios``, for A = +1 and A = -1.

    One token per row, aggregated as ``seq-mean-token-sum`` (each row weighs 1/N), so the gradient of the loss
    with respect to that token's log π is ``-F·A/N``: F = -N·grad/A. Returns columns arm, A, r, F."""
    r = torch.as_tensor(ratios, dtype=torch.float64).reshape(-1, 1)  # (N, 1)
    n = r.shape[0]
    rows = []
    for name, (loss_name, cfg) in arms.items():
        for sign in (1.0, -1.0):
            log_prob = torch.log(r).clone().requires_grad_(True)  # old log-prob 0, so the ratio is r
            loss, _ = compute_policy_loss(loss_name, old_log_prob=torch.zeros_like(log_prob), log_prob=log_prob,
                                          advantages=torch.full((n,), sign, dtype=torch.float64),
                                          response_mask=torch.ones_like(log_prob), loss_agg_mode="seq-mean-token-sum",
                                          config=cfg)
            (grad,) = torch.autograd.grad(loss, log_prob)
            coef = (-n * grad / sign).flatten()
            rows += [{"arm": name, "A": int(sign), "r": float(x), "F": float(f)} for x, f in zip(r.flatten(), coef)]
    return pd.DataFrame(rows)


def _adam_step(params, grad, state, lr, active, betas=(0.9, 0.999), eps=1e-8) -> None:
    """Adam on a batch of independent policies (dim 0 = seed); only the ``active`` seeds (S,) bool take a step."""
    m, v, t = state
    a = active.view(-1, *([1] * (params.dim() - 1))).to(params.dtype)
    t += active.to(t.dtype)
    m.mul_(1 - a * (1 - betas[0])).add_(a * (1 - betas[0]) * grad)
    v.mul_(1 - a * (1 - betas[1])).add_(a * (1 - betas[1]) * grad * grad)
    tt = t.clamp(min=1).view(-1, *([1] * (params.dim() - 1)))
    m_hat = m / (1 - betas[0] ** tt)
    v_hat = v / (1 - betas[1] ** tt)
    params.sub_(a * lr * m_hat / (v_hat.sqrt() + eps))


def simulate_forks(arm: str, *, updates: int, lr: float, seeds: int = 20, forks: int = 2, group: int = 8,
                   groups: int = 128, p0: float = 0.2, arms: dict | None = None, seed: int = 0) -> pd.DataFrame:
    """Train ``seeds`` independent fork policies with ``arm`` (see the module docstring) on ``groups`` groups in all
    (``groups / updates`` rollouts of ``updates`` mini-batches of one group each). Returns one row per seed and
    rollout boundary: seed, rollout, groups_seen, p_all (the exact probability that every fork is right),
    steps (optimizer steps taken by that seed), clip_frac (mean over its steps of the loss's clipped fraction,
    low + high)."""
    arms = arms or CLIP_ARMS
    loss_name, cfg = arms[arm]
    if groups % updates:
        raise ValueError(f"groups={groups} must be a multiple of updates={updates}")
    gen = torch.Generator().manual_seed(seed)
    logit0 = math.log(p0 / (1 - p0))
    theta = torch.full((seeds, forks), logit0, dtype=torch.float64)  # logit of "right" at each fork
    state = (torch.zeros_like(theta), torch.zeros_like(theta), torch.zeros(seeds, dtype=torch.float64))
    steps = torch.zeros(seeds)
    clip_sum = torch.zeros(seeds)
    rows = []

    def record(rollout: int) -> None:
        p_all = torch.sigmoid(theta).prod(dim=1)
        for s in range(seeds):
            rows.append({"seed": s, "rollout": rollout, "groups_seen": rollout * updates, "p_all": float(p_all[s]),
                         "steps": int(steps[s]), "clip_frac": float(clip_sum[s] / steps[s]) if steps[s] else 0.0})

    record(0)
    for rollout in range(1, groups // updates + 1):
        old = theta.clone()
        # the rollout: `updates` groups sampled from the old policy, one uniform draw per (seed, group, sample, fork)
        draws = torch.rand((seeds, updates, group, forks), generator=gen, dtype=torch.float64)
        right = draws < torch.sigmoid(old).unsqueeze(1).unsqueeze(1)  # (S, U, G, F)
        reward = right.all(dim=-1).to(torch.float64)  # (S, U, G)
        for u in range(updates):
            r_u = reward[:, u]  # (S, G)
            active = r_u.amax(dim=1) != r_u.amin(dim=1)  # (S,) a group with signal
            if not bool(active.any()):
                continue
            adv = grpo_advantages(r_u.reshape(-1), group).reshape(seeds, group)  # (S, G)
            x = right[:, u].to(torch.float64)  # (S, G, F)
            theta_req = theta.clone().requires_grad_(True)
            # log π(choice) = choice·log σ(θ) + (1 - choice)·log σ(-θ), per fork
            logp = x * torch.nn.functional.logsigmoid(theta_req).unsqueeze(1) + \
                (1 - x) * torch.nn.functional.logsigmoid(-theta_req).unsqueeze(1)  # (S, G, F)
            old_logp = (x * torch.nn.functional.logsigmoid(old).unsqueeze(1) +
                        (1 - x) * torch.nn.functional.logsigmoid(-old).unsqueeze(1))
            mask = active.view(-1, 1, 1).expand_as(logp).to(torch.float64)  # inactive seeds contribute nothing
            loss, metrics = compute_policy_loss(loss_name, old_log_prob=old_logp.reshape(seeds * group, forks),
                                                log_prob=logp.reshape(seeds * group, forks),
                                                advantages=adv.reshape(-1),
                                                response_mask=mask.reshape(seeds * group, forks),
                                                config=cfg)
            # token-mean over the active seeds' tokens: scale back so each seed's gradient is its own token-mean
            (grad,) = torch.autograd.grad(loss * int(active.sum()), theta_req)
            _adam_step(theta, grad, state, lr, active)
            steps += active.to(steps.dtype)
            with torch.no_grad():  # per-seed clipped fraction of this step (ratios of the sampled choices)
                ratio = torch.exp(logp.detach() - old_logp)  # (S, G, F)
                a = adv.unsqueeze(-1).expand_as(ratio)
                clipped = ((a > 0) & (ratio > 1 + cfg.clip_ratio_high)) | ((a < 0) & (ratio < 1 - cfg.clip_ratio_low))
                clip_sum += active.to(clip_sum.dtype) * clipped.to(torch.float64).mean(dim=(1, 2)).to(clip_sum.dtype)
        record(rollout)
    return pd.DataFrame(rows)


def dose_response(*, updates=(1, 2, 4, 8, 16), lrs=(0.02, 0.05, 0.1), arms: dict | None = None, seeds: int = 20,
                  groups: int = 128, **kw) -> pd.DataFrame:
    """``simulate_forks`` for every arm × updates × lr; one row per arm, updates, lr, seed with the final
    p_all, its area under the curve over groups seen (mean level), and the mean clipped fraction."""
    from klear_lib.claims import area_under_curve

    arms = arms or CLIP_ARMS
    out = []
    for u in updates:
        for lr in lrs:
            for arm in arms:
                df = simulate_forks(arm, updates=u, lr=lr, seeds=seeds, groups=groups, arms=arms, **kw)
                for s, g in df.groupby("seed"):
                    out.append({"arm": arm, "updates": u, "lr": lr, "seed": s, "final_p_all": g["p_all"].iloc[-1],
                                "auc_p_all": area_under_curve(g["groups_seen"], g["p_all"]),
                                "clip_frac": g["clip_frac"].iloc[-1]})
    return pd.DataFrame(out)


# -- ERC's noise floor: how much of "ERC stops ~20% of tokens" can recomputation noise be? ---------------------
@torch.no_grad()
def erc_noise_floor(model, tokenizer, prompts, *, n: int = 4, temperature: float = 1.0, max_new_tokens: int = 56,
                    bounds=((0.8, 1.2), (0.95, 1.05)), seed: int = 0) -> pd.DataFrame:
    """On one on-policy batch (``n`` completions of each chat prompt in ``prompts``, sampled from ``model``), the
    fraction of response tokens that ERC with each of ``bounds`` would stop although the policy did not move: the
    current entropies H from an fp32 pass, the "old" ones from (a) the same fp32 pass, (b) an fp32 pass chunked
    differently (7 tokens a chunk), (c) a bf16 pass (backbone under bf16 autocast, hidden states and LM-head weight
    rounded to bf16, as a bf16 inference engine computes them). Returns one row per old-entropy source, bound and
    old-entropy bucket (``losses.ENTROPY_BUCKETS``, on the fp32 entropies) with the stopped fraction and the
    bucket's share of tokens. The exact fp32 path of this project has no such noise: only (c) should be non-zero.
    """
    from klear_lib.logprobs import IGNORE_INDEX, token_logprobs_and_entropy
    from klear_lib.losses import ENTROPY_BUCKETS, ENTROPY_EPS
    from klear_lib.rollout import generate

    torch.manual_seed(seed)
    texts = generate(model, tokenizer, prompts, n=n, temperature=temperature, top_p=1.0,
                     max_new_tokens=max_new_tokens)
    heads = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    full = [h + c + tokenizer.eos_token for h, cs in zip(heads, texts) for c in cs]
    starts = [len(tokenizer(h, add_special_tokens=False)["input_ids"]) for h in heads for _ in range(n)]
    enc = tokenizer(full, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, att = enc["input_ids"], enc["attention_mask"]  # (B, L), left padding
    pad = (att == 0).sum(dim=1)  # (B,)
    pos = torch.arange(ids.shape[1]).unsqueeze(0)  # (1, L)
    response = (pos >= (pad + torch.tensor(starts)).unsqueeze(1)) & (att == 1)  # (B, L) the completion's tokens
    labels = ids[:, 1:].masked_fill(~response[:, 1:], IGNORE_INDEX)  # (B, L-1): the token each position predicts
    backbone = getattr(model, model.base_model_prefix)
    weight = model.get_output_embeddings().weight

    def entropies(*, chunk=None, bf16=False):
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False)
        with ctx:
            hidden = backbone(input_ids=ids, attention_mask=att).last_hidden_state[:, :-1]  # (B, L-1, H)
        h, w = hidden, weight
        if bf16:
            h, w = h.to(torch.bfloat16).float(), w.to(torch.bfloat16).float()
        _, ent = token_logprobs_and_entropy(h.float(), w.float(), labels, temperature=temperature, chunk_size=chunk)
        return ent  # (B, L-1), 0 off the response

    valid = labels != IGNORE_INDEX
    current = entropies()[valid]
    sources = {"fp32, same pass": current, "fp32, chunked differently": entropies(chunk=7)[valid],
               "bf16 pass": entropies(bf16=True)[valid]}
    rows = []
    for source, old in sources.items():
        rho = (current + ENTROPY_EPS) / (old + ENTROPY_EPS)
        for lo, hi in bounds:
            stopped = (rho <= lo) | (rho >= hi)
            for name, a, b in (("all", 0.0, float("inf")),) + tuple(ENTROPY_BUCKETS):
                inb = (current >= a) & (current < b)
                rows.append({"old entropies from": source, "bounds": f"({lo}, {hi})", "bucket": name,
                             "token_share": float(inb.float().mean()),
                             "stopped_frac": float(stopped[inb].float().mean()) if bool(inb.any()) else 0.0,
                             "tokens": int(inb.sum())})
    return pd.DataFrame(rows)
