"""Policy losses: one registry, one signature (verl's), ERC as an option of every loss.

Every registered loss is a pure function

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
       *, entropy=None, old_entropy=None) -> (loss, metrics)

with tensors (B, T), advantages (B, T) or (B,), `loss` a scalar to *minimise* and `metrics` the dict of
python floats defined once in `METRICS`. Per token the gradient of a loss with respect to log π_θ is
`-F·A` times the aggregation weight (reference §1); tests pin F for every case.
Sources: docs/reference.md §1-3 (Klear-Reasoner arXiv 2508.07629, ERC arXiv 2512.05591).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping, Union

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # as verl: |log r| <= 20 keeps exp() finite; beyond it the token's gradient is cut
ENTROPY_EPS = 1e-8  # ERC's ρ_t = (H_t + 1e-8) / (H_old,t + 1e-8), reference §3
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3")

# The glossary: every metric a loss returns, defined once. m = response mask, Σ over the batch.
METRICS: dict[str, str] = {
    "actor/pg_loss": "the aggregated policy loss (after ERC), normalised by loss_agg_mode",
    "actor/pg_clipfrac_low": "Σ m·[A<0 ∧ r<1-ε_l] / Σ m; r is the ratio the loss clips (token r; GSPO's s_t)",
    "actor/pg_clipfrac_high": "Σ m·[A>0 ∧ r>1+ε_h] / Σ m; r as in pg_clipfrac_low",
    "actor/gppo_preserved_frac": "Σ m·[(A<0 ∧ r<1-ε_l ∧ β_l>0) ∨ (A>0 ∧ r>1+ε_h ∧ β_h>0)] / Σ m for gppo "
    "(gradient kept, bounded); 0 for every other loss",
    "actor/pg_clipfrac_dual": "Σ m·[A<0 ∧ r>c] / Σ m for losses that apply dual-clip (ppo_clip, gppo); "
    "0 for cispo, gspo or clip_ratio_c=None",
    "actor/erc_frac_low": "Σ m·[ρ ≤ erc_low] / Σ m, ρ = (H+1e-8)/(H_old+1e-8); 0 when ERC is off",
    "actor/erc_frac_high": "Σ m·[ρ ≥ erc_high] / Σ m; 0 when ERC is off",
    "actor/ratio_mean": "Σ m·r / Σ m, token ratio r = exp(log π_θ - log π_old) (0 without response tokens)",
    "actor/ratio_max": "max over response tokens of the token ratio r (0 without response tokens)",
    "actor/approx_kl_k3": "Σ m·(r - 1 - log r) / Σ m: Schulman's k3 estimate of KL(π_old ‖ π_θ)",
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass
class PolicyLossConfig:
    """Strict, typed config of every policy loss. Defaults are Klear's RL recipe (reference §4)."""

    clip_ratio_low: float = 0.2
    """ε_l, lower clip: 1-ε_l bounds r from below. PPO (Schulman et al. 2017); Klear 0.2 (reference §4)."""
    clip_ratio_high: float = 0.28
    """ε_h, upper clip: 1+ε_h. ε_h > ε_l is DAPO's clip-higher (Yu et al. 2025); Klear 0.28 (reference §4)."""
    clip_ratio_c: float | None = 10.0
    """c, dual-clip for A<0 (Ye et al. 2020, arXiv 1912.09729): loss ≤ -c·A; Klear scripts c=10. None: off."""
    beta_low: float = 1.0
    """β_l, GPPO general form: F = β_l·(1-ε_l) on A<0, r<1-ε_l (reference §1). Paper 1; CE-GPPO 0.5/0.75."""
    beta_high: float = 1.0
    """β_h, GPPO general form: F = β_h·(1+ε_h) on A>0, r>1+ε_h (reference §1). Paper and CE-GPPO: 1."""
    gppo_beta_scales_value: bool = False
    """False: the paper, GPPO's forward value equals PPO-clip's and β scales only the gradient. True: the
    released Kwai-Klear code, β also scales the loss value on those tokens (reference §1)."""
    erc_low: float | None = None
    """ERC lower bound on ρ = H/H_old (arXiv 2512.05591, reference §3): tokens with ρ ≤ erc_low lose their
    gradient. Config default there 0.8, scripts 0.95. ERC is on only when erc_low and erc_high are set."""
    erc_high: float | None = None
    """ERC upper bound: tokens with ρ ≥ erc_high lose their gradient. Config default there 1.2, scripts 1.05."""
    loss_scale_factor: float | None = None
    """L in `seq-mean-token-sum-norm` = Σ m·ℓ / (B·L) (Dr. GRPO, arXiv 2503.20783, a constant such as the
    max response length). None: the batch's T, as verl's agg_loss."""

    def __post_init__(self) -> None:
        def bad(name: str, must: str) -> ValueError:
            return ValueError(f"PolicyLossConfig.{name} must {must}, got {getattr(self, name)!r}")

        for name in ("clip_ratio_low", "clip_ratio_high", "beta_low", "beta_high"):
            if not _is_number(getattr(self, name)):
                raise bad(name, "be a number")
        for name in ("clip_ratio_c", "erc_low", "erc_high", "loss_scale_factor"):
            if getattr(self, name) is not None and not _is_number(getattr(self, name)):
                raise bad(name, "be a number or None")
        if not isinstance(self.gppo_beta_scales_value, bool):
            raise bad("gppo_beta_scales_value", "be a bool")
        if not 0 <= self.clip_ratio_low < 1:
            raise bad("clip_ratio_low", "satisfy 0 <= clip_ratio_low < 1")
        if not self.clip_ratio_high > 0:
            raise bad("clip_ratio_high", "be > 0")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise bad("clip_ratio_c", "be > 1 (or None to turn dual-clip off)")
        for name in ("beta_low", "beta_high"):
            if getattr(self, name) < 0:
                raise bad(name, "be >= 0")
        if (self.erc_low is None) != (self.erc_high is None):
            which = "erc_low" if self.erc_low is None else "erc_high"
            raise bad(which, "be set too: ERC needs both erc_low and erc_high (or neither)")
        if self.erc_low is not None and not 0 <= self.erc_low < 1:
            raise bad("erc_low", "satisfy 0 <= erc_low < 1")
        if self.erc_high is not None and not self.erc_high > 1:
            raise bad("erc_high", "be > 1")
        if self.loss_scale_factor is not None and not self.loss_scale_factor > 0:
            raise bad("loss_scale_factor", "be > 0 (or None for the batch's T)")

    @property
    def erc_enabled(self) -> bool:
        return self.erc_low is not None and self.erc_high is not None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PolicyLossConfig":
        """Strict constructor: an unknown key is a ValueError listing the valid field names."""
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ValueError(f"unknown PolicyLossConfig key(s) {unknown}; valid keys: {valid}")
        return cls(**dict(d))


