"""What every ablation notebook does around its experiment: quiet libraries, parse list parameters, open the run
directory where the report looks, write the summary with its beside-the-paper table and its claims checked."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from klear_lib import claims as claims_mod
from klear_lib import presets as presets_mod
from klear_lib import runs

OUTPUT_ROOT_ENV = "KLEAR_OUTPUT_ROOT"


def quiet() -> None:
    """Keep notebook output to what a reader needs: no per-row progress bars from `datasets`, no library
    deprecation chatter (TRL 1.16 on transformers 5.24 warns about gradient checkpointing names on every run)."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message="IProgress not found")
    logging.getLogger("transformers").setLevel(logging.ERROR)


def repo_root() -> Path | None:
    """The checkout that holds this package (its ``notebooks/`` beside ``klear_lib/``), or None when installed
    elsewhere."""
    candidate = Path(__file__).resolve().parent.parent
    return candidate if (candidate / "notebooks").is_dir() and (candidate / "klear_lib").is_dir() else None


def output_root() -> Path:
    """Where run directories go, whatever the working directory (JupyterLab starts kernels in ``notebooks/``):
    ``$KLEAR_OUTPUT_ROOT`` if set, else the checkout's ``outputs/``, else ``./outputs``."""
    env = os.environ.get(OUTPUT_ROOT_ENV)
    if env:
        return Path(env).resolve()
    root = repo_root()
    return (root / "outputs") if root is not None else Path.cwd().resolve() / "outputs"


def start_run(name: str, run_dir: str, config: Any, params: Mapping[str, Any] | None = None) -> Path:
    """The run directory of notebook ``name``: ``run_dir`` when ``klear run``/papermill set it, else a new
    ``<output root>/<name>/<stamp>``; writes the resolved config, versions and commit there and returns it.

    ``params`` (the notebook's ``globals()``): also write ``preset.json``, which preset the parameters are
    (``identify_preset``) and who launched the run, so that the report marks smoke and custom runs however they
    were started (``klear run``, papermill, JupyterLab)."""
    path = Path(run_dir).resolve() if run_dir else runs.create_run_dir(output_root(), name)
    path.mkdir(parents=True, exist_ok=True)
    from klear_lib import sampler  # issue 46: which generation path the run's stand-in model takes
    from klear_lib.rewards.sandbox import sandbox_mode  # how the code sandbox bounds a sample here (issue 37)

    runs.write_run_metadata(path, config, versions={"sandbox": sandbox_mode(), "sampler": sampler.setting()})
    if params is not None:
        runs.write_preset_record(path, {**identify_preset(name, params), "launcher": launcher()})
    return path


# Parameters that say how a run runs, not what it computes (worker processes, the tracker): a run that changes only
# these is still its preset's run.
HOW_IT_RUNS = frozenset({"run_dir", "workers", "reward_workers", "judge_workers", "report_to"})


PARAMS_DIR_ENV = "KLEAR_PARAMS_DIR"  # set by `klear run` for its kernel: the presets it resolved parameters from


def params_dir() -> Path | None:
    """Where the presets are: ``$KLEAR_PARAMS_DIR`` (``klear run --params-dir``), else the checkout's ``params/``,
    else None (the package runs outside a checkout)."""
    if os.environ.get(PARAMS_DIR_ENV):
        return Path(os.environ[PARAMS_DIR_ENV])
    root = repo_root()
    return root / "params" if root is not None and (root / "params").is_dir() else None


