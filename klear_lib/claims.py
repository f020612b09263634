"""Claims and their verdicts: one calibrated rule, used by every notebook.

A notebook tests a paper's claim by a paired comparison over seeds: seed s runs both arms from the same start
(the same SFT model, the same first rollout), so the effect is the mean over seeds of the per-seed difference
``d_s = a_s - b_s`` of a read-out declared before the run (an area under a curve, a final accuracy, ...).

The rule (``decide``), for n paired differences at level α = 0.05:

* the 95% interval is the paired Student-t interval, ``mean ± t_{0.975, n-1} · sd / √n``, and ``p_t`` its
  two-sided p-value;
* ``p_sign`` is the exact sign-flip p-value: the share of all 2^n sign patterns ``(±d_1, ..., ±d_n)`` whose mean
  is at least as far from 0 as the observed one (it cannot reach 0.05 below 6 seeds: its smallest value is
  2^(1-n));
* the claim's ``p_value`` is ``p_t`` below 6 seeds and ``max(p_t, p_sign)`` from 6 up, so ``p_value ≤ α`` means
  the t-interval excludes 0 and, from 6 seeds up, the distribution-free test agrees;
* ``reproduced`` when ``p_value ≤ α`` (the adjusted one for a secondary claim) and the effect has the paper's
  sign, ``reversed`` when it has the other sign, else ``inconclusive``; with fewer than 3 seeds always
  ``inconclusive``.

Why not the percentile bootstrap the first version used: over 3-4 differences its interval is (nearly) their
range, so it excluded 0 whenever (nearly) every seed agreed in sign, which two identical arms do 25% of the time
at 3 seeds and 20% at 4; the t-interval holds its 5% there (tests/test_claims.py measures both rules on null
data). The t quantiles come from the regularised incomplete beta function below (no SciPy dependency; checked
against tabulated values in the tests).

Roles, declared with the claim before any training (``params/<notebook>/claims.yaml``, ``load_declared``):
``primary`` (exactly one per notebook that tests a paper), ``secondary`` (Holm-adjusted p-values within the
notebook: ``finalize``), ``check`` (a positive control or pipeline check: ``pass``/``fail`` against what it must
show, never a verdict, never counted in the tally). A secondary that tests a rival explanation of the primary's
effect (the same comparison with volume, step size or the number of stopped tokens held equal) declares
``control_of: <the primary's id>``: the report then reads a reproduced primary beside a reversed control as the
paper's direction without the paper's explanation, and beside an inconclusive one as the direction with its
explanation left open. Every claim carries its ``mde``: the smallest effect the run
had 80% power to detect at its seeds and measured paired sd (``mde``: the t-test's normal-theory formula, and
from 6 to 15 seeds the whole rule's simulated value). A check may declare ``guards: [claim ids]`` (claims of the
same file): where it fails, the report marks each of those verdicts as not to be trusted. Beside the tested claims a
notebook may list the paper's claims it does not test at all, with why (``params/<notebook>/not_tested.yaml``,
``load_not_tested``).

Differences without spread. Where every paired difference is the same non-zero value (a read-out that moves in
steps, e.g. avg@4 of one question), the t statistic is x/0: the t-test has no noise to measure the effect against.
The rule then takes the sign-flip test's p as ``p_t`` (``paired_t``): 2^(1-n), so below 6 seeds (0.25, 0.125,
0.0625 at 3, 4, 5) such a claim is never decided, and from 6 seeds the rule gives what it gave before (its p was
already the sign-flip p there). The interval is the sign-flip test's, inverted: below 6 seeds it excludes no mean,
and is shown as ``mean ± |mean|`` (the narrowest interval about the mean that holds 0, which the test cannot
exclude; a display convention, not a 95% interval); from 6 seeds every other mean is excluded, ``[mean, mean]``.
Such a claim's MDE is null (no spread: the formula's 0 would say anything is detectable). Continuous null data
never lose their spread, so the false-positive rate measured in tests/test_claims.py is unchanged; on read-outs
in steps the rule now holds its 5% at 3-5 seeds (tested), where the old zero-spread branch decided every such tie.

What the report reads from a claim, computed here (``repeat_probability``, ``split_half_power``,
``familywise_rate``): the chance that a rerun repeats a decided verdict, the power of the split-half check, and the
chance that k claims held to α give at least one verdict by chance.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

ALPHA = 0.05
POWER = 0.8
MIN_SEEDS = 3  # below this no verdict other than inconclusive
SIGN_FLIP_FROM = 6  # from this many seeds the sign-flip test must agree
VERDICTS = ("reproduced", "reversed", "inconclusive")
CHECK_RESULTS = ("pass", "fail")
ROLES = ("primary", "secondary", "check")
BASE_FIELDS = ("id", "claim", "source", "metric", "role", "effect", "seeds", "verdict")  # every claim and check
PAIRED_FIELDS = ("ci_low", "ci_high", "p_value", "p_t", "p_sign", "sd", "mde", "per_seed", "direction")
CLAIM_FIELDS = BASE_FIELDS + PAIRED_FIELDS  # a primary or secondary claim (and a paired check)
OPTIONAL_FIELDS = ("note", "notebook", "scope", "p_adjusted", "expect", "outcome", "arms", "preset", "criterion",
                   "undetectable", "block_z", "control_of", "guards", "tied_at")
DECLARED_FIELDS = ("id", "role", "claim", "source", "metric", "direction", "scope")
DECLARED_OPTIONAL = ("expect", "arms", "requires", "control_of", "guards")


# -- Student's t distribution -----------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom: ½ · I_{df/(df+t²)}(df/2, ½) for t ≥ 0."""
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=4096)
def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t (bisection on ``t_sf``, to 1e-12; cached: the rule asks for few)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - q:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_sf(mid, df) > 1.0 - q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


# -- the tests --------------------------------------------------------------------------------------------------
# Differences no larger than this share of the read-outs' magnitude are float rounding, not an effect: float64
# rounds at 1.1e-16 an operation, and a read-out summed over thousands of terms stays far below 1e-9 of its size.
# Without it two identical arms whose read-outs differ by 1e-16 had no spread and were decided 84-89% of the time.
ROUNDING_TOLERANCE = 1e-9


