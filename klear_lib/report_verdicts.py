"""What the report says beside a claim's verdict, read from the claim's own recorded fields (and, for a run written
before claims carried ``control_of`` or ``guards``, from the declarations): how many seeds went the paper's way
(``sign_count``); the chance that a rerun repeats a decided verdict (``repeat_chance``); why an inconclusive claim is
inconclusive where the usual reading ("no effect as large as the MDE") would not say it: its interval excludes 0, its
seeds are tied, its differences have no spread (``undecided_because``); which reproduced primary has a declared
control against the paper's explanation, or one that leaves it open; which verdict a failed check guards; whether the
split-half check (``block_z``) flags the run; and which check is an A/A pair. ``report_data.claim_rows`` marks every
row through ``annotate``; the templates print the marks. Nothing here decides a verdict: ``klear_lib.claims`` does."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, MutableMapping, Sequence

from klear_lib import claims
from klear_lib.claims import ALPHA, MIN_SEEDS, SIGN_FLIP_FROM

VERDICT_TEXT = {  # each verdict phrased for what was shown: an effect in the tiny stand-in, not in the paper's setting
    "reproduced": "the stand-in shows the paper's direction",
    "reversed": "the stand-in shows the opposite direction",
    "inconclusive": "the stand-in cannot tell (no effect as large as the MDE was seen)",
}
DECIDED = ("reproduced", "reversed")
# A/A pairs one arm with itself under another seed stream (06: seed s with seed s + 1000, from seed s's start). The
# primary pairs its arms on one seed, which removes the sampling noise of the stream; the A/A keeps it. So the A/A's
# spread is an upper bound on the noise the primary sees, not the primary's noise floor.
AA_LABEL = "A/A (a second seed stream: noise the primary's pairing removes)"
HALVES_LIMIT = claims.SPLIT_HALF_LIMIT  # |split-half z| at or above this flags a run (0.27% under the assumptions)
AGAINST = "a control against the paper's explanation"
OPEN = "its explanation left open by a control"
REPEAT_GOOD = 0.8  # a decided verdict that repeats with a lower chance is counted apart (its effect is below its MDE)


def signed(x: float) -> str:
    """An effect: signed, 3 significant digits (``+0.336``); an exact zero as ``0``. ``report.signed`` prints numbers
    through this, so that the verdict words and the table's cells agree."""
    return "0" if x == 0 else f"{x:+.3g}"