ConfigLike = Union[PolicyLossConfig, Mapping[str, Any], None]  # a mapping goes through strict from_dict
PolicyLossFn = Callable[..., "tuple[Tensor, dict[str, float]]"]
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register `fn` under `name` (re-registering replaces, so reloading a notebook works)."""

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


def compute_policy_loss(name: str, *, old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor,
                        response_mask: Tensor, loss_agg_mode: str = "token-mean",
                        config: ConfigLike = None,
                        entropy: Tensor | None = None, old_entropy: Tensor | None = None,
                        ) -> tuple[Tensor, dict[str, float]]:
    """Look up the loss `name` in POLICY_LOSSES and call it; see the module docstring for the contract."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; registered: {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[name](old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                               entropy=entropy, old_entropy=old_entropy)


def _check_shape(name: str, t: Tensor, ref_name: str, ref: Tensor) -> None:
    if tuple(t.shape) != tuple(ref.shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)} but {ref_name} has shape {tuple(ref.shape)}")


def agg_loss(loss_mat: Tensor, loss_mask: Tensor, loss_agg_mode: str, *,
             loss_scale_factor: float | None = None) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar over the tokens where loss_mask is true.

    token-mean:              Σ m·ℓ / Σ m                           (DAPO, Klear)
    seq-mean-token-mean:     mean over rows with Σ_t m > 0 of Σ_t m·ℓ / Σ_t m      (GRPO, GSPO)
    seq-mean-token-sum:      mean over rows with Σ_t m > 0 of Σ_t m·ℓ
    seq-mean-token-sum-norm: Σ m·ℓ / (B·L), L = loss_scale_factor or T, B = all rows (Dr. GRPO)
    The last divides by B as Dr. GRPO's objective (1/G Σ_i Σ_t) and code do; verl's agg_loss divides by L
    only, so verl's value is B times this one. A batch without a masked-in token gives 0 (differentiable).
    """
    if loss_agg_mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {list(AGG_MODES)}")
    _check_shape("loss_mask", loss_mask, "loss_mat", loss_mat)
    mask = loss_mask.bool()  # (B, T)
    # where, not multiply: a NaN/inf on a padding token must not leak into the loss or its gradient
    masked = torch.where(mask, loss_mat, torch.zeros_like(loss_mat))  # (B, T)
    if loss_agg_mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor
        if not scale > 0:
            raise ValueError(f"loss_scale_factor must be > 0, got {loss_scale_factor!r}")
        return masked.sum() / max(loss_mat.shape[0] * scale, 1e-12)
    n_tok = mask.sum(-1)  # (B,)
    seq_loss = masked.sum(-1)  # (B,)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_loss = seq_loss / n_tok.clamp(min=1)  # (B,)
    return seq_loss.sum() / (n_tok > 0).sum().clamp(min=1)


@dataclass
class _Batch:
    log_prob: Tensor  # (B, T) current policy, carries the gradient
    log_ratio: Tensor  # (B, T) clamp(log π_θ - log π_old, ±20)
    ratio: Tensor  # (B, T) r = exp(log_ratio)
    adv: Tensor  # (B, T) detached, broadcast from (B,) if needed
    mask: Tensor  # (B, T) bool response mask
    cfg: PolicyLossConfig


def _prepare(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
             config: ConfigLike) -> _Batch:
    if config is None:
        cfg = PolicyLossConfig()
    elif isinstance(config, PolicyLossConfig):
        cfg = config
    else:
        cfg = PolicyLossConfig.from_dict(config)
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be (B, T), got shape {tuple(log_prob.shape)}")
    _check_shape("log_prob", log_prob, "old_log_prob", old_log_prob)
    _check_shape("response_mask", response_mask, "log_prob", log_prob)
    adv = advantages.detach().to(log_prob.dtype)
    if adv.dim() == 1 and adv.shape[0] == log_prob.shape[0]:
        adv = adv.unsqueeze(-1).expand_as(log_prob)  # (B,) -> (B, T)
    elif tuple(adv.shape) != tuple(log_prob.shape):
        raise ValueError(f"advantages has shape {tuple(adv.shape)} but log_prob has shape "
                         f"{tuple(log_prob.shape)} (advantages must be (B, T) or (B,))")
    log_ratio = torch.clamp(log_prob - old_log_prob.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    return _Batch(log_prob, log_ratio, torch.exp(log_ratio), adv, response_mask.bool(), cfg)


def _ppo_clip_per_token(ratio: Tensor, adv: Tensor, cfg: PolicyLossConfig) -> tuple[Tensor, Tensor]:
    """Per-token PPO-clip loss with dual-clip: (loss (B, T), dual-clipped token mask (B, T))."""
    # PPO-clip (Schulman et al. 2017, eq. 7) with ε_l ≠ ε_h (DAPO clip-higher), as a loss:
    #   ℓ = max(-A·r, -A·clip(r, 1-ε_l, 1+ε_h))
    clipped = torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)  # (B, T)
    loss = torch.maximum(-adv * ratio, -adv * clipped)  # (B, T)
    if cfg.clip_ratio_c is None:
        return loss, torch.zeros_like(ratio, dtype=torch.bool)
    # Dual-clip (Ye et al. 2020): for A<0, ℓ = min(ℓ, -c·A), so a runaway ratio on a bad token stops pushing
    loss = torch.where(adv < 0, torch.minimum(loss, -adv * cfg.clip_ratio_c), loss)  # (B, T)
    return loss, (adv < 0) & (ratio > cfg.clip_ratio_c)


def _finish(b: _Batch, loss_mat: Tensor, loss_agg_mode: str, entropy: Tensor | None,
            old_entropy: Tensor | None, *, clip_ratio: Tensor, dual: Tensor | None = None,
            preserved: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """Shared tail of every loss: ERC, aggregation, metrics (METRICS)."""
    cfg, m = b.cfg, b.mask
    erc_lo = erc_hi = torch.zeros_like(m)  # (B, T) bool
    if cfg.erc_enabled:
        if entropy is None or old_entropy is None:
            raise ValueError(f"ERC is on (erc_low={cfg.erc_low}, erc_high={cfg.erc_high}) but entropy and "
                             "old_entropy were not both given: pass the per-token entropies (B, T) of the "
                             "current and the rollout policy, or set erc_low=erc_high=None")
        _check_shape("entropy", entropy, "log_prob", b.log_prob)
        _check_shape("old_entropy", old_entropy, "log_prob", b.log_prob)
        # ERC (arXiv 2512.05591, reference §3): ρ_t = (H_t + 1e-8) / (H_old,t + 1e-8), kept iff ρ_t ∈ (lo, hi)
        rho = (entropy.detach() + ENTROPY_EPS) / (old_entropy.detach() + ENTROPY_EPS)  # (B, T)
        erc_lo, erc_hi = m & (rho <= cfg.erc_low), m & (rho >= cfg.erc_high)
        # stop-gradient only: the token keeps its loss value and its place in the denominator
        loss_mat = torch.where(erc_lo | erc_hi, loss_mat.detach(), loss_mat)  # (B, T)
    loss = agg_loss(loss_mat, m, loss_agg_mode, loss_scale_factor=cfg.loss_scale_factor)

    with torch.no_grad():
        n = m.sum().clamp(min=1)

        def frac(x: Tensor) -> float:
            return float((x & m).sum() / n)

        low = (b.adv < 0) & (clip_ratio < 1 - cfg.clip_ratio_low)  # (B, T)
        high = (b.adv > 0) & (clip_ratio > 1 + cfg.clip_ratio_high)  # (B, T)
        r, log_r = b.ratio.detach(), b.log_ratio.detach()  # (B, T)
        k3 = r - 1 - log_r  # (B, T) kl_penalty(old, new, "k3"): the samples come from π_old
        metrics = {
            "actor/pg_loss": float(loss.detach()),
            "actor/pg_clipfrac_low": frac(low),
            "actor/pg_clipfrac_high": frac(high),
            "actor/gppo_preserved_frac": 0.0 if preserved is None else frac(preserved),
            "actor/pg_clipfrac_dual": 0.0 if dual is None else frac(dual),
            "actor/erc_frac_low": frac(erc_lo),
            "actor/erc_frac_high": frac(erc_hi),
            "actor/ratio_mean": float(torch.where(m, r, 0).sum() / n),
            "actor/ratio_max": float(r[m].max()) if bool(m.any()) else 0.0,
            "actor/approx_kl_k3": float(torch.where(m, k3, 0).sum() / n),
        }
    return loss, metrics


@register_policy_loss("ppo_clip")
def ppo_clip_loss(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
                  loss_agg_mode: str = "token-mean", config: ConfigLike = None, *,
                  entropy: Tensor | None = None, old_entropy: Tensor | None = None,
                  ) -> tuple[Tensor, dict[str, float]]:
    """PPO-clip with dual-clip; DAPO's clip-higher when clip_ratio_low != clip_ratio_high.

    F = 0 where the ratio left the trust region in the advantage's direction (A>0, r>1+ε_h; A<0,
    r<1-ε_l) and where dual-clip binds (A<0, r>c); F = r elsewhere. Departs from PPO only in the named
    aggregation (the paper averages per token) and the ±20 log-ratio clamp.
    """
    b = _prepare(old_log_prob, log_prob, advantages, response_mask, config)
    loss_mat, dual = _ppo_clip_per_token(b.ratio, b.adv, b.cfg)
    return _finish(b, loss_mat, loss_agg_mode, entropy, old_entropy, clip_ratio=b.ratio, dual=dual)


@register_policy_loss("gppo")
def gppo_loss(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
              loss_agg_mode: str = "token-mean", config: ConfigLike = None, *,
              entropy: Tensor | None = None, old_entropy: Tensor | None = None,
              ) -> tuple[Tensor, dict[str, float]]:
    """GPPO, gradient-preserving clipping (Klear-Reasoner, arXiv 2508.07629; reference §1).

    Forward value equals PPO-clip's (dual-clip included). On the tokens PPO-clip silences, the gradient is
    kept and bounded: F = β_h·(1+ε_h) for A>0, r>1+ε_h and F = β_l·(1-ε_l) for A<0, r<1-ε_l; the
    optimistic cases keep PPO's F = r; dual-clip (A<0, r>c) gives F = 0. The paper has β_l = β_h = 1;
    `gppo_beta_scales_value=True` reproduces the released code, where β also scales the value there.
    Fixed, not copied, from the reference code: the misspelled variable (NameError on every call), the
    float/tensor torch.clamp in its "only-high" branch (explicit case masks here, no mixed clamp), and
    the early version's dropped gradient for A<0, r>1 (here F = r up to c; tests pin every case).
    """
    b = _prepare(old_log_prob, log_prob, advantages, response_mask, config)
    cfg, adv = b.cfg, b.adv
    loss_mat, dual = _ppo_clip_per_token(b.ratio, adv, cfg)  # (B, T)
    high = (adv > 0) & (b.ratio > 1 + cfg.clip_ratio_high)  # (B, T)
    low = (adv < 0) & (b.ratio < 1 - cfg.clip_ratio_low)  # (B, T)
    # GPPO: ℓ = -min(r·A, clip(r, (1-ε_l)·r/sg(r), (1+ε_h)·r/sg(r))·A), with β on the clipped sides.
    # r/sg(r) has value 1 and ∂/∂log π = 1, so bound·r/sg(r) keeps the value at the bound and gives F = bound.
    unit = b.ratio / b.ratio.detach()  # (B, T), value 1

    def preserved(bound: float, beta: float) -> Tensor:
        if cfg.gppo_beta_scales_value:  # released code: value -β·bound·A, F = β·bound
            return -adv * beta * bound * unit  # (B, T)
        return -adv * bound * (1 + beta * (unit - 1))  # paper: value -bound·A (PPO's), F = β·bound

    loss_mat = torch.where(high, preserved(1 + cfg.clip_ratio_high, cfg.beta_high), loss_mat)  # (B, T)
    loss_mat = torch.where(low, preserved(1 - cfg.clip_ratio_low, cfg.beta_low), loss_mat)  # (B, T)
    kept = (high & (cfg.beta_high > 0)) | (low & (cfg.beta_low > 0))  # a side with β 0 keeps no gradient (PPO's)
    return _finish(b, loss_mat, loss_agg_mode, entropy, old_entropy, clip_ratio=b.ratio, dual=dual,
                   preserved=kept)


@register_policy_loss("cispo")
def cispo_loss(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
               loss_agg_mode: str = "token-mean", config: ConfigLike = None, *,
               entropy: Tensor | None = None, old_entropy: Tensor | None = None,
               ) -> tuple[Tensor, dict[str, float]]:
    """CISPO, clipped IS-weight policy optimisation (MiniMax-M1, arXiv 2506.13585).

    Per token ℓ = -sg(clip(r, 1-ε_l, 1+ε_h))·A·log π_θ, so F = clip(r, 1-ε_l, 1+ε_h) on every token: no
    token loses its gradient, and the optimistic cases (A>0, r<1-ε_l; A<0, r>1+ε_h) are clipped too, where
    PPO and GPPO keep F = r. The value is not PPO's (it is linear in log π). Departs from the paper: both
    bounds come from the shared clip range (MiniMax tunes mainly the upper one); no dual-clip, since the
    weight is already bounded by 1+ε_h.
    """
    b = _prepare(old_log_prob, log_prob, advantages, response_mask, config)
    # CISPO (MiniMax-M1): ℓ = -sg(clip(r, 1-ε_l, 1+ε_h))·A·log π_θ
    weight = torch.clamp(b.ratio, 1 - b.cfg.clip_ratio_low, 1 + b.cfg.clip_ratio_high).detach()  # (B, T)
    loss_mat = -weight * b.adv * b.log_prob  # (B, T)
    return _finish(b, loss_mat, loss_agg_mode, entropy, old_entropy, clip_ratio=b.ratio)


@register_policy_loss("gspo")
def gspo_loss(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
              loss_agg_mode: str = "token-mean", config: ConfigLike = None, *,
              entropy: Tensor | None = None, old_entropy: Tensor | None = None,
              ) -> tuple[Tensor, dict[str, float]]:
    """GSPO, sequence-level ratio (Zheng et al. 2025, arXiv 2507.18071), in its GSPO-token form.

    s = exp(mean over response tokens of (log π_θ - log π_old)) per sequence; s_t = sg(s)·π_t/sg(π_t) has
    value s and ∂s_t/∂log π_t = s; then PPO-clip on s_t. With advantages constant per sequence and
    `seq-mean-token-mean` this is the paper's sequence objective. Departs from the paper: the clip range is
    the shared config's (paper: 3e-4 / 4e-4, far narrower), the aggregation is the caller's (paper:
    seq-mean-token-mean; verl defaults to token-mean), and there is no dual-clip. Clip metrics use s_t.
    """
    b = _prepare(old_log_prob, log_prob, advantages, response_mask, config)
    n_tok = b.mask.sum(-1).clamp(min=1)  # (B,)
    # GSPO eq. for s_i: log s = (1/|y|) Σ_t log(π_θ/π_old); a row without response tokens gets s = 1
    log_s = torch.where(b.mask, b.log_ratio, 0).sum(-1) / n_tok  # (B,)
    # GSPO-token: s_t = sg(s)·π_t/sg(π_t)
    s_t = torch.exp(log_s.detach().unsqueeze(-1) + b.log_prob - b.log_prob.detach())  # (B, T)
    no_dual = replace(b.cfg, clip_ratio_c=None)
    loss_mat, _ = _ppo_clip_per_token(s_t, b.adv, no_dual)  # (B, T)
    return _finish(b, loss_mat, loss_agg_mode, entropy, old_entropy, clip_ratio=s_t.detach())


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π (Schulman 2020, "Approximating KL Divergence").

    k1 = log π - log π_ref (unbiased, high variance, can be negative); k2 = ½(log π - log π_ref)²;
    k3 = exp(log π_ref - log π) - (log π_ref - log π) - 1 (unbiased, ≥ 0). No clamping (verl clamps k3).
    """
    _check_shape("ref_log_prob", ref_log_prob, "log_prob", log_prob)
    d = ref_log_prob - log_prob  # (B, T) log(π_ref / π)
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"unknown KL estimator {kind!r}; valid kinds: {list(KL_KINDS)}")