def identify_preset(name: str, namespace: Mapping[str, Any], presets_dir: str | os.PathLike | None = None) -> dict:
    """Which preset of notebook ``name`` the parameter values in ``namespace`` are.

    Every preset sets every parameter (tests/test_presets.py), so a run is preset P when each of P's values equals
    the run's (``presets.same_value``; the ``HOW_IT_RUNS`` keys aside). Returns ``{"preset": P | "custom" | None,
    "nearest": the preset with the fewest differences, "differs": {key: {"run": value, "preset": value}} against
    it, "params": the run's values of the preset keys}``; ``preset`` is None when there are no presets to compare
    with (``presets_dir`` defaults to the checkout's ``params/``)."""
    folder = Path(presets_dir) if presets_dir is not None else params_dir()
    presets = presets_mod.list_presets(name, folder) if folder is not None else []
    if not presets:
        return {"preset": None, "nearest": None, "differs": {}, "params": {}}
    loaded = {p: presets_mod.load_params(name, p, params_dir=folder) for p in presets}
    keys = list(dict.fromkeys(k for values in loaded.values() for k in values))
    values = {k: namespace[k] for k in keys if k in namespace}
    differs = {p: {k: {"run": values.get(k), "preset": v} for k, v in preset.items()
                   if k not in HOW_IT_RUNS and not presets_mod.same_value(values.get(k), v)}
               for p, preset in loaded.items()}
    nearest = min(presets, key=lambda p: len(differs[p]))  # presets in the project's order: smoke wins ties
    return {"preset": nearest if not differs[nearest] else "custom", "nearest": nearest,
            "differs": differs[nearest], "params": values}


def launcher() -> str:
    """Who started this process: ``klear run`` (it says so in ``KLEAR_LAUNCHER``), ``jupyter`` (a kernel of a
    Jupyter server session: JupyterLab), ``kernel`` (another kernel client: papermill, nbclient) or ``python``."""
    import sys

    if os.environ.get(LAUNCHER_ENV):
        return os.environ[LAUNCHER_ENV]
    if os.environ.get("JPY_SESSION_NAME"):
        return "jupyter"
    return "kernel" if "ipykernel" in sys.modules else "python"


LAUNCHER_ENV = "KLEAR_LAUNCHER"


def cache_root(run_path: Path) -> Path:
    """Where a run's shared models are cached (the SFT warm start, the SFT notebooks' base models): ``.cache/`` in
    the output root the run directory ``run_path`` (``<root>/<notebook>/<stamp>``) lies in, so that runs into one
    root share them and a run into another root (``klear run --output-root``, the test suite's run folders) neither
    reads nor fills the checkout's."""
    return Path(run_path).parent.parent / ".cache"


def config_from(cls, namespace: Mapping[str, Any], **fixed: Any):
    """``cls`` (a strict config dataclass with ``from_params``) from a notebook's parameters: every field of
    ``cls`` that ``namespace`` (the notebook's ``globals()``) defines, then ``fixed`` on top (what the notebook
    holds constant, e.g. ``sft_alpha=0.0``). Types and ranges are checked by ``cls``."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    return cls.from_params({**{k: namespace[k] for k in sorted(names) if k in namespace}, **fixed})


def parse_list(value: Any, name: str, cast: Callable[[str], Any] = str, *, allowed=None, minimum=None) -> list:
    """A list parameter, written as a comma-separated string (``"0,1,2"``); a single number is a one-item list
    (``-p seeds=1`` gives the int 1). Empty items are errors, as are items ``cast`` refuses, items not in
    ``allowed`` and items below ``minimum`` (seeds: 0, as numpy refuses a negative seed only when a unit starts);
    every message names the parameter and the value."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{name} = {value!r}: expected a comma-separated list, e.g. '0,1,2'")
    text = str(value)
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise ValueError(f"{name} = {value!r}: expected a comma-separated list without empty items, e.g. '0,1,2'")
    out = []
    for item in items:
        try:
            out.append(cast(item))
        except (TypeError, ValueError):
            kind = getattr(cast, "__name__", "value")
            raise ValueError(f"{name} = {value!r}: {item!r} is not a valid {kind}") from None
    if allowed is not None:
        bad = [x for x in out if x not in allowed]
        if bad:
            raise ValueError(f"{name} = {value!r}: unknown {bad}; valid: {list(allowed)}")
    if minimum is not None and any(x < minimum for x in out):
        raise ValueError(f"{name} = {value!r}: every item must be >= {minimum}")
    if len(set(map(str, out))) != len(out):
        raise ValueError(f"{name} = {value!r}: an item is repeated")
    return out


