"""`klear compare A B`: two sets of runs of the same notebooks (two machines, two commits) side by side, claim by
claim, as plain data (``compare``); ``klear_lib.report`` renders it (the terminal table and ``report.md``:
``compare.md.j2``; the page's "Compared with" section: ``compare.html.j2``).

A side is an outputs tree (``<root>/<notebook>/<stamp>/``: each notebook's newest run, as the report picks it,
``report_data.gather``) or one run directory. Claims are matched by notebook and claim id; each matched pair is one
row with both effects, intervals, seeds and verdicts, the z of their difference and whether the verdict flipped.
Claims on one side only, and runs that did not finish, are listed apart, each with why.

The z of a row takes the two runs as independent (two machines train other starts; the seeds of one run are
independent of the other's):

    z = (effect_A - effect_B) / sqrt(se_A**2 + se_B**2)

where a side's se is the standard error of its effect, the mean of its n per-seed paired differences: ``sd / sqrt(n)``
with sd the sample sd (n - 1) of the differences stored in ``summary.json`` (``per_seed``; the claim's ``sd`` where a
run stored no per-seed differences; the half-width of its paired-t 95% interval over ``t_{0.975, n-1}`` where it
stored neither). z is None where a side has under 2 seeds, a check has no per-seed differences (a plain pass/fail
check), or neither side has spread. Two runs of the same seeds on the same processor and commit are not independent
(they are bit-identical: z is 0 there).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from klear_lib import claims, report_data, runs
from klear_lib.presets import KlearError
from klear_lib.report_data import RunInfo
from klear_lib.report_declared import ROLE_ORDER

TREE, RUN = "outputs tree", "run directory"
_RUN_FILES = (*runs.RUN_CONTRACT, runs.PARAMS_FILE, runs.STATUS_FILE, runs.PRESET_FILE, runs.NOTEBOOK_FILE)
EXPECTED = (f"an outputs tree (<notebook>/<stamp>/ run directories under it, as `klear run` writes them) or one run "
            f"directory ({', '.join(runs.RUN_CONTRACT[:3])}, ... in it)")


@dataclasses.dataclass
class Side:
    """One side of a comparison, read: where, what kind, each notebook's newest run and its claims."""

    label: str  # "A" | "B"
    path: Path
    kind: str  # TREE | RUN
    latest: dict[str, RunInfo]
    rows: list[dict]  # report_data.claim_rows of the runs that ran


def _is_run_dir(path: Path) -> bool:
    return report_data.RUN_STAMP.fullmatch(path.name) is not None or any((path / f).is_file() for f in _RUN_FILES)


def _run_notebook(path: Path) -> str:
    """The notebook of a run directory: params.json's (``klear run`` records it), else its parent folder's name."""
    record, _ = report_data._read_json(path / runs.PARAMS_FILE)
    name = record.get("notebook") if isinstance(record, dict) else None
    return str(name) if isinstance(name, str) and name else path.resolve().parent.name


def read_side(path: str | os.PathLike, label: str) -> Side:
    """A side read from ``path``: a run directory, else an outputs tree; KlearError (exit 2) naming the path and
    what was expected when it is neither."""
    p = Path(path)
    if not p.exists():
        raise KlearError(f"{label}: {p} does not exist; expected {EXPECTED}")
    if not p.is_dir():
        raise KlearError(f"{label}: {p} is a file; expected {EXPECTED}")
    if _is_run_dir(p):
        run = read_run_as(p)
        latest = {run.notebook: run}
        return Side(label, p, RUN, latest, report_data.claim_rows(latest))
    stamped = [d.name for d in p.iterdir() if d.is_dir() and report_data.RUN_STAMP.fullmatch(d.name)]
    if stamped:
        raise KlearError(f"{label}: {p} holds run directories ({sorted(stamped)[-1]}, ...) but is not one: give one "
                         f"of them, or the outputs tree above it ({p.parent}); expected {EXPECTED}")
    page = report_data.gather(p)
    if not page.latest:
        hint = f". Did you mean {p / 'outputs'}?" if (p / "outputs").is_dir() else ""
        raise KlearError(f"{label}: {p} is neither an outputs tree nor a run directory (no <notebook>/<stamp>/ "
                         f"folder under it); expected {EXPECTED}{hint}")
    return Side(label, p, TREE, page.latest, page.claims.tested + page.claims.checks)


