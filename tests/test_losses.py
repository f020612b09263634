"""Policy losses: the gradient table of reference §1, invariants, hand-computed cases, and a slow loop
reference checked against the vectorised losses (values and gradients) on random inputs."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from klear_lib.losses import (
    AGG_MODES,
    METRICS,
    POLICY_LOSSES,
    PolicyLossConfig,
    agg_loss,
    compute_policy_loss,
    kl_penalty,
    positive_sample_loss,
)

DT = torch.float64
LOSSES = sorted(POLICY_LOSSES)


def run(name, old, logp, adv, mask=None, mode="seq-mean-token-sum", config=None, entropy=None,
        old_entropy=None):
    """Loss `name` on float64 copies of the inputs; returns (loss value, d loss / d log_prob, metrics)."""
    def t(x):
        return torch.as_tensor(x, dtype=DT)

    lp = t(logp).clone().requires_grad_(True)
    mask = torch.ones_like(lp, dtype=torch.bool) if mask is None else torch.as_tensor(mask).bool()
    loss, metrics = compute_policy_loss(
        name, old_log_prob=t(old), log_prob=lp, advantages=t(adv), response_mask=mask,
        loss_agg_mode=mode, config=config,
        entropy=None if entropy is None else t(entropy),
        old_entropy=None if old_entropy is None else t(old_entropy))
    (grad,) = torch.autograd.grad(loss, lp, allow_unused=False)
    return loss.item(), grad, metrics


def random_batch(seed, B=4, T=7, lr_range=(-1.0, 2.7)):
    """Random float64 batch whose log-ratios cover every case of the table (incl. r > c = 10)."""
    g = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(B, T, generator=g, dtype=DT)  # (B, T)
    log_ratio = lr_range[0] + (lr_range[1] - lr_range[0]) * torch.rand(B, T, generator=g, dtype=DT)
    adv = torch.randn(B, T, generator=g, dtype=DT)  # (B, T)
    mask = torch.rand(B, T, generator=g) < 0.8  # (B, T)
    mask[0] = True  # at least one full row
    return old, old + log_ratio, adv, mask


# ---------------------------------------------------------------- the gradient table (reference §1)
# Columns (r, sign A) of the worked numbers; ε_l = 0.2, ε_h = 0.28, c = 10 (the defaults).
TABLE_R = [0.5, 0.9, 1.1, 1.5, 0.5, 0.9, 1.1, 1.5, 12.0]
TABLE_SIGN = [+1, +1, +1, +1, -1, -1, -1, -1, -1]
TABLE_CASES = [
    ("ppo_clip", {}, [0.5, 0.9, 1.1, 0.0, 0.0, 0.9, 1.1, 1.5, 0.0]),
    ("gppo", {}, [0.5, 0.9, 1.1, 1.28, 0.8, 0.9, 1.1, 1.5, 0.0]),
    ("gppo", {"beta_low": 0.25}, [0.5, 0.9, 1.1, 1.28, 0.2, 0.9, 1.1, 1.5, 0.0]),
    # the released code's value scaling changes the value only, never F
    ("gppo", {"beta_low": 0.25, "gppo_beta_scales_value": True}, [0.5, 0.9, 1.1, 1.28, 0.2, 0.9, 1.1, 1.5, 0.0]),
    # β_h = 0.5: F = 0.5·1.28 = 0.64 on (1.5, +)
    ("gppo", {"beta_high": 0.5}, [0.5, 0.9, 1.1, 0.64, 0.8, 0.9, 1.1, 1.5, 0.0]),
    # β_h = 0, 03's gppo_low_only arm: PPO-clip's F = 0 on (1.5, +), GPPO's 0.8 on (0.5, −)
    ("gppo", {"beta_high": 0.0}, [0.5, 0.9, 1.1, 0.0, 0.8, 0.9, 1.1, 1.5, 0.0]),
    # CISPO: F = clip(r, 0.8, 1.28) everywhere, optimistic cases and r > c included
    ("cispo", {}, [0.8, 0.9, 1.1, 1.28, 0.8, 0.9, 1.1, 1.28, 1.28]),
]


@pytest.mark.parametrize("name,cfg,expected_F", TABLE_CASES)
def test_gradient_coefficient_table(name, cfg, expected_F):
    adv = [0.7 * s for s in TABLE_SIGN]  # |A| ≠ 1 so that F·A, not F alone, is checked
    # (1, T) batch with seq-mean-token-sum: loss = Σ_t ℓ_t, so d loss / d log π_t = -F_t·A_t
    _, grad, _ = run(name, [[0.0] * 9], [[math.log(r) for r in TABLE_R]], [adv], config=cfg)
    F = -grad[0] / torch.tensor(adv, dtype=DT)
    torch.testing.assert_close(F, torch.tensor(expected_F, dtype=DT), atol=1e-12, rtol=0)


def test_dual_clip_off_restores_plain_ppo_on_large_ratios():
    # c = None: (12, −) is the pessimistic side, F = r = 12 for ppo_clip and gppo alike
    for name in ("ppo_clip", "gppo"):
        _, grad, m = run(name, [[0.0]], [[math.log(12.0)]], [[-1.0]], config={"clip_ratio_c": None})
        assert grad.item() == pytest.approx(12.0)
        assert m["actor/pg_clipfrac_dual"] == 0.0


# ---------------------------------------------------------------- GPPO against PPO-clip
@pytest.mark.parametrize("mode", AGG_MODES)
def test_gppo_forward_equals_ppo_and_gradient_differs_only_where_preserved(mode):
    old, logp, adv, mask = random_batch(0)
    v_ppo, g_ppo, _ = run("ppo_clip", old, logp, adv, mask, mode)
    v_gppo, g_gppo, m = run("gppo", old, logp, adv, mask, mode)
    r = torch.exp(logp - old)
    preserved = mask & (((adv > 0) & (r > 1.28)) | ((adv < 0) & (r < 0.8)))  # (B, T)
    assert preserved.sum() >= 3
    assert v_gppo == pytest.approx(v_ppo, abs=1e-12)
    torch.testing.assert_close(g_gppo[~preserved], g_ppo[~preserved], atol=1e-12, rtol=0)
    assert (g_ppo[preserved] == 0).all() and (g_gppo[preserved] != 0).all()
    assert m["actor/gppo_preserved_frac"] == pytest.approx(preserved.sum().item() / mask.sum().item())


def per_token_values(name, old, logp, adv, config):
    """ℓ_t for every token, by masking in one token at a time (token-mean over one token = ℓ_t)."""
    B, T = logp.shape
    out = torch.zeros(B, T, dtype=DT)
    for i in range(B):
        for t in range(T):
            one = torch.zeros(B, T, dtype=torch.bool)
            one[i, t] = True
            out[i, t] = run(name, old, logp, adv, one, "token-mean", config)[0]
    return out


def test_gppo_beta_scales_value_changes_value_only_on_preserved_tokens():
    old, logp, adv, _ = random_batch(1, B=3, T=6)
    cfg = {"beta_low": 0.25, "beta_high": 0.5, "gppo_beta_scales_value": True}
    v_ppo = per_token_values("ppo_clip", old, logp, adv, None)
    v_paper = per_token_values("gppo", old, logp, adv, {"beta_low": 0.25, "beta_high": 0.5})
    v_code = per_token_values("gppo", old, logp, adv, cfg)
    r = torch.exp(logp - old)
    high, low = (adv > 0) & (r > 1.28), (adv < 0) & (r < 0.8)
    assert high.any() and low.any()
    torch.testing.assert_close(v_paper, v_ppo, atol=1e-12, rtol=0)
    expected = torch.where(high, 0.5 * v_ppo, torch.where(low, 0.25 * v_ppo, v_ppo))
    torch.testing.assert_close(v_code, expected, atol=1e-12, rtol=0)


# ---------------------------------------------------------------- invariants of every loss
@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_zero_advantage_gives_zero_gradient(name, mode):
    old, logp, _, mask = random_batch(2)
    ent = torch.rand(4, 7, dtype=DT) + 0.5
    cfg = {"erc_low": 0.9, "erc_high": 1.1}
    for config, e in ((None, {}), (cfg, {"entropy": ent * 1.05, "old_entropy": ent})):
        _, grad, _ = run(name, old, logp, torch.zeros(4, 7, dtype=DT), mask, mode, config, **e)
        assert (grad == 0).all()


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_ratio_one_gives_plain_policy_gradient(name, mode):
    old, _, adv, mask = random_batch(3)
    adv = adv[:, 0]  # (B,) sequence-level advantages, broadcast
    _, grad, m = run(name, old, old, adv, mask, mode)
    # REINFORCE: ℓ_t = -A·log π_t, same normaliser
    lp = old.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(agg_loss(-adv[:, None] * lp, mask, mode), lp)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)
    assert m["actor/ratio_mean"] == pytest.approx(1.0) and m["actor/approx_kl_k3"] == pytest.approx(0.0)


@pytest.mark.parametrize("name", LOSSES)
def test_every_loss_returns_the_glossary_keys_as_floats(name):
    old, logp, adv, mask = random_batch(4)
    _, _, m = run(name, old, logp, adv, mask, "token-mean")
    assert set(m) == set(METRICS)
    assert all(type(v) is float for v in m.values())


# ---------------------------------------------------------------- ERC (reference §3)
# ρ per token; ERC bounds 0.95 / 1.05; token (0, 4) is padding and its ρ = 2.0 must not count
ERC_RHO = [[0.5, 0.97, 1.0, 1.2, 2.0], [0.9, 1.04, 0.94, 1.06, 1.0]]
ERC_MASK = [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
# masked-in: 9 tokens; ρ ≤ 0.95: 0.5, 0.9, 0.94 → 3/9; ρ ≥ 1.05: 1.2, 1.06 → 2/9
ERC_SILENCED = torch.tensor([[1, 0, 0, 1, 0], [1, 0, 1, 1, 0]], dtype=torch.bool)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_erc_is_a_stop_gradient_that_keeps_value_and_denominator(name, mode):
    old, logp, adv, _ = random_batch(5, B=2, T=5, lr_range=(-0.15, 0.15))  # inside every clip range
    mask = torch.tensor(ERC_MASK, dtype=torch.bool)
    old_ent = 0.5 + torch.rand(2, 5, dtype=DT, generator=torch.Generator().manual_seed(9))
    ent = torch.tensor(ERC_RHO, dtype=DT) * old_ent
    cfg = {"erc_low": 0.95, "erc_high": 1.05}
    v0, g0, m0 = run(name, old, logp, adv, mask, mode, None, ent, old_ent)
    v1, g1, m1 = run(name, old, logp, adv, mask, mode, cfg, ent, old_ent)
    assert v1 == v0  # the value is untouched, so the denominator is too
    assert (g1[ERC_SILENCED] == 0).all()
    torch.testing.assert_close(g1[~ERC_SILENCED], g0[~ERC_SILENCED], atol=0, rtol=0)
    assert (g0[ERC_SILENCED] != 0).all()  # ERC did the silencing, not the base loss
    assert m1["actor/erc_frac_low"] == pytest.approx(3 / 9) and m1["actor/erc_frac_high"] == pytest.approx(2 / 9)
    assert m0["actor/erc_frac_low"] == 0.0 and m0["actor/erc_frac_high"] == 0.0


# ---------------------------------------------------------------- aggregation
LOSS_MAT = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
AGG_MASK = [[1, 1, 0], [1, 0, 0], [0, 0, 0]]  # row 2 has no response token


@pytest.mark.parametrize("mode,kwargs,expected", [
    ("token-mean", {}, 7 / 3),  # (1 + 2 + 4) / 3 tokens
    ("seq-mean-token-mean", {}, 2.75),  # ((1 + 2)/2 + 4/1) / 2 non-empty rows = (1.5 + 4) / 2
    ("seq-mean-token-sum", {}, 3.5),  # ((1 + 2) + 4) / 2 non-empty rows
    ("seq-mean-token-sum-norm", {}, 7 / 9),  # (1 + 2 + 4) / (B=3 · T=3)
    ("seq-mean-token-sum-norm", {"loss_scale_factor": 10}, 7 / 30),  # 7 / (3 · 10)
])
def test_agg_loss_hand_values(mode, kwargs, expected):
    loss_mat = torch.tensor(LOSS_MAT, dtype=DT, requires_grad=True)
    loss = agg_loss(loss_mat, torch.tensor(AGG_MASK), mode, **kwargs)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    (grad,) = torch.autograd.grad(loss, loss_mat)
    assert (grad[torch.tensor(AGG_MASK) == 0] == 0).all()


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_loss_all_masked_is_zero_and_padding_cannot_leak(mode):
    loss_mat = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]], dtype=DT, requires_grad=True)
    loss = agg_loss(loss_mat, torch.zeros(2, 2), mode)
    (grad,) = torch.autograd.grad(loss, loss_mat)
    assert loss.item() == 0.0 and (grad == 0).all()
    loss = agg_loss(loss_mat, torch.tensor([[1, 0], [0, 1]]), mode)  # NaN / inf only on padding
    assert math.isfinite(loss.item())
    assert torch.isfinite(torch.autograd.grad(loss, loss_mat)[0]).all()


def test_agg_loss_unknown_mode_lists_modes():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(torch.zeros(1, 1), torch.ones(1, 1), "sum")


# ---------------------------------------------------------------- CISPO and GSPO by hand
def test_cispo_hand_computed():
    # r = 0.5, 1.0, 1.5; A = 1, -2, 1; weight sg(clip(r, 0.8, 1.28)) = 0.8, 1.0, 1.28
    # ℓ = -w·A·log π: 0.8·log 2 = 0.5545, -1·(-2)·0 = 0, -1.28·log 1.5 = -0.5190; Σ = 0.0355
    v, grad, m = run("cispo", [[0.0] * 3], [[math.log(0.5), 0.0, math.log(1.5)]], [[1.0, -2.0, 1.0]])
    assert v == pytest.approx(0.8 * math.log(2) - 1.28 * math.log(1.5), abs=1e-12)
    torch.testing.assert_close(grad[0], torch.tensor([-0.8, 2.0, -1.28], dtype=DT))  # -w·A
    assert m["actor/pg_clipfrac_high"] == pytest.approx(1 / 3) and m["actor/pg_clipfrac_dual"] == 0.0


def test_gspo_hand_computed():
    # row 0: log-ratios 0.1, 0.3 → s = e^0.2 = 1.2214 (inside), A = +1: ℓ_t = -s, F = s
    # row 1: log-ratio 0.5 (token 1 is padding, its 9.0 must be ignored) → s = e^0.5 = 1.6487 > 1.28,
    #        A = -1: pessimistic side, not clipped: ℓ = s, F = s
    # row 2: log-ratio 0.5 → s = 1.6487 > 1.28, A = +1: clipped, ℓ = -1.28, F = 0
    # seq-mean-token-mean: ((-2s0)/2 + s1 + (-1.28)) / 3; d/dlog π: row 0: -s0/(2·3), row 1: s1/3
    old = [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    logp = [[0.1, 0.3], [0.5, 9.0], [0.5, 9.0]]
    mask = [[1, 1], [1, 0], [1, 0]]
    v, grad, m = run("gspo", old, logp, [1.0, -1.0, 1.0], mask, "seq-mean-token-mean")
    s0, s1 = math.exp(0.2), math.exp(0.5)
    assert v == pytest.approx((-s0 + s1 - 1.28) / 3, abs=1e-12)
    expected = torch.tensor([[-s0 / 6, -s0 / 6], [s1 / 3, 0.0], [0.0, 0.0]], dtype=DT)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)
    assert m["actor/pg_clipfrac_high"] == pytest.approx(1 / 4)  # s_t clipped on row 2's one token of 4


def test_metrics_hand_counts_on_the_table_batch():
    logp = [[math.log(r) for r in TABLE_R]]
    adv = [[float(s) for s in TABLE_SIGN]]
    _, _, m = run("ppo_clip", [[0.0] * 9], logp, adv, mode="token-mean")
    assert m["actor/pg_clipfrac_low"] == pytest.approx(1 / 9)  # (0.5, −)
    assert m["actor/pg_clipfrac_high"] == pytest.approx(1 / 9)  # (1.5, +)
    assert m["actor/pg_clipfrac_dual"] == pytest.approx(1 / 9)  # (12, −)
    assert m["actor/gppo_preserved_frac"] == 0.0
    assert m["actor/ratio_mean"] == pytest.approx((2 * (0.5 + 0.9 + 1.1 + 1.5) + 12) / 9)  # 20/9
    assert m["actor/ratio_max"] == pytest.approx(12.0)
    assert m["actor/approx_kl_k3"] == pytest.approx(sum(r - 1 - math.log(r) for r in TABLE_R) / 9)
    # token-mean of ℓ: ℓ = -A·r except (1.5,+) → -1.28, (0.5,−) → 0.8, (12,−) → 10
    expected = (-0.5 - 0.9 - 1.1 - 1.28 + 0.8 + 0.9 + 1.1 + 1.5 + 10) / 9
    assert m["actor/pg_loss"] == pytest.approx(expected)
    _, _, m = run("gppo", [[0.0] * 9], logp, adv, mode="token-mean")
    assert m["actor/gppo_preserved_frac"] == pytest.approx(2 / 9)
    assert m["actor/pg_loss"] == pytest.approx(expected)
    _, _, m = run("gppo", [[0.0] * 9], logp, adv, mode="token-mean", config={"beta_high": 0.0})
    assert m["actor/gppo_preserved_frac"] == pytest.approx(1 / 9)  # only (0.5, −): a β 0 side keeps nothing
    assert m["actor/pg_loss"] == pytest.approx(expected)


def test_padding_with_extreme_log_probs_stays_finite():
    old, logp, adv, mask = random_batch(6)
    logp = torch.where(mask, logp, torch.full_like(logp, -1e4))  # padding far outside any ratio range
    for name in LOSSES:
        v, grad, _ = run(name, old, logp, adv, mask, "token-mean")
        assert math.isfinite(v) and torch.isfinite(grad).all() and (grad[~mask] == 0).all()


# ---------------------------------------------------------------- slow loop reference
def loop_reference(name, old, logp, adv, mask, mode, cfg, ent, old_ent):
    """Per-token Python loop over the case analysis of reference §1, with each token's derivative
    d ℓ_t / d log π_t written by hand (no autograd). Every loss here has a diagonal Jacobian (GSPO's
    s_t stops the gradient through s), so grad_t = w_t · d_t with w_t the aggregation weight."""
    B, T = len(logp), len(logp[0])
    el, eh, c = cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c
    val = [[0.0] * T for _ in range(B)]
    der = [[0.0] * T for _ in range(B)]
    for i in range(B):
        n_i = sum(mask[i])
        seq_lr = sum(logp[i][t] - old[i][t] for t in range(T) if mask[i][t]) / max(n_i, 1)
        for t in range(T):
            if not mask[i][t]:
                continue
            A = adv[i][t]
            r = math.exp(seq_lr) if name == "gspo" else math.exp(logp[i][t] - old[i][t])
            if name == "cispo":
                w = min(max(r, 1 - el), 1 + eh)
                v, d = -w * A * logp[i][t], -w * A
            else:
                bound = beta = None
                if A > 0 and r > 1 + eh:
                    bound, beta = 1 + eh, cfg.beta_high
                elif A < 0 and r < 1 - el:
                    bound, beta = 1 - el, cfg.beta_low
                if bound is None:
                    v, d = -A * r, -A * r
                elif name == "gppo":
                    d = -A * beta * bound
                    v = -A * bound * (beta if cfg.gppo_beta_scales_value else 1.0)
                else:
                    v, d = -A * bound, 0.0
                if name in ("ppo_clip", "gppo") and c is not None and A < 0 and r > c:
                    v, d = -A * c, 0.0
            if cfg.erc_enabled:
                rho = (ent[i][t] + 1e-8) / (old_ent[i][t] + 1e-8)
                if not cfg.erc_low < rho < cfg.erc_high:
                    d = 0.0
            val[i][t], der[i][t] = v, d
    n_rows = [sum(row) for row in mask]
    n_tok, n_seq = sum(n_rows), sum(1 for n in n_rows if n > 0)
    loss, grad = 0.0, [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if not mask[i][t]:
                continue
            if mode == "token-mean":
                w = 1 / n_tok
            elif mode == "seq-mean-token-mean":
                w = 1 / (n_rows[i] * n_seq)
            elif mode == "seq-mean-token-sum":
                w = 1 / n_seq
            else:
                w = 1 / (B * (cfg.loss_scale_factor or T))
            loss += w * val[i][t]
            grad[i][t] = w * der[i][t]
    return loss, grad


@st.composite
def loss_inputs(draw):
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 7))

    def fl(lo, hi):
        return st.floats(lo, hi, allow_nan=False, allow_infinity=False)

    def grid(s):
        return draw(st.lists(st.lists(s, min_size=T, max_size=T), min_size=B, max_size=B))

    old = grid(fl(-3.0, 0.0))
    logp = [[o + lr for o, lr in zip(orow, lrow)] for orow, lrow in zip(old, grid(fl(-1.2, 2.6)))]
    if draw(st.booleans()):
        adv = grid(fl(-2.0, 2.0))
    else:
        adv = [[a] * T for a in draw(st.lists(fl(-2.0, 2.0), min_size=B, max_size=B))]
    mask = grid(st.booleans())  # all-false rows included
    old_ent = grid(fl(0.01, 3.0))
    ent = [[h * f for h, f in zip(hrow, frow)] for hrow, frow in zip(old_ent, grid(fl(0.5, 1.5)))]
    erc = draw(st.sampled_from([(None, None), (0.8, 1.2), (0.95, 1.05)]))
    cfg = PolicyLossConfig(
        clip_ratio_low=draw(fl(0.01, 0.5)), clip_ratio_high=draw(fl(0.05, 0.6)),
        clip_ratio_c=draw(st.sampled_from([None, 3.0, 10.0])),
        beta_low=draw(fl(0.0, 2.0)), beta_high=draw(fl(0.0, 2.0)),
        gppo_beta_scales_value=draw(st.booleans()), erc_low=erc[0], erc_high=erc[1],
        loss_scale_factor=draw(st.sampled_from([None, 3.0, 16.0])))
    return old, logp, adv, mask, ent, old_ent, cfg


def _away_from_kinks(old, logp, mask, ent, old_ent, cfg):
    """Exclude inputs within 1e-7 of a clip boundary, where the derivative jumps."""
    bounds = [1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high] + ([cfg.clip_ratio_c] if cfg.clip_ratio_c else [])
    ratios, rhos = [], []
    for lrow, orow, mrow, hrow, horow in zip(logp, old, mask, ent, old_ent):
        lrs = [lp - o for lp, o, m in zip(lrow, orow, mrow) if m]  # response tokens only
        ratios += [math.exp(x) for x in lrs] + ([math.exp(sum(lrs) / len(lrs))] if lrs else [])
        rhos += [(h + 1e-8) / (ho + 1e-8) for h, ho, m in zip(hrow, horow, mrow) if m]
    erc = [cfg.erc_low, cfg.erc_high] if cfg.erc_enabled else []
    return all(abs(x - b) > 1e-7 for x in ratios for b in bounds) and all(
        abs(x - b) > 1e-7 for x in rhos for b in erc)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("mode", AGG_MODES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=loss_inputs())
def test_vectorised_equals_loop_reference(name, mode, inputs):
    old, logp, adv, mask, ent, old_ent, cfg = inputs
    assume(_away_from_kinks(old, logp, mask, ent, old_ent, cfg))
    v, grad, _ = run(name, old, logp, adv, mask, mode, cfg, ent, old_ent)
    v_ref, grad_ref = loop_reference(name, old, logp, adv, mask, mode, cfg, ent, old_ent)
    assert v == pytest.approx(v_ref, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor(grad_ref, dtype=DT), atol=1e-6, rtol=0)


# ---------------------------------------------------------------- KL estimators and positive-sample loss
def test_kl_penalty_hand_values():
    # log π = log 0.5, log π_ref = 0: d = log(π_ref/π) = log 2
    lp, ref = torch.tensor([[math.log(0.5)]], dtype=DT), torch.zeros(1, 1, dtype=DT)
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(-math.log(2))  # log π - log π_ref
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)  # 0.2402
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(2 - math.log(2) - 1)  # e^d - d - 1 = 0.3069
    same = torch.randn(3, 4, dtype=DT)
    for kind in ("k1", "k2", "k3"):
        assert (kl_penalty(same, same, kind) == 0).all()
    assert (kl_penalty(torch.randn(5, 5), torch.randn(5, 5), "k3") >= 0).all()
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(lp, ref, "k4")


def test_positive_sample_loss_hand_values():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], dtype=DT, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # only row 0 is fully correct: NLL over its 2 response tokens = (1 + 2) / 2
    loss = positive_sample_loss(lp, mask, torch.tensor([True, False]))
    (grad,) = torch.autograd.grad(loss, lp)
    assert loss.item() == pytest.approx(1.5)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -0.5, 0], [0, 0, 0]], dtype=DT))
    loss = positive_sample_loss(lp, mask, torch.tensor([False, False]))
    assert loss.item() == 0.0 and loss.requires_grad
    assert (torch.autograd.grad(loss, lp)[0] == 0).all()


# ---------------------------------------------------------------- bad input
def _call(name="ppo_clip", **overrides):
    kw = dict(old_log_prob=torch.zeros(2, 4), log_prob=torch.zeros(2, 4), advantages=torch.zeros(2),
              response_mask=torch.ones(2, 4))
    kw.update(overrides)
    return compute_policy_loss(name, **kw)


def test_unknown_loss_lists_registered():
    with pytest.raises(ValueError) as e:
        _call("ppo")
    assert all(n in str(e.value) for n in LOSSES)


def test_erc_without_entropies_is_a_clear_error():
    with pytest.raises(ValueError, match="erc_low=0.8.*entropy"):
        _call(config={"erc_low": 0.8, "erc_high": 1.2})
    with pytest.raises(ValueError, match=r"entropy has shape \(2, 3\) but log_prob has shape \(2, 4\)"):
        _call(config={"erc_low": 0.8, "erc_high": 1.2}, entropy=torch.ones(2, 3), old_entropy=torch.ones(2, 4))


@pytest.mark.parametrize("overrides,message", [
    ({"log_prob": torch.zeros(2, 5)}, r"log_prob has shape \(2, 5\) but old_log_prob has shape \(2, 4\)"),
    ({"response_mask": torch.ones(3, 4)}, r"response_mask has shape \(3, 4\) but log_prob has shape \(2, 4\)"),
    ({"advantages": torch.zeros(3)}, r"advantages has shape \(3,\) but log_prob has shape \(2, 4\)"),
    ({"advantages": torch.zeros(2, 3)}, r"advantages has shape \(2, 3\) but log_prob has shape \(2, 4\)"),
])
def test_shape_errors_name_both_shapes(overrides, message):
    with pytest.raises(ValueError, match=message):
        _call(**overrides)


def test_config_is_strict():
    with pytest.raises(ValueError) as e:
        PolicyLossConfig.from_dict({"clip_ratio": 0.2})
    assert "clip_ratio" in str(e.value) and all(k in str(e.value) for k in ("clip_ratio_low", "erc_high"))
    with pytest.raises(ValueError, match="cliprange"):
        _call(config={"cliprange": 0.2})  # a mapping goes through from_dict
    assert PolicyLossConfig.from_dict({"beta_low": 0.5}) == PolicyLossConfig(beta_low=0.5)


@pytest.mark.parametrize("kwargs,field", [
    ({"clip_ratio_low": 1.0}, "clip_ratio_low"), ({"clip_ratio_low": -0.1}, "clip_ratio_low"),
    ({"clip_ratio_high": 0.0}, "clip_ratio_high"), ({"clip_ratio_c": 1.0}, "clip_ratio_c"),
    ({"beta_low": -1.0}, "beta_low"), ({"erc_low": 1.1, "erc_high": 1.2}, "erc_low"),
    ({"erc_low": 0.8, "erc_high": 0.9}, "erc_high"), ({"erc_low": 0.8}, "erc_high"),
    ({"loss_scale_factor": 0}, "loss_scale_factor"), ({"gppo_beta_scales_value": 1}, "gppo_beta_scales_value"),
    ({"clip_ratio_high": "0.28"}, "clip_ratio_high"),
])
def test_config_validation_names_field_and_value(kwargs, field):
    with pytest.raises(ValueError, match=field) as e:
        PolicyLossConfig(**kwargs)
    assert repr(kwargs.get(field)) in str(e.value)


def test_entropy_diagnostics_by_hand():
    from klear_lib.losses import entropy_diagnostics

    old = torch.tensor([[0.05, 0.05, 0.5, 0.5, 2.0, 2.0, 9.9]])
    new = torch.tensor([[0.04, 0.05, 0.5, 0.7, 2.0, 1.0, 9.9]])  # ρ: 0.8, 1, 1, 1.4, 1, 0.5, (padding)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    d = entropy_diagnostics(new, old, mask, erc_low=0.8, erc_high=1.2)
    assert d["erc/token_share_low"] == pytest.approx(2 / 6) and d["erc/token_share_high"] == pytest.approx(2 / 6)
    assert d["erc/masked_frac_low"] == pytest.approx(1 / 2)   # ρ = 0.8 <= 0.8 is stopped, ρ = 1 is not
    assert d["erc/masked_frac_mid"] == pytest.approx(1 / 2)   # ρ = 1.4 >= 1.2
    assert d["erc/masked_frac_high"] == pytest.approx(1 / 2)  # ρ = 0.5
    assert d["erc/ratio_p50"] == pytest.approx(1.0)
    rho = torch.tensor([0.8, 1.0, 1.0, 1.4, 1.0, 0.5])
    assert d["erc/ratio_p05"] == pytest.approx(float(torch.quantile(rho, 0.05)), rel=1e-5)
    off = entropy_diagnostics(new, old, mask)
    assert all(off[f"erc/masked_frac_{b}"] == 0 for b in ("low", "mid", "high"))
    assert entropy_diagnostics(new, old, torch.zeros_like(mask)) == {}