def paired_t(diffs: Sequence[float], *, level: float = 1 - ALPHA, scale: float = 0.0) -> dict:
    """Mean, sd (n-1), the paired Student-t interval at ``level`` and the two-sided p-value of "mean = 0".
    ``scale``: the read-outs' magnitude (``paired_claim``: the largest |value| of either arm). When every difference
    is within ``ROUNDING_TOLERANCE`` of ``max(scale, 1e-300)`` the arms are the same to the float: p is 1 (the mean
    is reported as it is). Otherwise, when all differences are equal (no spread: t would be x/0), p is the sign-flip
    test's (``sign_flip_p``: 2^(1-n)), and the interval that test's, inverted: where 2^(1-n) is above 1 - ``level``
    it excludes no mean and is shown as ``mean ± |mean|`` (it holds 0; not a coverage interval), else it is
    ``[mean, mean]`` (the module's docstring: "Differences without spread")."""
    d = _clean(diffs)
    n = len(d)
    mean = float(np.mean(d))
    if n < 2:
        return {"mean": mean, "sd": float("nan"), "ci_low": mean, "ci_high": mean, "p": 1.0}
    sd = float(np.std(d, ddof=1))
    if float(np.max(np.abs(d))) <= ROUNDING_TOLERANCE * max(abs(float(scale)), 1e-300):
        return {"mean": mean, "sd": sd, "ci_low": float(np.min(d)), "ci_high": float(np.max(d)), "p": 1.0}
    if sd <= 1e-15 * max(1.0, abs(mean)):
        if mean == 0:
            return {"mean": mean, "sd": 0.0, "ci_low": mean, "ci_high": mean, "p": 1.0}
        p = sign_flip_p(d)
        half = abs(mean) if p > 1 - level else 0.0
        return {"mean": mean, "sd": 0.0, "ci_low": mean - half, "ci_high": mean + half, "p": p}
    se = sd / math.sqrt(n)
    half = t_quantile((1 + level) / 2, n - 1) * se
    p = min(1.0, 2.0 * t_sf(abs(mean) / se, n - 1))
    return {"mean": mean, "sd": sd, "ci_low": mean - half, "ci_high": mean + half, "p": p}


