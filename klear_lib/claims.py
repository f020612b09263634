"""Claims and their verdicts: one rule, used by every notebook.

A notebook tests a paper's claim by a paired comparison over seeds: seed s runs both arms from the same start
(the same SFT model, the same first rollout), so the effect is the mean over seeds of the per-seed difference
``a_s - b_s`` of a read-out (area under a curve, a final accuracy, ...). Its 95% interval is a paired bootstrap
(percentile) over those differences. The verdict follows from the interval and the direction the paper states:

* ``reproduced``: the interval excludes 0 on the paper's side;
* ``reversed``: it excludes 0 on the other side;
* ``inconclusive``: it contains 0.

With few seeds the percentile bootstrap is narrow (with 4 seeds its ends are close to the smallest and the
largest difference), so ``reproduced`` and ``reversed`` need nearly every seed to agree in sign; the notebooks
report the per-seed differences beside the interval. A claim is written to ``summary.json`` as a dict with the
fields of ``CLAIM_FIELDS`` (and optional ``note``, ``per_seed``); ``validate_claims`` checks them on write and the
report reads them back.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

VERDICTS = ("reproduced", "reversed", "inconclusive")
CLAIM_FIELDS = ("id", "claim", "source", "metric", "effect", "ci_low", "ci_high", "seeds", "verdict")
OPTIONAL_FIELDS = ("note", "per_seed", "direction", "notebook")


def paired_bootstrap(diffs: Sequence[float], *, n_boot: int = 10_000, level: float = 0.95,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``diffs`` and its percentile-bootstrap interval at ``level``: resample the differences with
    replacement ``n_boot`` times (a fixed ``seed``: the same data give the same interval), take the quantiles
    (1 - level) / 2 and (1 + level) / 2 of the resampled means (linear interpolation). One difference gives the
    interval [d, d]; none is an error."""
    diffs = [float(d) for d in diffs]
    if not diffs:
        raise ValueError("paired_bootstrap needs at least one paired difference")
    if any(math.isnan(d) for d in diffs):
        raise ValueError(f"paired_bootstrap: a difference is NaN in {diffs}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    mean = sum(diffs) / len(diffs)
    if len(diffs) == 1:
        return mean, mean, mean
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(rng.choice(diffs) for _ in range(n)) / n for _ in range(n_boot))
    return mean, _quantile(means, (1 - level) / 2), _quantile(means, (1 + level) / 2)


def _quantile(sorted_values: list[float], q: float) -> float:
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def verdict(ci_low: float, ci_high: float, direction: int = 1) -> str:
    """``reproduced`` if [ci_low, ci_high] excludes 0 on the side of ``direction`` (+1: the paper says the effect
    is positive, -1: negative), ``reversed`` if it excludes 0 on the other side, else ``inconclusive``."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction!r}")
    if not ci_low <= ci_high:
        raise ValueError(f"ci_low {ci_low} is above ci_high {ci_high}")
    if ci_low > 0:
        return "reproduced" if direction == 1 else "reversed"
    if ci_high < 0:
        return "reversed" if direction == 1 else "reproduced"
    return "inconclusive"


def paired_claim(id: str, claim: str, source: str, metric: str, a: Mapping, b: Mapping, *, direction: int = 1,
                 note: str = "", n_boot: int = 10_000) -> dict:
    """A claim from per-seed read-outs of two arms: ``a`` and ``b`` map seed -> value; the effect is the mean of
    ``a[s] - b[s]`` over the seeds both have. ``direction``: +1 if the paper says a > b, -1 if a < b."""
    seeds = sorted(set(a) & set(b), key=str)
    if not seeds:
        raise ValueError(f"claim {id!r}: the two arms share no seed (a: {sorted(a, key=str)}, b: {sorted(b, key=str)})")
    diffs = [float(a[s]) - float(b[s]) for s in seeds]
    effect, lo, hi = paired_bootstrap(diffs, n_boot=n_boot)
    out = {"id": id, "claim": claim, "source": source, "metric": metric, "effect": effect, "ci_low": lo,
           "ci_high": hi, "seeds": len(seeds), "verdict": verdict(lo, hi, direction), "direction": direction,
           "per_seed": {str(s): d for s, d in zip(seeds, diffs)}}
    if note:
        out["note"] = note
    return out


def validate_claims(claims, *, where: str = "claims") -> list[dict]:
    """Check a list of claims (the ``summary["claims"]`` contract); raise ValueError naming the claim and the
    field. Returns the list."""
    if not isinstance(claims, list):
        raise ValueError(f"{where} must be a list of claim dicts, got {type(claims).__name__}")
    ids = set()
    for i, c in enumerate(claims):
        at = f"{where}[{i}]"
        if not isinstance(c, Mapping):
            raise ValueError(f"{at} must be a dict, got {type(c).__name__}")
        missing = [f for f in CLAIM_FIELDS if f not in c]
        if missing:
            raise ValueError(f"{at} ({c.get('id', '?')}): missing field(s) {missing}")
        unknown = sorted(set(c) - set(CLAIM_FIELDS) - set(OPTIONAL_FIELDS))
        if unknown:
            raise ValueError(f"{at} ({c['id']}): unknown field(s) {unknown}; "
                             f"fields: {list(CLAIM_FIELDS + OPTIONAL_FIELDS)}")
        for f in ("id", "claim", "source", "metric"):
            if not isinstance(c[f], str) or not c[f]:
                raise ValueError(f"{at}.{f} must be a non-empty string, got {c[f]!r}")
        for f in ("effect", "ci_low", "ci_high"):
            if not isinstance(c[f], (int, float)) or isinstance(c[f], bool) or not math.isfinite(c[f]):
                raise ValueError(f"{at} ({c['id']}).{f} must be a finite number, got {c[f]!r}")
        if not isinstance(c["seeds"], int) or isinstance(c["seeds"], bool) or c["seeds"] < 1:
            raise ValueError(f"{at} ({c['id']}).seeds must be a positive int, got {c['seeds']!r}")
        if c["verdict"] not in VERDICTS:
            raise ValueError(f"{at} ({c['id']}).verdict must be one of {VERDICTS}, got {c['verdict']!r}")
        if not c["ci_low"] <= c["effect"] <= c["ci_high"]:
            raise ValueError(f"{at} ({c['id']}): effect {c['effect']} is outside its interval "
                             f"[{c['ci_low']}, {c['ci_high']}]")
        expected = verdict(c["ci_low"], c["ci_high"], c.get("direction", 1))
        if c["verdict"] != expected:
            raise ValueError(f"{at} ({c['id']}): verdict {c['verdict']!r} does not follow from the interval "
                             f"[{c['ci_low']:.4g}, {c['ci_high']:.4g}] (direction {c.get('direction', 1)}): "
                             f"the rule gives {expected!r}")
        if c["id"] in ids:
            raise ValueError(f"{at}: claim id {c['id']!r} is used twice")
        ids.add(c["id"])
    return claims


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