def read_run_as(path: Path) -> RunInfo:
    """``report_data.read_run``, named by the notebook that made it (a run directory copied elsewhere keeps it)."""
    return dataclasses.replace(report_data.read_run(path), notebook=_run_notebook(path))


# ----------------------------------------------------------------------------------------------------------
# One claim's standard error, and the z of two.


def standard_error(claim: Mapping) -> tuple[float | None, str]:
    """(se of the claim's effect, where it came from): ``sd / sqrt(n)`` of the stored per-seed differences; of the
    stored sd; the paired-t interval's half-width over ``t_{0.975, n-1}``; (None, why) below 2 seeds or for a check
    with no per-seed differences."""
    per_seed = claim.get("per_seed")
    diffs = [float(v) for v in per_seed.values()] if isinstance(per_seed, Mapping) else []
    if len(diffs) >= 2:
        return statistics.stdev(diffs) / math.sqrt(len(diffs)), "per-seed differences"
    if not diffs and claim.get("sd") is None and claim.get("ci_low") is None:
        return None, "a pass/fail check, no per-seed differences"
    n = claim.get("seeds")
    if not isinstance(n, int) or n < 2:
        return None, f"{n} seed" + ("" if n == 1 else "s")
    if report_data._is_num(claim.get("sd")):
        return float(claim["sd"]) / math.sqrt(n), "sd"
    if report_data._is_num(claim.get("ci_low")) and report_data._is_num(claim.get("ci_high")):
        half = (float(claim["ci_high"]) - float(claim["ci_low"])) / 2
        return half / claims.t_quantile(1 - claims.ALPHA / 2, n - 1), "interval"
    return None, "no spread recorded"


def z_of(effect_a: float, se_a: float | None, effect_b: float, se_b: float | None) -> float | None:
    """``(effect_a - effect_b) / sqrt(se_a² + se_b²)``; 0 for equal effects without spread; None without an se,
    or for different effects without spread on either side."""
    if se_a is None or se_b is None:
        return None
    diff, se = effect_a - effect_b, math.hypot(se_a, se_b)
    if se > 0:
        return diff / se
    return 0.0 if diff == 0 else None


# ----------------------------------------------------------------------------------------------------------
# The comparison.


def _side_claim(c: Mapping, run: RunInfo) -> dict:
    se, se_from = standard_error(c)
    return {"effect": c["effect"], "ci_low": c.get("ci_low"), "ci_high": c.get("ci_high"), "seeds": c["seeds"],
            "verdict": c["verdict"], "p": c.get("p"), "se": se, "se_from": se_from, "preset": run.preset,
            "stamp": run.stamp}


def _why_missing(other: Side, nb: str) -> str:
    run = other.latest.get(nb)
    if run is None:
        return f"no run of {nb} in {other.label}"
    if run.status != "ran":
        where = f" ({run.stamp})" if run.stamp else ""
        return f"{other.label}'s run of {nb}{where} {run.status}" + (f": {run.error}" if run.error else "")
    return f"{other.label}'s run of {nb} ({run.stamp}, preset {run.preset or 'unknown'}) did not make this claim"


def _facts(side: Side) -> dict:
    """What the table's header says of a side: its processors, commits and presets, each with its notebooks."""
    def grouped(key) -> list[dict]:
        out: dict[Any, dict] = {}
        for nb, run in side.latest.items():
            k = key(run)
            if k is not None:
                out.setdefault(k, {"notebooks": []})["notebooks"].append(nb)
        return [{**dict(k), **v} for k, v in out.items()]

    def processor(run: RunInfo):
        v = run.versions if isinstance(run.versions, Mapping) else {}
        text = report_data.processor_text(v)
        return None if text is None else (("text", text), ("cpu", v.get("cpu")), ("cpu_id", v.get("cpu_id")),
                                          ("capability", v.get("cpu_capability")))

    return {
        "label": side.label, "path": str(side.path), "kind": side.kind, "notebooks": list(side.latest),
        "processors": grouped(processor),
        "commits": grouped(lambda r: (("commit", report_data.commit_text(r.git, short=True)),) if r.git else None),
        "presets": grouped(lambda r: (("preset", r.preset),) if r.preset else None),
        "runs": {nb: {"stamp": r.stamp, "status": r.status, "preset": r.preset, "error": r.error}
                 for nb, r in side.latest.items()},
    }