EXACT_SIGN_FLIP_MAX = 20  # up to this many differences every sign pattern is enumerated
SIGN_FLIP_DRAWS = 100_000  # beyond it, this many random patterns (a fixed seed: the same data, the same p)


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Two-sided sign-flip (randomisation) p-value of the mean: the share of the 2^n sign patterns
    ``(±d_1, ..., ±d_n)`` whose |mean| is at least the observed |mean| (the observed pattern counts, so
    p ≥ 2^(1-n)). Exact up to ``EXACT_SIGN_FLIP_MAX`` differences (enumerated in blocks); beyond (e.g. paired over
    a benchmark's problems), ``(1 + hits) / (1 + SIGN_FLIP_DRAWS)`` over random patterns drawn with a fixed seed
    (Monte Carlo error about 0.0007 at p 0.05)."""
    d = _clean(diffs)
    n = len(d)
    observed = abs(float(np.sum(d)))
    tol = 1e-12 * max(1.0, float(np.sum(np.abs(d))))
    if n > EXACT_SIGN_FLIP_MAX:
        rng = np.random.default_rng(0)
        hits = 0
        for start in range(0, SIGN_FLIP_DRAWS, 10_000):
            signs = rng.choice((-1.0, 1.0), size=(min(10_000, SIGN_FLIP_DRAWS - start), n))
            hits += int(np.count_nonzero(np.abs(signs @ d) >= observed - tol))
        return (1 + hits) / (1 + SIGN_FLIP_DRAWS)
    hits = 0
    low_n = min(n, 14)
    bits = (np.arange(1 << low_n)[:, None] >> np.arange(low_n)[None, :]) & 1
    low = (1 - 2 * bits.astype(float)) @ d[:low_n]  # (2^low_n,)
    rest = d[low_n:]
    for signs in itertools.product((1.0, -1.0), repeat=len(rest)):
        total = low + float(np.dot(signs, rest)) if len(rest) else low
        hits += int(np.count_nonzero(np.abs(total) >= observed - tol))
    return hits / float(1 << n)


# The whole rule's MDE in paired sds from 6 seeds on, where the sign-flip condition costs power: the effect at which
# the rule (t and sign-flip at the level) decides in 80% of 40,000 simulated sets of Gaussian differences (bisection
# on the effect; tests/test_claims.py re-measures entries). At 5% for 6-15 seeds; at Holm's first levels for up to
# four secondary claims (5%/2, /3, /4) up to 12 seeds; a level the sign-flip test cannot reach (its smallest p is
# 2^(1-n)) has no entry: ``mde`` returns infinity there. Below 6 seeds the rule is the t-test, and beyond the table
# the t formula is within about 4% of the simulated value (0.6% at 5% and 16 seeds).
RULE_MDE = {
    0.05: {6: 1.802, 7: 1.354, 8: 1.203, 9: 1.097, 10: 1.015, 11: 0.944, 12: 0.898, 13: 0.853, 14: 0.816, 15: 0.782},
    0.025: {7: 1.869, 8: 1.434, 9: 1.284, 10: 1.181, 11: 1.086, 12: 1.026},
    0.05 / 3: {7: 1.895, 8: 1.579, 9: 1.397, 10: 1.281, 11: 1.169, 12: 1.101},
    0.0125: {8: 1.932, 9: 1.500, 10: 1.358, 11: 1.240, 12: 1.159},
}


SPLIT_HALF_LIMIT = 3.0  # |split-half z| at or above this flags a run: 0.27% of runs under the rule's assumptions


def block_z(diffs: Sequence[float]) -> float | None:
    """The split-half z of a paired claim, recorded as ``block_z``: a consistency check inside one run (a check,
    never the verdict, and not a replication: both halves share the run's code, machine and procedure). The
    seeds, in their order, split into two halves (the first ceil(n/2), the rest), and the z of the difference
    between the two halves' mean effects. The pooled within-half t statistic (n - 2 degrees of freedom) is mapped
    through its distribution onto the standard normal, so that under the rule's assumptions (independent, normal
    paired differences) z is exactly N(0, 1); |z| >= ``SPLIT_HALF_LIMIT`` (0.27% under them) says the two halves
    disagree more than seed noise explains. It has little power (``split_half_power``: a true shift of one paired
    sd between the halves is flagged in about 7% of runs at 14 seeds), so a pass says little. None below 4 seeds or
    without spread inside the halves."""
    d = _clean(diffs)
    n = len(d)
    if n < 4:
        return None
    k = (n + 1) // 2
    first, second = d[:k], d[k:]
    within = float(np.sum((first - first.mean()) ** 2) + np.sum((second - second.mean()) ** 2))
    if within <= 0:
        return None
    gap = float(first.mean() - second.mean())
    t = gap / math.sqrt(within / (n - 2) * (1 / k + 1 / (n - k)))
    upper = max(t_sf(abs(t), n - 2), 1e-300)  # P(T > |t|)
    return math.copysign(-statistics.NormalDist().inv_cdf(upper), t) if upper < 0.5 else 0.0


def mde(sd: float, n: int, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference the rule detects with probability ``power`` at ``n`` seeds, paired sd
    ``sd`` and level ``alpha`` (a secondary claim's: Holm's first level, ``ALPHA / m`` for m secondaries). For the
    two-sided paired t-test: ``(t_{1-α/2, n-1} + t_{power, n-1}) · sd / √n`` (normal approximation with t
    quantiles); with the sign-flip condition (from 6 seeds), the simulated ``RULE_MDE`` where it has the level and
    ``n`` (1.80 sd against the t-test's 1.42 at 6 seeds and 5%), and infinity where the sign-flip test cannot reach
    the level (2^(1-n) > α: no effect can be detected). NaN below 2 seeds."""
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    if n >= SIGN_FLIP_FROM and 2.0 ** (1 - n) > alpha:
        return float("inf")
    table = next((t for a, t in RULE_MDE.items() if math.isclose(a, alpha, rel_tol=1e-9)), None)
    if power == POWER and table is not None and n in table:
        return table[n] * sd
    return (t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def seeds_for_power(effect_over_sd: float, *, alpha: float = ALPHA, power: float = POWER, max_n: int = 10_000) -> int:
    """Seeds a paired t-test needs to detect ``effect_over_sd`` (the effect in paired sds) with ``power``."""
    if effect_over_sd <= 0:
        raise ValueError(f"effect_over_sd must be positive, got {effect_over_sd}")
    for n in range(2, max_n):
        if mde(1.0, n, alpha=alpha, power=power) <= effect_over_sd:
            return n
    return max_n


# -- what a verdict is worth: the chance it repeats, the split-half check's power, verdicts by chance ------------
def normal_cdf(x: float) -> float:
    """Φ(x), the standard normal distribution function."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def noncentral_t_sf(t: float, df: float, ncp: float, *, intervals: int = 2000) -> float:
    """P(T > t) for the noncentral t with ``df`` degrees of freedom and noncentrality ``ncp``: T = (Z + ncp) / S with
    S = sqrt(V / df), V ~ χ²_df, so P(T > t) = E_S[Φ(ncp - t·S)], integrated by Simpson's rule over S's density on
    [0, 1 + 10/√df] (the density beyond is below 1e-20 of its peak; about 1e-9 absolute error, checked against
    ``t_sf`` at ncp 0 and a simulation in the tests). No SciPy: the same reason as ``t_sf``."""
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}")
    smax = 1.0 + 10.0 / math.sqrt(df)
    s = np.linspace(0.0, smax, intervals + 1)
    const = math.log(2.0) + (df / 2.0) * math.log(df / 2.0) - math.lgamma(df / 2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_density = const + (df - 1.0) * np.log(s) - df * s * s / 2.0
    log_density[0] = const if df == 1 else -np.inf  # s^0 = 1 at df 1; s^(df-1) = 0 above
    density = np.exp(log_density)
    phi = np.array([normal_cdf(ncp - t * x) for x in s])
    g = density * phi
    h = smax / intervals
    return float(min(1.0, max(0.0, h / 3.0 * (g[0] + g[-1] + 4.0 * g[1:-1:2].sum() + 2.0 * g[2:-1:2].sum()))))


def _rule_table(alpha: float) -> dict | None:
    return next((t for a, t in RULE_MDE.items() if math.isclose(a, alpha, rel_tol=1e-9)), None)


@functools.lru_cache(maxsize=256)
def rule_critical_t(n: int, alpha: float = ALPHA) -> float:
    """The t statistic a claim of ``n`` seeds must reach, one-sided, for the rule at level ``alpha`` to decide it, as
    a normal-theory stand-in for the whole rule: below 6 seeds the t-test's own ``t_{1-α/2, n-1}``; from 6 seeds,
    where the sign-flip test must agree too, the critical value at which the noncentral t has 80% power at the
    rule's simulated MDE (``RULE_MDE``), so that the stand-in matches the simulated rule exactly there (and, measured
    in tests/test_claims.py, within 4 points of a simulation of the rule from 0.5 to 3 paired sds at 6-14 seeds:
    lower at 6-7 seeds, the stand-in never above the simulated rule by more than 1 point at 5%). Where ``RULE_MDE``
    has no entry (another level, or above 15 seeds) the t-test's value: there the stand-in is up to about 2 points
    above the simulated rule (14 seeds at 0.05/3)."""
    table = _rule_table(alpha)
    plain = t_quantile(1 - alpha / 2, n - 1)
    if n < SIGN_FLIP_FROM or table is None or n not in table:
        return plain
    ncp = table[n] * math.sqrt(n)
    lo, hi = 0.0, plain * 4.0
    for _ in range(80):
        mid = (lo + hi) / 2.0
        if noncentral_t_sf(mid, n - 1, ncp) > POWER:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def repeat_probability(effect_over_sd: float, n: int, *, alpha: float = ALPHA) -> float:
    """The probability that an independent rerun with ``n`` seeds reaches the same decided verdict (reproduced
    again, or reversed again) under the rule at level ``alpha``, if the true standardised effect (the mean paired
    difference over its sd, Cohen's d_z) were ``effect_over_sd``, the one measured: the plug-in estimate.

    Normal theory: the rerun's t statistic is noncentral t with n - 1 degrees of freedom and noncentrality
    ``|effect_over_sd| · √n``; the rerun decides the same way when it reaches ``rule_critical_t(n, alpha)`` with the
    same sign (the t-test at ``alpha`` two-sided, and from 6 seeds the sign-flip test through the rule's simulated
    MDE; a decision the other way does not count). Where the rule cannot decide at all (fewer than ``MIN_SEEDS``
    seeds; from 6 seeds a level below the sign-flip test's smallest p, 2^(1-n)) it is 0. At the rule's MDE it is
    0.8 by construction (``mde``), so a decided effect smaller than its MDE repeats with probability under 0.8.

    For a secondary claim the caller passes Bonferroni's ``ALPHA / m`` for m secondaries, Holm's first level: Holm
    decides every claim Bonferroni does, so that is a lower bound on the rerun's chance under Holm (the MDE of a
    secondary is taken at the same level).

    What it is not: the chance the paper is right, or a rerun on another machine that trains other starts (the seeds
    of one run vary only what they vary). It takes the measured effect and sd as true, and both are noisy; an
    effect that passed the rule tends to be measured larger than it is, so for a verdict that only just passed
    the estimate is optimistic."""
    if n < MIN_SEEDS or (n >= SIGN_FLIP_FROM and 2.0 ** (1 - n) > alpha):
        return 0.0
    delta = abs(float(effect_over_sd))
    if not math.isfinite(delta):
        raise ValueError(f"effect_over_sd must be finite, got {effect_over_sd!r} (no spread: nothing to estimate)")
    return noncentral_t_sf(rule_critical_t(n, alpha), n - 1, delta * math.sqrt(n))


def split_half_power(n: int, shift: float = 1.0, *, limit: float = SPLIT_HALF_LIMIT) -> float | None:
    """The chance that the split-half check (``block_z``) flags a run of ``n`` seeds (|z| >= ``limit``) whose two
    halves truly differ by ``shift`` paired sds (the sd of the differences within a half): the pooled t of the two
    halves is noncentral t with n - 2 degrees of freedom and noncentrality ``shift / sqrt(1/k + 1/(n-k))`` (k =
    ceil(n/2)), and |z| >= limit is |t| at or beyond the t quantile with the normal's tail beyond ``limit``. At 14
    seeds and a 1-sd shift about 7%; at shift 0 it is the false-alarm rate, 2·Φ(-3) = 0.27%. None below 4 seeds
    (no split-half z there)."""
    if n < 4:
        return None
    k = (n + 1) // 2
    df = n - 2
    ncp = float(shift) / math.sqrt(1.0 / k + 1.0 / (n - k))
    critical = t_quantile(1.0 - normal_cdf(-limit), df)
    return noncentral_t_sf(critical, df, ncp) + noncentral_t_sf(critical, df, -ncp)


def familywise_rate(k: int, alpha: float = ALPHA) -> float:
    """The chance that at least one of ``k`` independent claims, each held to ``alpha`` and none with an effect,
    comes out decided (reproduced or reversed): ``1 - (1 - alpha)^k`` (26% for 6 claims at 5%). The rule holds each
    claim to at most ``alpha`` on null data (tests/test_claims.py), so for independent claims this is an upper
    bound; claims that share runs (a second read-out of the same runs) are not independent."""
    if k < 0:
        raise ValueError(f"k must be a count, got {k}")
    return 1.0 - (1.0 - alpha) ** k


def tied(diffs: Sequence[float]) -> list[bool]:
    """Which paired differences are 0 to the sign-flip test's tolerance (``sign_flip_p``: sums within 1e-12 of the
    differences' total count as equal): the two arms gave the same read-out on that seed (both at a ceiling, say).
    Flipping such a seed's sign changes nothing, so each one halves the patterns that can beat the observed mean
    and doubles the smallest p the sign-flip test can give."""
    d = [abs(float(x)) for x in diffs]
    tol = 1e-12 * max(1.0, sum(d))
    return [2 * x <= tol for x in d]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (the same order as given): the k-th smallest p is multiplied by
    (m - k + 1), running maxima taken, capped at 1."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [0.0] * m
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * float(p_values[i])))
        out[i] = running
    return out


def decide(effect: float, p_value: float, seeds: int, direction: int = 1, *, alpha: float = ALPHA) -> str:
    """The verdict: ``reproduced`` / ``reversed`` when ``p_value ≤ alpha`` and the effect has (or has not) the
    paper's sign ``direction``; ``inconclusive`` otherwise, and always below ``MIN_SEEDS`` seeds."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction!r}")
    if seeds < MIN_SEEDS or not p_value <= alpha or effect == 0:
        return "inconclusive"
    return "reproduced" if (effect > 0) == (direction == 1) else "reversed"


def _clean(diffs: Sequence[float]) -> np.ndarray:
    d = np.asarray([float(x) for x in diffs], dtype=float)
    if d.size == 0:
        raise ValueError("a claim needs at least one paired difference")
    if not np.all(np.isfinite(d)):
        raise ValueError(f"a paired difference is not finite: {d.tolist()}")
    return d


# -- claims -----------------------------------------------------------------------------------------------------
def paired_claim(id: str, claim: str, source: str, metric: str, a: Mapping, b: Mapping, *, direction: int = 1,
                 role: str = "primary", note: str = "", scope: str = "", expect: str | None = None,
                 alpha: float = ALPHA) -> dict:
    """A claim from per-seed read-outs of two arms: ``a`` and ``b`` map seed -> value; the effect is the mean of
    ``a[s] - b[s]`` over the seeds both have. ``direction``: +1 if the paper says a > b, -1 if a < b. A
    ``check`` gives ``pass`` when the rule's outcome is ``expect`` (``reproduced`` for a positive control,
    ``inconclusive`` for an A/A pair), else ``fail``. A secondary's verdict is final only after ``finalize``
    (Holm within the notebook). Seeds whose two arms gave the same read-out (``tied``) are recorded in ``tied_at``
    (seed -> the value both arms had), so that the report can name a tie for what it is (both arms at a ceiling)."""
    if role not in ROLES:
        raise ValueError(f"claim {id!r}: role must be one of {ROLES}, got {role!r}")
    if role == "check" and expect not in VERDICTS:
        raise ValueError(f"claim {id!r}: a check needs expect= one of {VERDICTS}, got {expect!r}")
    seeds = sorted(set(a) & set(b), key=str)
    if not seeds:
        raise ValueError(f"claim {id!r}: the two arms share no seed (a: {sorted(a, key=str)}, b: {sorted(b, key=str)})")
    diffs = [float(a[s]) - float(b[s]) for s in seeds]
    t = paired_t(diffs, level=1 - alpha, scale=max(max(abs(float(a[s])), abs(float(b[s]))) for s in seeds))
    n = len(diffs)
    p_sign = sign_flip_p(diffs)
    p = t["p"] if n < SIGN_FLIP_FROM else max(t["p"], p_sign)
    out = {"id": id, "claim": claim, "source": source, "metric": metric, "role": role, "effect": t["mean"],
           "ci_low": t["ci_low"], "ci_high": t["ci_high"], "seeds": n, "p_value": p, "p_t": t["p"],
           "p_sign": p_sign, "sd": t["sd"] if n > 1 else None, **_mde_fields(t["sd"], n, alpha),
           "per_seed": {str(s): d for s, d in zip(seeds, diffs)}, "direction": direction,
           "block_z": block_z(diffs)}
    ties = {str(s): float(a[s]) for s, tie in zip(seeds, tied(diffs)) if tie}
    if ties:
        out["tied_at"] = ties
    outcome = decide(t["mean"], p, n, direction, alpha=alpha)
    if role == "check":
        out.update(expect=expect, outcome=outcome, verdict="pass" if outcome == expect else "fail")
    else:
        out["verdict"] = outcome
    if role == "secondary":
        out["p_adjusted"] = p
    if note:
        out["note"] = note
    if scope:
        out["scope"] = scope
    return out


def _mde_fields(sd: float, n: int, alpha: float) -> dict:
    """``mde`` (null below 2 seeds, where nothing is detectable, and without spread: sd 0 would make it 0, as if any
    effect were detectable), and ``undetectable: True`` where nothing is."""
    value = mde(sd, n, alpha=alpha)
    if math.isinf(value):
        return {"mde": None, "undetectable": True}
    return {"mde": None if sd == 0 else _none_if_nan(value)}


def _none_if_nan(x: float):
    """NaN (one seed) and infinity (no effect detectable at these seeds) are written as null."""
    return None if x is None or not math.isfinite(x) else x


def check(id: str, claim: str, source: str, metric: str, passed: bool, value: float, *, criterion: str,
          seeds: int = 1, note: str = "", scope: str = "") -> dict:
    """A pipeline check that is not a paired comparison (e.g. "every loss gave the same run on-policy"):
    ``pass``/``fail`` by ``passed``, with the measured ``value`` and the ``criterion`` it was held to."""
    out = {"id": id, "claim": claim, "source": source, "metric": metric, "role": "check", "effect": float(value),
           "seeds": int(seeds), "verdict": "pass" if passed else "fail", "criterion": criterion}
    if note:
        out["note"] = note
    if scope:
        out["scope"] = scope
    return out


def finalize(claim_list: list[dict], declared: Mapping[str, Mapping] | None = None, *, alpha: float = ALPHA,
             where: str = "claims") -> list[dict]:
    """Holm-adjust the secondary claims' p-values within the list (a notebook's claims) and set their verdicts;
    check roles (exactly one primary unless the list has only checks) and, given the declarations, that the list
    holds exactly the declared claims with their declared role, direction and wording. Returns the list."""
    if declared is not None:
        got = [c["id"] for c in claim_list]
        missing = [i for i in declared if i not in got]
        extra = [i for i in got if i not in declared]
        if missing or extra:
            raise ValueError(f"{where}: the claims differ from the declared ones: missing {missing}, undeclared "
                             f"{extra} (declared: {list(declared)})")
        for c in claim_list:
            d = declared[c["id"]]
            for f in ("role", "direction", "claim", "source", "metric"):
                if f in c and c[f] != d[f]:
                    raise ValueError(f"{where} ({c['id']}): {f} {c[f]!r} differs from the declared {d[f]!r}")
            for f in ("control_of", "guards"):  # declared_claim / declared_check carry them; a hand-made claim may not
                if c.get(f) != d.get(f):
                    raise ValueError(f"{where} ({c['id']}): {f} {c.get(f)!r} differs from the declared {d.get(f)!r}")
    roles = [c["role"] for c in claim_list]
    if any(r != "check" for r in roles) and roles.count("primary") != 1:
        raise ValueError(f"{where}: a notebook that tests a paper declares exactly one primary claim, got "
                         f"{roles.count('primary')} ({[c['id'] for c in claim_list if c['role'] == 'primary']})")
    secondary = [c for c in claim_list if c["role"] == "secondary"]
    for c, p_adj in zip(secondary, holm([c["p_value"] for c in secondary])):
        c["p_adjusted"] = p_adj
        c["verdict"] = decide(c["effect"], p_adj, c["seeds"], c["direction"], alpha=alpha)
        # the MDE at the first level Holm holds it to (alpha / m): what the run could detect as a secondary
        c.pop("undetectable", None)
        c.update(_mde_fields(c["sd"] if c["sd"] is not None else float("nan"), c["seeds"], alpha / len(secondary)))
    return validate_claims(claim_list, where=where, alpha=alpha)


def expected_verdict(c: Mapping, *, alpha: float = ALPHA) -> str:
    """What the rule gives for a claim's fields (the adjusted p for a secondary; pass/fail for a check)."""
    if c["role"] == "check":
        outcome = decide(c["effect"], c["p_value"], c["seeds"], c["direction"], alpha=alpha)
        return "pass" if outcome == c.get("expect") else "fail"
    p = c.get("p_adjusted", c["p_value"]) if c["role"] == "secondary" else c["p_value"]
    return decide(c["effect"], p, c["seeds"], c["direction"], alpha=alpha)


def validate_claims(claims, *, where: str = "claims", alpha: float = ALPHA) -> list[dict]:
    """Check a list of claims (the ``summary["claims"]`` contract); raise ValueError naming the claim and the
    field. A primary or secondary claim, and a check against an expected verdict, carry the paired statistics
    (``CLAIM_FIELDS``); a plain check (``check``) carries ``BASE_FIELDS`` and its ``criterion``. Returns the list."""
    if not isinstance(claims, list):
        raise ValueError(f"{where} must be a list of claim dicts, got {type(claims).__name__}")
    ids = set()
    for i, c in enumerate(claims):
        at = f"{where}[{i}]"
        if not isinstance(c, Mapping):
            raise ValueError(f"{at} must be a dict, got {type(c).__name__}")
        plain = c.get("role") == "check" and "expect" not in c
        required = BASE_FIELDS + (("criterion",) if plain else PAIRED_FIELDS)
        missing = [f for f in required if f not in c]
        if missing:
            raise ValueError(f"{at} ({c.get('id', '?')}): missing field(s) {missing}")
        unknown = sorted(set(c) - set(CLAIM_FIELDS) - set(OPTIONAL_FIELDS))
        if unknown:
            raise ValueError(f"{at} ({c['id']}): unknown field(s) {unknown}; "
                             f"fields: {list(CLAIM_FIELDS + OPTIONAL_FIELDS)}")
        at = f"{at} ({c['id']})"
        for f in ("id", "claim", "source", "metric"):
            if not isinstance(c[f], str) or not c[f]:
                raise ValueError(f"{at}.{f} must be a non-empty string, got {c[f]!r}")
        if c["role"] not in ROLES:
            raise ValueError(f"{at}.role must be one of {ROLES}, got {c['role']!r}")
        if not _finite(c["effect"]):
            raise ValueError(f"{at}.effect must be a finite number, got {c['effect']!r}")
        if not isinstance(c["seeds"], int) or isinstance(c["seeds"], bool) or c["seeds"] < (0 if plain else 1):
            raise ValueError(f"{at}.seeds must be a positive int, got {c['seeds']!r}")
        allowed = CHECK_RESULTS if c["role"] == "check" else VERDICTS
        if c["verdict"] not in allowed:
            raise ValueError(f"{at}.verdict must be one of {allowed} for a {c['role']} claim, got {c['verdict']!r}")
        if not plain:
            _validate_paired(c, at, alpha)
        if c["id"] in ids:
            raise ValueError(f"{at}: claim id {c['id']!r} is used twice")
        ids.add(c["id"])
    primaries = [c["id"] for c in claims if c["role"] == "primary"]
    for i, c in enumerate(claims):
        if "control_of" in c and (c["role"] != "secondary" or c["control_of"] not in primaries):
            raise ValueError(f"{where}[{i}] ({c['id']}).control_of must name the primary claim of the list "
                             f"({', '.join(primaries) or 'none'}) from a secondary claim; got {c['control_of']!r} "
                             f"on a {c['role']} claim")
        if "guards" in c:
            _check_guards(c, None, f"{where}[{i}] ({c['id']})")
    return claims


def _validate_paired(c: Mapping, at: str, alpha: float) -> None:
    for f in ("ci_low", "ci_high"):
        if not _finite(c[f]):
            raise ValueError(f"{at}.{f} must be a finite number, got {c[f]!r}")
    for f in ("p_value", "p_t", "p_sign") + (("p_adjusted",) if c["role"] == "secondary" else ()):
        if f not in c or not _finite(c[f]) or not 0 <= c[f] <= 1:
            raise ValueError(f"{at}.{f} must be a probability, got {c.get(f)!r}")
    for f in ("sd", "mde"):
        if c[f] is not None and (not _finite(c[f]) or c[f] < 0):
            raise ValueError(f"{at}.{f} must be a non-negative number or null, got {c[f]!r}")
    if not isinstance(c["per_seed"], Mapping) or len(c["per_seed"]) != c["seeds"]:
        raise ValueError(f"{at}.per_seed must map each of the {c['seeds']} seeds to its difference")
    if c["direction"] not in (1, -1):
        raise ValueError(f"{at}.direction must be +1 or -1, got {c['direction']!r}")
    if c.get("block_z") is not None and not _finite(c["block_z"]):
        raise ValueError(f"{at}.block_z must be a finite number or null, got {c['block_z']!r}")
    if "tied_at" in c and (not isinstance(c["tied_at"], Mapping) or not set(c["tied_at"]) <= set(c["per_seed"])
                           or not all(_finite(v) for v in c["tied_at"].values())):
        raise ValueError(f"{at}.tied_at must map seeds of per_seed to the value both arms had, got {c['tied_at']!r}")
    if not c["ci_low"] - 1e-12 <= c["effect"] <= c["ci_high"] + 1e-12:
        raise ValueError(f"{at}: effect {c['effect']} is outside its interval [{c['ci_low']}, {c['ci_high']}]")
    expected = expected_verdict(c, alpha=alpha)
    if c["verdict"] != expected:
        p = c.get("p_adjusted", c["p_value"])
        raise ValueError(f"{at}: verdict {c['verdict']!r} does not follow from effect {c['effect']:.4g}, p "
                         f"{p:.4g} at {c['seeds']} seeds (direction {c['direction']}): the rule gives {expected!r}")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# -- declarations -----------------------------------------------------------------------------------------------
def load_declared(path: str | Path) -> dict[str, dict]:
    """A notebook's claims as declared before any training: ``params/<notebook>/claims.yaml``, a list of
    mappings with ``id``, ``role``, ``claim``, ``source``, ``metric``, ``direction`` (+1 / -1: the paper's
    sign of a - b) and ``scope`` (one line: what the stand-in can and cannot show for this claim), and for a
    check ``expect``, and optionally ``requires`` (the parameters the claim needs, read by ``made``). Errors name
    the file, the entry and the field. A check may declare ``guards``: the ids of claims in the same file whose
    verdicts it guards (``_check_guards``)."""
    import yaml

    path = Path(path)
    try:
        items = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no claims declared: {path} does not exist") from None
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path}: expected a non-empty list of claims, got {type(items).__name__}")
    out: dict[str, dict] = {}
    for i, d in enumerate(items):
        at = f"{path} entry {i}" + (f" ({d.get('id')})" if isinstance(d, Mapping) else "")
        if not isinstance(d, Mapping):
            raise ValueError(f"{at}: expected a mapping, got {type(d).__name__}")
        missing = [f for f in DECLARED_FIELDS if f not in d]
        unknown = sorted(set(d) - set(DECLARED_FIELDS) - set(DECLARED_OPTIONAL))
        if missing or unknown:
            raise ValueError(f"{at}: missing field(s) {missing}, unknown field(s) {unknown}; "
                             f"fields: {list(DECLARED_FIELDS + DECLARED_OPTIONAL)}")
        for f in ("id", "claim", "source", "metric", "scope"):
            if not isinstance(d[f], str) or not d[f].strip():
                raise ValueError(f"{at}.{f} must be a non-empty string, got {d[f]!r}")
        if d["role"] not in ROLES:
            raise ValueError(f"{at}.role must be one of {ROLES}, got {d['role']!r}")
        if d["direction"] not in (1, -1):
            raise ValueError(f"{at}.direction must be 1 or -1, got {d['direction']!r}")
        if "expect" in d and d["role"] != "check":
            raise ValueError(f"{at}: expect (one of {VERDICTS}) is given for checks only")
        if "expect" in d and d["expect"] not in VERDICTS:
            raise ValueError(f"{at}.expect must be one of {VERDICTS}, got {d['expect']!r}")
        if "requires" in d:
            _check_requires(d["requires"], at)
        if d["id"] in out:
            raise ValueError(f"{at}: claim id {d['id']!r} is declared twice")
        out[d["id"]] = dict(d)
    roles = [d["role"] for d in out.values()]
    if any(r != "check" for r in roles) and roles.count("primary") != 1:
        raise ValueError(f"{path}: a notebook that tests a paper declares exactly one primary claim, got "
                         f"{roles.count('primary')}")
    for cid, d in out.items():
        if "control_of" in d:
            _check_control_of(d, out, f"{path} ({cid})")
        if "guards" in d:
            _check_guards(d, out, f"{path} ({cid})")
    return out


def _check_guards(d: Mapping, declared: Mapping[str, Mapping] | None, at: str) -> None:
    """``guards`` is on a check, a non-empty list of distinct claim ids other than its own, each declared in the same
    file (``declared``; None for a recorded claim, whose file is not at hand): where the check fails, the report
    marks each guarded verdict as not to be trusted (a pipeline that did not do what the comparison needs)."""
    ids = d["guards"]
    if d["role"] != "check":
        raise ValueError(f"{at}.guards: only a check guards other claims, this one is a {d['role']}")
    if (not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i.strip() for i in ids)
            or len(set(ids)) != len(ids)):
        raise ValueError(f"{at}.guards must be a non-empty list of distinct claim ids, got {ids!r}")
    if d["id"] in ids:
        raise ValueError(f"{at}.guards names the check itself")
    unknown = [i for i in ids if declared is not None and i not in declared]
    if unknown:
        raise ValueError(f"{at}.guards names claim(s) not declared in the same file: {unknown} (declared: "
                         f"{', '.join(declared)})")