def positive_sample_loss(log_prob: Tensor, response_mask: Tensor, is_positive: Tensor,
                         loss_agg_mode: str = "token-mean") -> Tensor:
    """Klear's positive-sample NLL (reference §2): -mean over the response tokens of fully correct samples.

    is_positive: (B,) bool, the responses whose reward is the maximum. The trainer adds α·this (α = 0.1).
    With no positive sample the result is 0 and still differentiable. For seq-mean-token-sum-norm, B counts
    every row, positive or not.
    """
    if tuple(is_positive.shape) != (log_prob.shape[0],):
        raise ValueError(f"is_positive has shape {tuple(is_positive.shape)} but log_prob has shape "
                         f"{tuple(log_prob.shape)} (is_positive must be (B,))")
    _check_shape("response_mask", response_mask, "log_prob", log_prob)
    mask = response_mask.bool() & is_positive.bool().unsqueeze(-1)  # (B, T)
    # Klear: L_pos = -Σ_{j∈pos} Σ_t log π_θ(y_j,t) / Σ_{j∈pos} |y_j|  (token-mean)
    return agg_loss(-log_prob, mask, loss_agg_mode)


# Old-policy entropy buckets (nats) of the ERC diagnostics: near-deterministic tokens, uncertain ones, forks.
ENTROPY_BUCKETS = (("low", 0.0, 0.1), ("mid", 0.1, 1.0), ("high", 1.0, float("inf")))


