"""What the report says beside a claim's verdict, read from the claim's own recorded fields (and, for a run written
before claims carried ``control_of``, from the declarations): why an inconclusive claim whose interval excludes 0 is
still inconclusive, which reproduced primary has a declared control against the paper's explanation, whether the
replication check (``block_z``) flags the run, and which check is an A/A pair. ``report_data.claim_rows`` marks every
row through ``annotate``; the templates print the marks. Nothing here decides a verdict: ``klear_lib.claims`` does."""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence

from klear_lib.claims import ALPHA, MIN_SEEDS, SIGN_FLIP_FROM

VERDICT_TEXT = {  # each verdict phrased for what was shown: an effect in the tiny stand-in, not in the paper's setting
    "reproduced": "the stand-in shows the paper's direction",
    "reversed": "the stand-in shows the opposite direction",
    "inconclusive": "the stand-in cannot tell (no effect as large as the MDE was seen)",
}
# A/A pairs one arm with itself under another seed stream (06: seed s with seed s + 1000, from seed s's start). The
# primary pairs its arms on one seed, which removes the sampling noise of the stream; the A/A keeps it. So the A/A's
# spread is an upper bound on the noise the primary sees, not the primary's noise floor.
AA_LABEL = "A/A (a second seed stream: noise the primary's pairing removes)"
HALVES_LIMIT = 3.0  # |block_z| at or above this flags a run: 0.27% of runs under the rule's assumptions
AGAINST = "a control against the paper's explanation"


def is_aa(r: Mapping) -> bool:
    """A paired check that must come out ``inconclusive`` is an A/A pair (``claims.paired_claim``: ``expect`` is
    ``reproduced`` for a positive control, ``inconclusive`` for an A/A pair): one arm against itself."""
    return r.get("role") == "check" and r.get("expect") == "inconclusive" and "per_seed" in r


def tied_seeds(per_seed: Mapping) -> int:
    """Seeds whose paired difference is 0 to the sign-flip test's tolerance (``claims.sign_flip_p``: sums within
    1e-12 of the differences' total count as equal): flipping such a seed's sign changes nothing, so each one
    halves the patterns that can beat the observed mean and doubles the smallest p the test can give."""
    d = [abs(float(v)) for v in per_seed.values()]
    tol = 1e-12 * max(1.0, sum(d))
    return sum(2 * x <= tol for x in d)


def _p(x: float) -> str:
    return f"{x:.2g}"


def undecided_because(r: Mapping, alpha: float = ALPHA) -> dict | None:
    """Why a paired claim (or a paired check's outcome) is ``inconclusive`` although its shown 95% t-interval
    excludes 0: ``{"short": ..., "text": ...}`` naming the condition of the rule that did not hold, with its number;
    None where the interval includes 0 (the usual inconclusive: nothing to explain) or the claim was decided. The
    conditions, in the order the rule applies them (``claims.decide`` over ``claims.paired_claim``'s p):
    fewer than ``MIN_SEEDS`` seeds; every difference float rounding (p 1, the interval spans the differences);
    from ``SIGN_FLIP_FROM`` seeds the sign-flip test above ``alpha``, named as tied seeds where zero differences
    alone put its smallest possible p above ``alpha`` (one tie at 6 seeds: 2^-4 = 0.0625); Holm's adjustment of a
    secondary's p above ``alpha``."""
    if "ci_low" not in r or r.get("outcome", r.get("verdict")) != "inconclusive":
        return None
    if not (r["ci_low"] > 0 or r["ci_high"] < 0):
        return None
    n, excludes = r["seeds"], "the interval excludes 0"
    if n < MIN_SEEDS:
        return {"short": f"{n} seeds", "text": f"{excludes}, but fewer than {MIN_SEEDS} seeds never decide ({n} here)"}
    if r["p_t"] > alpha:
        return {"short": "float rounding", "text": f"{excludes} only by float rounding: every paired difference is "
                                                    f"within 1e-9 of the read-outs, so the arms are the same (p = 1)"}
    if n >= SIGN_FLIP_FROM and r["p_sign"] > alpha:
        ties = tied_seeds(r["per_seed"])
        floor = 2.0 ** (1 - (n - ties))
        if ties and floor > alpha:
            seeds, verb = (f"{ties} tied seeds", "leave") if ties > 1 else ("1 tied seed", "leaves")
            return {"short": seeds, "text": f"{excludes}, but {seeds} (a paired difference of 0) {verb} the sign-flip "
                                            f"test {n - ties} signs to flip: its p cannot go below {_p(floor)} "
                                            f"(p = {_p(r['p_sign'])} > {alpha:g})"}
        return {"short": f"sign-flip p = {_p(r['p_sign'])}",
                "text": f"{excludes}, but the sign-flip test does not agree (p = {_p(r['p_sign'])} > {alpha:g})"}
    p_adj = r.get("p_adjusted", r["p_value"])
    if r.get("role") == "secondary" and p_adj > alpha:
        return {"short": f"Holm p = {_p(p_adj)}",
                "text": f"{excludes} (p = {_p(r['p_value'])}), but Holm's adjustment over the notebook's secondary "
                        f"claims gives p = {_p(p_adj)} > {alpha:g}"}
    return None