def _check_control_of(d: Mapping, declared: Mapping[str, Mapping], at: str) -> None:
    """A declared ``control_of`` names the primary claim of the same file, and only a secondary has one: its
    verdict (reproduced / reversed) is what the report reads against the primary's explanation; a check has
    pass/fail, and a primary controls nothing."""
    target = d["control_of"]
    primaries = [i for i, e in declared.items() if e["role"] == "primary"]
    if d["role"] != "secondary":
        raise ValueError(f"{at}.control_of: only a secondary claim is a control of the primary, this one is a "
                         f"{d['role']}")
    if not isinstance(target, str) or target not in primaries:
        raise ValueError(f"{at}.control_of must name the primary claim declared in the same file "
                         f"({', '.join(primaries) or 'none declared'}), got {target!r}")


RETIRED_FIELDS = ("id", "retired", "why", "last_result", "results_entry")


def load_retired(path: str | Path) -> dict[str, dict]:
    """The claims a notebook once declared and no longer tests: ``params/<notebook>/retired.yaml``, a list of
    mappings with every one of ``RETIRED_FIELDS`` (a non-empty string each): ``retired`` when and in which commit,
    ``why``, ``last_result`` (its effect, interval, p and verdict in the last run that tested it) and
    ``results_entry`` (the heading of the ``docs/results.md`` entry that holds that run). A claim never leaves
    ``claims.yaml`` without a trace; ``{}`` when the file does not exist. Errors name the file, the entry and the
    field."""
    import yaml

    path = Path(path)
    if not path.is_file():
        return {}
    entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of retired claims, got {type(entries).__name__}")
    out: dict[str, dict] = {}
    for i, e in enumerate(entries):
        at = f"{path}[{i}]"
        if not isinstance(e, dict) or set(e) != set(RETIRED_FIELDS):
            raise ValueError(f"{at}: a retired claim has exactly the fields {list(RETIRED_FIELDS)}, got "
                             f"{sorted(e) if isinstance(e, dict) else type(e).__name__}")
        for f in RETIRED_FIELDS:
            if not isinstance(e[f], str) or not e[f].strip():
                raise ValueError(f"{at} ({e.get('id')}).{f} must be a non-empty string, got {e[f]!r}")
        if e["id"] in out:
            raise ValueError(f"{at}: claim id {e['id']!r} is retired twice")
        out[e["id"]] = dict(e)
    return out