def require(namespace: Mapping[str, Any], *, counts: tuple[str, ...] = (), positive: tuple[str, ...] = (),
            non_negative: tuple[str, ...] = (), fractions: tuple[str, ...] = ()) -> None:
    """Check the notebook parameters that no config dataclass holds, in its config cell (so ``klear run``'s dry
    run and any Run All refuse a bad value before work): ``counts`` are integers >= 1 (worker counts, seeds of a
    panel), ``positive`` numbers > 0, ``non_negative`` numbers >= 0, ``fractions`` numbers in [0, 1]. A ValueError
    names the first parameter out of range, its value and what was expected."""
    def number(key):
        value = namespace[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} = {value!r}: expected a number")
        return value

    for key in counts:
        value = number(key)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} = {value!r}: expected an integer >= 1")
    for key in positive:
        if not number(key) > 0:
            raise ValueError(f"{key} = {namespace[key]!r}: expected a number > 0")
    for key in non_negative:
        if not number(key) >= 0:
            raise ValueError(f"{key} = {namespace[key]!r}: expected a number >= 0")
    for key in fractions:
        if not 0 <= number(key) <= 1:
            raise ValueError(f"{key} = {namespace[key]!r}: expected a number in [0, 1]")


def workers(value: Any, key: str = "workers") -> int:
    """A notebook's worker count as a number, in its config cell: ``"auto"`` is the cores this process may use, an
    integer is kept if the machine has that many (``presets.resolve_workers``, the one rule ``klear run`` checks
    before a kernel starts too); the notebook records the number in its ``config.json``."""
    return presets_mod.resolve_workers(value, key)


CLAIMS_FILE = "claims.yaml"  # beside a notebook's presets: its claims, declared before any training
RETIRED_FILE = "retired.yaml"  # beside them: the claims it no longer tests, each with its last result
NOT_TESTED_FILE = "not_tested.yaml"  # beside them: the paper's claims it does not test at all, with why


def declared_claims(name: str, params: Mapping | None = None) -> dict[str, dict]:
    """Notebook ``name``'s claims as declared in ``params/<name>/claims.yaml`` (``claims.load_declared``): read
    in the config cell, before any training, and written into the run's config. With ``params`` (the notebook's
    parameters, e.g. ``globals()``): only the claims a run with them makes (``claims.made``: each claim's
    ``requires``), which ``claims.finalize`` then wants exactly."""
    folder = params_dir()
    if folder is None:
        raise FileNotFoundError(f"{name}: no params/ folder to read {CLAIMS_FILE} from (set {PARAMS_DIR_ENV})")
    declared = claims_mod.load_declared(folder / name / CLAIMS_FILE)
    return declared if params is None else claims_mod.made(declared, params, where=f"{name} claims")


def claims_frame(claim_list: list[dict]):
    """The claims as a table to read: role, effect and its 95% interval, p (adjusted for secondaries), the MDE,
    seeds and verdict (a check's pass/fail)."""
    import pandas as pd

    rows = []
    for c in claim_list:
        paired = "ci_low" in c
        rows.append({"id": c["id"], "role": c["role"], "effect": c["effect"],
                     "95% interval": f"[{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]" if paired else "",
                     "p": c.get("p_adjusted", c.get("p_value")),
                     "mde": "inf" if c.get("undetectable") else c.get("mde"), "seeds": c["seeds"],
                     "verdict": c["verdict"]})
    return pd.DataFrame(rows).round(4)


BESIDE_PAPER_FIELDS = ("caption", "columns", "rows")


def check_beside_paper(table: Mapping) -> Mapping:
    """The ``summary["beside_paper"]`` contract: caption, columns, rows (each as long as columns), optional note."""
    missing = [f for f in BESIDE_PAPER_FIELDS if f not in table]
    if missing:
        raise ValueError(f"beside_paper: missing {missing}")
    width = len(table["columns"])
    for i, row in enumerate(table["rows"]):
        if len(row) != width:
            raise ValueError(f"beside_paper.rows[{i}] has {len(row)} cells for {width} columns {table['columns']}")
    return table


def write_summary(run_path: Path, summary: Mapping) -> None:
    """``runs.write_summary`` after checking the beside-the-paper table and the claims (``klear_lib.claims``)."""
    if "beside_paper" in summary:
        check_beside_paper(summary["beside_paper"])
    if "claims" in summary:
        claims_mod.validate_claims(summary["claims"], where="summary['claims']")
    runs.write_summary(run_path, summary)
