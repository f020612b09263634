"""The claims the report lists apart from the tested ones, read from what the notebooks declare beside their presets:
those a run did not make at its preset (``claims.yaml``: what each needs of the parameters, against what the run
had), those a notebook no longer tests (``retired.yaml``, with their last result) and the paper's claims a notebook
declares it does not test at all (``not_tested.yaml``, with why). None is counted. Also read from the declarations,
for runs written before claims carried them: each secondary's ``control_of`` and each check's ``guards``."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROLE_ORDER = {"primary": 0, "secondary": 1, "check": 2}  # how claims are listed everywhere


def _declared(params_folder, nb: str, name: str, load) -> dict | None:
    """``load(params/<nb>/<name>)`` (``params_folder``, default the checkout's), or None where the file is not there
    or cannot be read (a warning names it: the report still renders)."""
    from klear_lib import notebook

    folder = Path(params_folder) if params_folder is not None else notebook.params_dir()
    path = folder / nb / name if folder is not None else None
    if path is None or not path.is_file():
        return None
    try:
        return load(path)
    except ValueError as err:
        warnings.warn(f"report: cannot read {path}: {err}")
        return None


def untested_rows(latest: Mapping[str, Any], params_folder: str | os.PathLike | None = None) -> list[dict]:
    """The claims a notebook declares (``params/<notebook>/claims.yaml`` in ``params_folder``, default the
    checkout's) that its newest run did not make: one row each (notebook, preset, role, claim, id) with ``needs``,
    what the claim's ``requires`` asks of the parameters beside what the run had (``arms: dapo_half_lr (this run:
    dapo,...)``); for a claim without ``requires`` (07's checks, made from what ran) or one whose requirement the
    run meets (declared after it ran), says so."""
    from klear_lib import claims, notebook

    out = []
    for nb, run in latest.items():
        found = run.summary.get("claims") if isinstance(run.summary, dict) else None
        if run.status != "ran" or not found:
            continue
        declared = _declared(params_folder, nb, notebook.CLAIMS_FILE, claims.load_declared)
        if declared is None:
            continue
        made = {c.get("id") for c in found if isinstance(c, Mapping)}
        for cid, d in declared.items():
            if cid in made:
                continue
            unmet = [(k, w) for k, w in (d.get("requires") or {}).items()
                     if k not in run.params or not claims.requirement_met(run.params[k], w)]
            needs = "; ".join(
                f"{k}: {'set' if w is True else ', '.join(map(str, w if isinstance(w, list) else [w]))} (this run: "
                f"{run.params[k] if k in run.params else 'no such parameter'})" for k, w in unmet)
            if not needs:
                needs = ("declared after this run (its parameters meet what the claim needs)" if d.get("requires")
                         else "what it compares did not run (the notebook decides from what ran)")
            out.append({"notebook": nb, "preset": run.preset, "role": d["role"], "claim": d["claim"], "id": cid,
                        "needs": needs})
    return sorted(out, key=lambda c: ROLE_ORDER[c["role"]])


def retired_rows(latest: Mapping[str, Any], params_folder: str | os.PathLike | None = None) -> list[dict]:
    """The claims each notebook of these runs once declared and retired (``params/<notebook>/retired.yaml``,
    ``claims.load_retired``): one row each with why, when, and its last result and where that run is recorded.
    A claim that went against the paper stays on the page after it stops being tested."""
    from klear_lib import claims, notebook

    return _listed_rows(latest, params_folder, notebook.RETIRED_FILE, claims.load_retired)


def _listed_rows(latest: Mapping[str, Any], params_folder, name: str, load) -> list[dict]:
    """One row per entry of ``params/<notebook>/<name>`` (read by ``load``) of each notebook of these runs, with the
    notebook's name."""
    out = []
    for nb in latest:
        entries = _declared(params_folder, nb, name, load) or {}
        out.extend({"notebook": nb, **entry} for entry in entries.values())
    return out


def declared_controls(latest: Mapping[str, Any], params_folder: str | os.PathLike | None = None
                      ) -> dict[tuple[str, str], str]:
    """(notebook, claim id) -> the primary it controls, as each notebook of these runs declares it now
    (``control_of`` in ``params/<notebook>/claims.yaml``): the report reads a run written before claims carried
    ``control_of`` with it. A claim the run wrote with ``control_of`` keeps its own."""
    from klear_lib import claims, notebook

    out = {}
    for nb in latest:
        declared = _declared(params_folder, nb, notebook.CLAIMS_FILE, claims.load_declared) or {}
        out.update({(nb, cid): d["control_of"] for cid, d in declared.items() if d.get("control_of")})
    return out


def not_tested_rows(latest: Mapping[str, Any], params_folder: str | os.PathLike | None = None) -> list[dict]:
    """The paper's claims each notebook of these runs declares it does not test (``params/<notebook>/not_tested.yaml``,
    ``claims.load_not_tested``): one row each with the notebook, the claim, its source and the reason. Listed apart
    from the tested claims and never counted; a file that cannot be read is named in a warning (``_declared``)."""
    from klear_lib import claims, notebook

    return _listed_rows(latest, params_folder, notebook.NOT_TESTED_FILE, claims.load_not_tested)


def declared_guards(latest: Mapping[str, Any], params_folder: str | os.PathLike | None = None
                    ) -> dict[tuple[str, str], list[str]]:
    """(notebook, check id) -> the claim ids it guards, as each notebook of these runs declares it now (``guards`` in
    ``params/<notebook>/claims.yaml``): the report reads a run written before checks carried ``guards`` with them.
    A check the run wrote with ``guards`` keeps its own."""
    from klear_lib import claims, notebook

    out = {}
    for nb in latest:
        declared = _declared(params_folder, nb, notebook.CLAIMS_FILE, claims.load_declared) or {}
        out.update({(nb, cid): list(d["guards"]) for cid, d in declared.items() if d.get("guards")})
    return out