def verdict_words(r: Mapping) -> str:
    """The verdict cell's words (after the badge): a reproduced primary with a control against the paper's
    explanation says so, with the control's claim; an inconclusive claim whose interval excludes 0 says why; any
    other claim its verdict's ``VERDICT_TEXT``."""
    against = r.get("controls_against") or []
    if against:
        one = len(against) == 1
        return (f"the stand-in shows the paper's direction on this comparison; its control{'' if one else 's'} "
                f"({'; '.join(against)}) do{'es' if one else ''} not support the paper's explanation")
    if r.get("undecided"):
        return r["undecided"]["text"]
    return VERDICT_TEXT.get(r.get("verdict"), str(r.get("verdict")))


def halves_flag(r: Mapping) -> bool:
    """The replication check flags the run: the two halves of its seeds disagree by |z| >= ``HALVES_LIMIT``."""
    z = r.get("block_z")
    return isinstance(z, (int, float)) and math.isfinite(z) and abs(z) >= HALVES_LIMIT


def annotate(rows: Sequence[MutableMapping], declared_controls: Mapping[tuple[str, str], str] | None = None) -> None:
    """Mark the report's claim rows in place (each has ``notebook``, ``short`` and the claim's fields): ``aa`` and,
    for an A/A pair, ``short`` = ``AA_LABEL``; ``control_of`` from the declarations (``declared_controls``:
    (notebook, id) -> primary id) where a run written before claims carried it lacks it; on a reproduced primary,
    ``controls_against``: the short claims of its controls that came out ``reversed``; ``undecided``
    (``undecided_because``), ``verdict_words`` and ``halves_flag``."""
    declared_controls = declared_controls or {}
    for r in rows:
        r["aa"] = is_aa(r)
        if r["aa"]:
            r["short"] = AA_LABEL
        if r.get("role") == "secondary" and not r.get("control_of") and (r["notebook"], r["id"]) in declared_controls:
            r["control_of"] = declared_controls[(r["notebook"], r["id"])]
    controls: dict[tuple[str, str], list[Mapping]] = {}
    for r in rows:
        if r.get("control_of"):
            controls.setdefault((r["notebook"], r["control_of"]), []).append(r)
    for r in rows:
        mine = controls.get((r["notebook"], r["id"]), []) if r.get("role") == "primary" else []
        r["controls_against"] = ([c["short"] for c in mine if c.get("verdict") == "reversed"]
                                 if r.get("verdict") == "reproduced" else [])
        r["undecided"] = undecided_because(r)
        r["verdict_words"] = verdict_words(r)
        r["halves_flag"] = halves_flag(r)