NOT_TESTED_FIELDS = ("id", "claim", "source", "reason")


def load_not_tested(path: str | Path) -> dict[str, dict]:
    """The paper's claims a notebook declares it does not test at all (``params/<notebook>/not_tested.yaml``): a list
    of mappings with every one of ``NOT_TESTED_FIELDS`` (a non-empty string each): ``claim`` in the paper's words,
    its ``source``, and the ``reason`` the stand-in does not test it (no code sources, say). The report lists them
    apart, never counted; ``{}`` when the file does not exist. Errors name the file, the entry and the field."""
    import yaml

    path = Path(path)
    if not path.is_file():
        return {}
    entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of claims not tested (each with {list(NOT_TESTED_FIELDS)}), got "
                         f"{type(entries).__name__}")
    out: dict[str, dict] = {}
    for i, e in enumerate(entries):
        if not isinstance(e, Mapping):
            raise ValueError(f"{path} entry {i}: expected a mapping with {list(NOT_TESTED_FIELDS)}, got "
                             f"{type(e).__name__}")
        at = f"{path} entry {i}" + (f" ({e['id']})" if isinstance(e.get("id"), str) else "")
        missing = [f for f in NOT_TESTED_FIELDS if f not in e]
        if missing:
            raise ValueError(f"{at}: missing key(s) {missing}; a claim not tested has {list(NOT_TESTED_FIELDS)}")
        unknown = sorted(set(e) - set(NOT_TESTED_FIELDS), key=str)
        if unknown:
            raise ValueError(f"{at}: unknown key(s) {unknown}; a claim not tested has {list(NOT_TESTED_FIELDS)}")
        for f in NOT_TESTED_FIELDS:
            if not isinstance(e[f], str) or not e[f].strip():
                raise ValueError(f"{at}.{f} must be a non-empty string, got {e[f]!r}")
        if e["id"] in out:
            raise ValueError(f"{at}: claim id {e['id']!r} is listed twice")
        out[e["id"]] = dict(e)
    return out