def compare_sides(a: Side, b: Side) -> dict:
    """The comparison of two read sides as plain data (str, numbers, None, lists and dicts):

    ``a``, ``b``: each side's path, kind, notebooks, ``processors`` (``text``, ``cpu``, ``cpu_id``, ``capability``,
    ``notebooks``), ``commits`` and ``presets`` (likewise), ``runs`` (notebook -> stamp, status, preset, error);
    ``rows``: one per claim on both sides (notebook order, primary claims first): ``notebook``, ``id``, ``role``,
    ``claim``, ``short``, ``a`` and ``b`` (``effect``, ``ci_low``, ``ci_high``, ``seeds``, ``verdict``, ``p``,
    ``se``, ``se_from``, ``preset``, ``stamp``), ``difference`` (A's effect - B's), ``z``, ``z_note`` (why z is
    None), ``flipped``, ``change`` ("reproduced → inconclusive"); ``only_a``, ``only_b``: claims on one side, each
    with ``why``; ``not_ran``: every newest run on either side that did not finish (side, notebook, stamp, status,
    error); ``common``: the notebooks both sides ran; ``flipped``: how many rows flipped."""
    common = [nb for nb in a.latest if nb in b.latest]
    if not common:
        raise KlearError(f"no notebook in common: A ({a.path}) has {', '.join(a.latest)}; B ({b.path}) has "
                         f"{', '.join(b.latest)}")
    index_b = {(c["notebook"], c["id"]): c for c in b.rows}
    keys_a = {(c["notebook"], c["id"]) for c in a.rows}
    rows, only_a = [], []
    for c in a.rows:
        other = index_b.get((c["notebook"], c["id"]))
        if other is None:
            only_a.append(_only(c, _why_missing(b, c["notebook"])))
            continue
        sa, sb = _side_claim(c, a.latest[c["notebook"]]), _side_claim(other, b.latest[c["notebook"]])
        z = z_of(sa["effect"], sa["se"], sb["effect"], sb["se"])
        note = None
        if z is None:
            gaps = {s.label: v["se_from"] for s, v in ((a, sa), (b, sb)) if v["se"] is None}
            same = len(gaps) == 2 and len(set(gaps.values())) == 1
            note = (gaps["A"] if same else "; ".join(f"{k}: {v}" for k, v in gaps.items())) or \
                "no spread on either side"
        role = c["role"] if c["role"] == other["role"] else f"{c['role']} / {other['role']}"
        flipped = sa["verdict"] != sb["verdict"]
        rows.append({"notebook": c["notebook"], "id": c["id"], "role": role, "claim": c["claim"],
                     "short": c.get("short") or report_data.short_claim(c["claim"]), "a": sa, "b": sb,
                     "difference": sa["effect"] - sb["effect"], "z": z, "z_note": note, "flipped": flipped,
                     "change": f"{sa['verdict']} → {sb['verdict']}" if flipped else ""})
    only_b = [_only(c, _why_missing(a, c["notebook"])) for c in b.rows if (c["notebook"], c["id"]) not in keys_a]
    order = {nb: i for i, nb in enumerate(sorted(set(a.latest) | set(b.latest)))}

    def key(r):
        return order[r["notebook"]], ROLE_ORDER.get(r["role"].split(" / ")[0], 9)

    not_ran = [{"side": s.label, "notebook": nb, "stamp": r.stamp, "status": r.status, "error": r.error}
               for s in (a, b) for nb, r in s.latest.items() if r.status != "ran"]
    rows.sort(key=key)
    return {"a": _facts(a), "b": _facts(b), "common": common, "rows": rows, "only_a": sorted(only_a, key=key),
            "only_b": sorted(only_b, key=key), "not_ran": not_ran, "flipped": sum(r["flipped"] for r in rows)}


def _only(c: Mapping, why: str) -> dict:
    return {"notebook": c["notebook"], "id": c["id"], "role": c["role"], "claim": c["claim"],
            "short": c.get("short") or report_data.short_claim(c["claim"]), "verdict": c["verdict"],
            "effect": c["effect"], "seeds": c["seeds"], "why": why}


def compare(a: str | os.PathLike, b: str | os.PathLike) -> dict:
    """``klear compare A B`` as data (``compare_sides``): A and B each an outputs tree or a run directory."""
    return compare_sides(read_side(a, "A"), read_side(b, "B"))