def entropy_diagnostics(entropy: Tensor, old_entropy: Tensor, mask: Tensor, *, erc_low: float | None = None,
                        erc_high: float | None = None) -> dict[str, float]:
    """Per-step diagnostics of the entropy ratio ρ = (H + 1e-8) / (H_old + 1e-8) over the valid tokens:

    * ``erc/ratio_p05``, ``erc/ratio_p50``, ``erc/ratio_p95``: quantiles of ρ (its distribution, step by step);
    * per old-entropy bucket b of ``ENTROPY_BUCKETS``: ``erc/token_share_b`` (share of tokens in b) and
      ``erc/masked_frac_b`` (share of b's tokens that ERC with these bounds stops, ρ ≤ erc_low or ρ ≥ erc_high;
      0 when the bounds are None, i.e. ERC is off).

    The ERC paper's claim to check: ERC stops about 20% of tokens, mostly low-entropy ones. Empty mask: {}.
    """
    m = mask.bool()
    if not bool(m.any()):
        return {}
    with torch.no_grad():
        h, h_old = entropy.detach()[m].float(), old_entropy.detach()[m].float()  # (N,)
        rho = (h + ENTROPY_EPS) / (h_old + ENTROPY_EPS)
        q = torch.quantile(rho, torch.tensor([0.05, 0.5, 0.95], dtype=rho.dtype))
        out = {"erc/ratio_p05": float(q[0]), "erc/ratio_p50": float(q[1]), "erc/ratio_p95": float(q[2])}
        stopped = torch.zeros_like(rho, dtype=torch.bool)
        if erc_low is not None and erc_high is not None:
            stopped = (rho <= erc_low) | (rho >= erc_high)
        for name, lo, hi in ENTROPY_BUCKETS:
            inb = (h_old >= lo) & (h_old < hi)
            out[f"erc/token_share_{name}"] = float(inb.float().mean())
            out[f"erc/masked_frac_{name}"] = float(stopped[inb].float().mean()) if bool(inb.any()) else 0.0
    return out