def _check_requires(req, at: str) -> None:
    if not isinstance(req, Mapping) or not req:
        raise ValueError(f"{at}.requires must be a mapping of parameter -> what it must hold, got {req!r}")
    for key, want in req.items():
        items = want if isinstance(want, list) else [want]
        ok = bool(items) and (want is True or all(
            isinstance(w, (str, int, float)) and not isinstance(w, bool) and str(w).strip() for w in items))
        if not isinstance(key, str) or not ok:
            raise ValueError(f"{at}.requires.{key}: expected true (the parameter is set: true, or a non-empty "
                             f"list) or an item, or a list of items, of the parameter's comma-separated list; got "
                             f"{want!r}")


def _same_item(have: str, want) -> bool:
    if have == str(want).strip():
        return True
    try:
        return float(have) == float(want)
    except ValueError:
        return False


def requirement_met(value, want) -> bool:
    """Whether a notebook parameter's ``value`` holds ``want`` (a declared claim's ``requires`` entry): ``true``
    when the value is set (a true flag, a non-empty list); an item, or a list of items, when each is among the
    value's comma-separated items (numbers compare as numbers: ``0.2`` is in ``"0,0.1,0.20"``)."""
    if want is True:
        return bool(value.strip()) if isinstance(value, str) else bool(value)
    have = [x.strip() for x in str(value).split(",") if x.strip()]
    return all(any(_same_item(h, w) for h in have) for w in (want if isinstance(want, list) else [want]))