def _seeds(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


def _p(x: float) -> str:
    return f"{x:.2g}"


def _value(x: float) -> str:
    """A read-out's value as a reader says it: ``1.0``, ``0.75``, ``0.1235``."""
    return str(round(float(x), 4))


def is_aa(r: Mapping) -> bool:
    """A paired check that must come out ``inconclusive`` is an A/A pair (``claims.paired_claim``: ``expect`` is
    ``reproduced`` for a positive control, ``inconclusive`` for an A/A pair): one arm against itself."""
    return r.get("role") == "check" and r.get("expect") == "inconclusive" and "per_seed" in r


def tied_seeds(per_seed: Mapping) -> int:
    """Seeds whose paired difference is 0 to the sign-flip test's tolerance (``claims.tied``)."""
    return sum(claims.tied(list(per_seed.values()))) if per_seed else 0


def sign_count(r: Mapping) -> dict | None:
    """How the seeds of a paired claim went: ``{"with": k, "against": j, "tied": t, "n": n}``, k the seeds whose
    difference has the paper's sign (``direction``), j the other sign, t those tied (``claims.tied``); None for a
    plain check (no per-seed differences)."""
    per_seed = r.get("per_seed")
    if not isinstance(per_seed, Mapping) or not per_seed:
        return None
    values = [float(v) for v in per_seed.values()]
    ties = claims.tied(values)
    direction = r.get("direction", 1)
    with_ = sum(not t and v * direction > 0 for v, t in zip(values, ties))
    return {"with": with_, "against": len(values) - with_ - sum(ties), "tied": sum(ties), "n": len(values)}


def sign_text(counts: Mapping | None) -> str:
    """``5 of 6 seeds in the paper's direction``, with ``(1 tied)`` where seeds are tied; "" without a count."""
    if not counts:
        return ""
    out = f"{counts['with']} of {_seeds(counts['n'])} in the paper's direction"
    return out + (f" ({counts['tied']} tied)" if counts["tied"] else "")


def tie_text(r: Mapping, ties: int) -> str:
    """``a tie (2 of 6 seeds equal, e.g. both arms at 1.0)``: the tied seeds named for what they are, two arms with
    the same read-out (a ceiling, often), with the value both arms had where the claim records it (``tied_at``),
    else ``equal in both arms``."""
    n = r["seeds"]
    values = [float(v) for v in (r.get("tied_at") or {}).values()]
    if not values:
        return f"a tie ({ties} of {_seeds(n)} equal in both arms)"
    common, _ = Counter(_value(v) for v in values).most_common(1)[0]
    every = len(set(_value(v) for v in values)) == 1 and len(values) == ties
    return f"a tie ({ties} of {_seeds(n)} equal, {'' if every else 'e.g. '}both arms at {common})"


def undecided_because(r: Mapping, alpha: float = ALPHA) -> dict | None:
    """Why a paired claim (or a paired check's outcome) is ``inconclusive`` where the usual reading (its interval
    holds 0: no effect as large as the MDE was seen) would not say it: ``{"short": ..., "text": ...}`` naming the
    condition of the rule that did not hold, with its number; None where the interval includes 0 for the usual
    reason, or the claim was decided. In order: every seed tied (the arms gave the same read-out on each seed,
    ``tie_text``); fewer than ``MIN_SEEDS`` seeds; below ``SIGN_FLIP_FROM`` seeds every difference the same non-zero
    value (no spread: the rule takes the sign-flip test's p, whose floor 2^(1-n) is above ``alpha``); then, where
    the shown interval excludes 0: every difference float rounding (p 1, the interval spans the differences); from
    ``SIGN_FLIP_FROM`` seeds the sign-flip test above ``alpha``, named as a tie where tied seeds alone put its
    smallest possible p above ``alpha`` (one tie at 6 seeds: 2^-4 = 0.0625); Holm's adjustment of a secondary's p
    above ``alpha``, named as a tie where the tie's floor is what Holm could not pass."""
    if "ci_low" not in r or r.get("outcome", r.get("verdict")) != "inconclusive":
        return None
    n = r["seeds"]
    per_seed = r.get("per_seed") or {}
    ties = tied_seeds(per_seed)
    if per_seed and ties == len(per_seed):
        tie = tie_text(r, ties)
        return {"short": tie, "text": f"{tie}: the two arms gave the same read-out on every seed, so this read-out "
                                      f"cannot tell them apart"}
    excludes = r["ci_low"] > 0 or r["ci_high"] < 0
    if n < MIN_SEEDS:
        return {"short": _seeds(n), "text": f"the interval excludes 0, but fewer than {MIN_SEEDS} seeds never decide "
                                            f"({n} here)"} if excludes else None
    if n < SIGN_FLIP_FROM and r.get("sd") == 0 and r["effect"] != 0:
        return {"short": f"every seed {signed(r['effect'])}",
                "text": f"every seed gave the same difference ({signed(r['effect'])}): with no spread the t-test has "
                        f"no noise to measure it against, so the rule takes the sign-flip test's p, which cannot go "
                        f"below 2^{1 - n} = {_p(2.0 ** (1 - n))} at {_seeds(n)} (p = {_p(r['p_t'])} > {alpha:g})"}
    if not excludes:
        return None
    excl = "the interval excludes 0"
    if r["p_t"] > alpha:
        return {"short": "float rounding", "text": f"{excl} only by float rounding: every paired difference is "
                                                    f"within 1e-9 of the read-outs, so the arms are the same (p = 1)"}
    floor_tied = 2.0 ** (1 - (n - ties))
    if n >= SIGN_FLIP_FROM and r["p_sign"] > alpha:
        if ties and floor_tied > alpha:
            tie = tie_text(r, ties)
            return {"short": tie, "text": f"{excl}, but {tie} leaves the sign-flip test {n - ties} signs to flip: "
                                          f"its p cannot go below {_p(floor_tied)} (p = {_p(r['p_sign'])} > "
                                          f"{alpha:g})"}
        return {"short": f"sign-flip p = {_p(r['p_sign'])}",
                "text": f"{excl}, but the sign-flip test does not agree (p = {_p(r['p_sign'])} > {alpha:g})"}
    p_adj = r.get("p_adjusted", r["p_value"])
    if r.get("role") == "secondary" and p_adj > alpha:
        factor = p_adj / r["p_value"] if r["p_value"] > 0 else 1.0
        if (ties and n >= SIGN_FLIP_FROM and r["p_sign"] <= floor_tied * (1 + 1e-9)
                and 2.0 ** (1 - n) * factor <= alpha):
            tie = tie_text(r, ties)
            return {"short": tie, "text": f"{excl}, but {tie} leaves the sign-flip test {n - ties} signs to flip: "
                                          f"its p cannot go below {_p(floor_tied)}, and Holm's adjustment over the "
                                          f"notebook's secondary claims gives p = {_p(p_adj)} > {alpha:g}"}
        return {"short": f"Holm p = {_p(p_adj)}",
                "text": f"{excl} (p = {_p(r['p_value'])}), but Holm's adjustment over the notebook's secondary "
                        f"claims gives p = {_p(p_adj)} > {alpha:g}"}
    return None


def repeat_level(r: Mapping, secondaries: int) -> float:
    """The level the repeat chance holds a row to: ``ALPHA`` for a primary claim and a check; for a secondary,
    Bonferroni's ``ALPHA / m`` over the notebook's m secondaries (Holm's first level: a lower bound on Holm's
    chance, ``claims.repeat_probability``)."""
    return ALPHA / max(1, secondaries) if r.get("role") == "secondary" else ALPHA


def repeat_chance(r: Mapping, level: float = ALPHA) -> float | None:
    """``claims.repeat_probability`` of a decided paired row (its verdict, or a paired check's outcome, reproduced or
    reversed) at its measured effect / sd and seeds: the chance that a rerun with as many seeds reaches the same
    verdict if the measured effect and sd were true. None for an inconclusive or plain row, and where the seeds
    have no spread (sd 0 or unknown: nothing to estimate the rerun's noise from)."""
    if r.get("outcome", r.get("verdict")) not in DECIDED or "per_seed" not in r:
        return None
    sd = r.get("sd")
    if not isinstance(sd, (int, float)) or not math.isfinite(sd) or sd <= 0:
        return None
    return claims.repeat_probability(float(r["effect"]) / float(sd), int(r["seeds"]), alpha=level)


def _control_text(c: Mapping, primary: Mapping) -> str:
    """``id: effect +0.127 [-0.142, +0.395], verdict inconclusive; its interval holds 0, not the primary's
    +0.559``: a control as the primary's verdict cell names it."""
    low, high, effect = c["ci_low"], c["ci_high"], primary["effect"]
    held = [x for x, inside in (("0", low <= 0 <= high), (f"the primary's {signed(effect)}", low <= effect <= high))
            if inside]
    missed = [x for x in ("0", f"the primary's {signed(effect)}") if x not in held]
    if len(held) == 2:
        where = "holds 0 and the primary's " + signed(effect)
    elif held:
        where = f"holds {held[0]}, not {missed[0]}"
    else:
        where = f"holds neither 0 nor the primary's {signed(effect)}"
    return (f"{c['id']}: effect {signed(c['effect'])} [{signed(low)}, {signed(high)}], verdict {c['verdict']}; its "
            f"interval {where}")


def guard_text(check: Mapping) -> str:
    """What a failed check says in the cell of every verdict it guards: ``its check bases_learned failed (0.41
    against every base >= 0.5): this verdict is not to be trusted``."""
    if "criterion" in check:
        value, criterion = f"{float(check['effect']):.4g}", check["criterion"]
    else:  # a paired check: its outcome against what it had to show
        value = (f"{signed(check['effect'])} [{signed(check['ci_low'])}, {signed(check['ci_high'])}], "
                 f"{check.get('outcome')}")
        criterion = f"expected {check.get('expect')}"
    return f"its check {check['id']} failed ({value} against {criterion}): this verdict is not to be trusted"


def verdict_words(r: Mapping) -> str:
    """The verdict cell's words (after the badge): a reproduced primary with a control against the paper's
    explanation says so, with the control's claim, and one whose control came out inconclusive says the direction
    holds and the control (id, effect, interval, verdict) leaves the explanation open; an inconclusive claim with a
    reason ``undecided_because`` names says it; any other claim its verdict's ``VERDICT_TEXT``. A failed check's
    warning (``guard_text``) is printed apart, beside these words."""
    against, open_ = r.get("controls_against") or [], r.get("controls_open") or []
    if against:
        one = len(against) == 1
        words = (f"the stand-in shows the paper's direction on this comparison; its control{'' if one else 's'} "
                 f"({'; '.join(against)}) do{'es' if one else ''} not support the paper's explanation")
        if open_:
            words += (f"; its control{'' if len(open_) == 1 else 's'} ({'; '.join(open_)}) "
                      f"leave{'s' if len(open_) == 1 else ''} it open")
        return words
    if open_:
        one = len(open_) == 1
        return (f"the direction holds; its control{'' if one else 's'} ({'; '.join(open_)}) leave{'s' if one else ''} "
                f"the paper's explanation open")
    if r.get("undecided"):
        return r["undecided"]["text"]
    return VERDICT_TEXT.get(r.get("verdict"), str(r.get("verdict")))


def halves_flag(r: Mapping) -> bool:
    """The split-half check flags the run: the two halves of its seeds disagree by |z| >= ``HALVES_LIMIT``."""
    z = r.get("block_z")
    return isinstance(z, (int, float)) and math.isfinite(z) and abs(z) >= HALVES_LIMIT


def annotate(rows: Sequence[MutableMapping], declared_controls: Mapping[tuple[str, str], str] | None = None,
             declared_guards: Mapping[tuple[str, str], list[str]] | None = None) -> None:
    """Mark the report's claim rows in place (each has ``notebook``, ``short`` and the claim's fields): ``aa`` and,
    for an A/A pair, ``short`` = ``AA_LABEL``; ``control_of`` and a check's ``guards`` from the declarations
    (``declared_controls``: (notebook, id) -> primary id; ``declared_guards``: (notebook, check id) -> the ids it
    guards) where a run written before claims carried them lacks them; ``signs`` (``sign_count``) and
    ``signs_text``; ``repeat`` (``repeat_chance`` at ``repeat_level``: the notebook's secondaries counted among the
    rows) and ``repeat_level``; on a reproduced primary, ``controls_against`` (the short claims of its controls that
    came out reversed) and ``controls_open`` (its inconclusive controls, ``_control_text``; their ids in
    ``controls_open_ids``); ``guard_failures``: the
    ``guard_text`` of every failed check of the notebook that guards the row; ``undecided`` (``undecided_because``),
    ``verdict_words`` and ``halves_flag``."""
    declared_controls, declared_guards = declared_controls or {}, declared_guards or {}
    for r in rows:
        r["aa"] = is_aa(r)
        if r["aa"]:
            r["short"] = AA_LABEL
        key = (r["notebook"], r["id"])
        if r.get("role") == "secondary" and not r.get("control_of") and key in declared_controls:
            r["control_of"] = declared_controls[key]
        if r.get("role") == "check" and not r.get("guards") and key in declared_guards:
            r["guards"] = list(declared_guards[key])
    secondaries = Counter(r["notebook"] for r in rows if r.get("role") == "secondary")
    controls: dict[tuple[str, str], list[Mapping]] = {}
    failed: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.get("control_of"):
            controls.setdefault((r["notebook"], r["control_of"]), []).append(r)
        if r.get("role") == "check" and r.get("verdict") == "fail":
            for gid in r.get("guards") or []:
                failed.setdefault((r["notebook"], gid), []).append(guard_text(r))
    for r in rows:
        mine = controls.get((r["notebook"], r["id"]), []) if r.get("role") == "primary" else []
        held = r.get("verdict") == "reproduced"
        r["controls_against"] = [c["short"] for c in mine if c.get("verdict") == "reversed"] if held else []
        open_ = [c for c in mine if c.get("verdict") == "inconclusive"] if held else []
        r["controls_open"] = [_control_text(c, r) for c in open_]
        r["controls_open_ids"] = [c["id"] for c in open_]
        r["guard_failures"] = failed.get((r["notebook"], r["id"]), [])
        r["signs"] = sign_count(r)
        r["signs_text"] = sign_text(r["signs"])
        r["repeat_level"] = repeat_level(r, secondaries[r["notebook"]])
        r["repeat"] = repeat_chance(r, r["repeat_level"])
        r["undecided"] = undecided_because(r)
        r["verdict_words"] = verdict_words(r)
        r["halves_flag"] = halves_flag(r)