def made(declared: Mapping[str, Mapping], params: Mapping, *, where: str = "claims") -> dict[str, dict]:
    """The declared claims a run with notebook parameters ``params`` makes: those whose ``requires`` (declared
    beside the claim: which arms, subsets or flags it needs) the parameters meet. A preset that leaves an arm out
    leaves its claims out by this one rule, read by the notebook (``finalize`` then wants exactly these claims)
    and by the tests of the presets."""
    out = {}
    for cid, d in declared.items():
        req = d.get("requires") or {}
        absent = [k for k in req if k not in params]
        if absent:
            raise KeyError(f"{where}: claim {cid!r} requires parameter(s) {absent}, which the notebook does not have")
        if all(requirement_met(params[k], w) for k, w in req.items()):
            out[cid] = d
    return out


def declared_claim(declared: Mapping[str, Mapping], id: str, a: Mapping, b: Mapping, *, note: str = "",
                   alpha: float = ALPHA) -> dict:
    """``paired_claim`` with the wording, role, direction, scope and expectation of the declared claim ``id``, and
    its ``control_of`` (the report reads the control beside its primary) and, for a paired check, its ``guards``,
    where it declares them."""
    if id not in declared:
        raise KeyError(f"claim {id!r} is not declared (declared: {list(declared)})")
    d = declared[id]
    out = paired_claim(id, d["claim"], d["source"], d["metric"], a, b, direction=d["direction"], role=d["role"],
                       note=note, scope=d["scope"], expect=d.get("expect"), alpha=alpha)
    for f in ("control_of", "guards"):
        if f in d:
            out[f] = list(d[f]) if f == "guards" else d[f]
    return out


def declared_check(declared: Mapping[str, Mapping], id: str, passed: bool, value: float, *, criterion: str,
                   seeds: int = 1, note: str = "") -> dict:
    """``check`` with the wording and scope of the declared check ``id``, and its ``guards`` where it declares them
    (the claims whose verdicts the report marks as not to be trusted when it fails)."""
    if id not in declared:
        raise KeyError(f"check {id!r} is not declared (declared: {list(declared)})")
    d = declared[id]
    if d["role"] != "check" or "expect" in d:
        raise ValueError(f"{id!r} is declared as a {d['role']} claim" + (" with expect" if "expect" in d else "") +
                         ": use declared_claim")
    out = check(id, d["claim"], d["source"], d["metric"], passed, value, criterion=criterion, seeds=seeds,
                note=note, scope=d["scope"])
    if "guards" in d:
        out["guards"] = list(d["guards"])
    return out


# -- read-outs of a curve ----------------------------------------------------------------------------------------
def area_under_curve(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Trapezoidal area under ``ys`` over ``xs``, divided by the span of ``xs``: the curve's mean level (in the
    units of ``ys``), so that runs of the same length compare. Points are sorted by x; NaN points are dropped."""
    pts = sorted((float(x), float(y)) for x, y in zip(xs, ys) if not math.isnan(float(y)))
    if len(pts) < 2:
        raise ValueError(f"area_under_curve needs two points, got {pts}")
    span = pts[-1][0] - pts[0][0]
    if span <= 0:
        raise ValueError(f"area_under_curve: the x values span nothing ({pts[0][0]} .. {pts[-1][0]})")
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pts, pts[1:]))
    return area / span


def first_crossing(xs: Sequence[float], ys: Sequence[float], threshold: float, *, censored: float) -> float:
    """The first x at which ``ys`` reaches ``threshold`` (points sorted by x, NaN dropped), or ``censored`` when
    it never does (e.g. one rollout past the last): rollouts-to-threshold, smaller is faster."""
    for x, y in sorted((float(x), float(y)) for x, y in zip(xs, ys) if not math.isnan(float(y))):
        if y >= threshold:
            return x
    return float(censored)
