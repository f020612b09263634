"""Every committed preset is valid for its notebook, and the presets keep the project's promises:
`smoke` and `tiny` exist for every notebook; every preset sets every parameter (so an edit of a notebook's defaults,
e.g. a JupyterLab save, changes no preset), and the notebook's defaults are its `tiny` preset; `gpu`/`paper` differ
from `tiny` only in scale keys (plus the few keys that a GPU run must change: precision, device, rollout engine, the
paper's evaluation temperature); and every preset, launch config and `-p` example reads the same under
`yaml.safe_load` (YAML 1.1, papermill's reader) as under klear's reader."""

import math
import pathlib
import re

import pytest
import yaml

from klear_lib import claims, presets

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PRESETS = [(nb, preset) for nb in NOTEBOOKS for preset in presets.list_presets(nb.stem, ROOT / "params")]
# Notebooks whose default preset is not `tiny`: a real model's CPU pipeline check (notebook 08)
DEFAULT_PRESET = {"08_real_model": "small-real"}
assert all(presets.default_preset(nb, ROOT / "params") == p for nb, p in DEFAULT_PRESET.items())
SCALE_KEYS = {
    "model", "n_train", "n_heldout", "sft_epochs", "sft_lr", "sft_batch_size", "rollouts", "rollout_prompts",
    "mini_batch_prompts", "num_generations", "max_completion_length", "rl_lr", "eval_every", "eval_n",
    "eval_temperature", "use_vllm", "use_cpu", "bf16", "variants", "reward_modes", "seeds",
    # the RL notebooks' learning rates (a real model needs ~1e-6) and how many runs share a machine at once
    "lrs", "recipe_lr", "workers",
    # the SFT data notebooks (01, 02): data volume, the base model's and the ablation runs' SFT scale
    "n_val", "pool_per_source", "budget", "score_samples", "pool_size", "base_lr", "base_epochs",
    "base_batch_size",
}
# The evaluation notebook's gpu/paper presets also choose what is evaluated and how (checkpoints, benchmarks,
# engine, samples, budgets): there the whole notebook is about scale.
NOTEBOOK_SCALE_KEYS = {
    "07_evaluation": {"benchmarks", "benchmark_paths", "checkpoints", "train_tiny", "engine", "n", "budgets",
                      "yarn_factor", "limit", "batch_size", "judge_workers", "temperature"},
    # sandbox processes per unit (a GPU box has more cores); the sparse regime's seeds, beside "seeds"
    "05_code_reward": {"reward_workers", "sparse_seeds"},
    "01_sft_data_sources": {"defect_seeds"},  # the positive control's seeds, beside "seeds"
}
# Parts of the design that `tiny` may leave out for its CPU time budget (`make reproduce` within 100 minutes on 2
# cores) and a GPU run keeps: 02's subsets and 06's alphas (tiny runs them all since 2026-12-07 and -05), 04's
# half-lr arm (lists: tiny's must be a part of gpu's), 03's rollouts of the on-policy control (a count: tiny's at
# most gpu's) and 04's gradient-norm secondary (a flag: off at tiny, on at gpu). Never another design: only less of
# the same one.
BUDGET_LISTS = {"02_sft_accuracy_filtering": {"subsets"}, "06_sft_loss_alpha": {"alphas"}, "04_erc_bounds": {"arms"}}
BUDGET_COUNTS = {"03_rl_clip_variants": {"control_rollouts"}}
BUDGET_FLAGS = {"04_erc_bounds": {"grad_norm_claim"}}


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_has_smoke_and_tiny(nb):
    """A real-model notebook's default is its own CPU preset, not `tiny` (the stand-in, which `make reproduce`
    runs): 08's `small-real` is a pipeline check of minutes on SmolLM2 that reproduces no claim."""
    assert {"smoke", DEFAULT_PRESET.get(nb.stem, "tiny")} <= set(presets.list_presets(nb.stem, ROOT / "params"))
    if nb.stem in DEFAULT_PRESET:
        assert "tiny" not in presets.list_presets(nb.stem, ROOT / "params")  # not part of make reproduce


@pytest.mark.parametrize("nb,preset", PRESETS, ids=lambda x: getattr(x, "stem", x))
def test_preset_keys_are_notebook_parameters(nb, preset):
    params = presets.load_params(nb.stem, preset, params_dir=ROOT / "params")
    presets.validate_params(params, presets.notebook_parameters(nb), notebook=nb.stem)


@pytest.mark.parametrize("nb,preset", [(nb, p) for nb, p in PRESETS if p in ("gpu", "paper")],
                         ids=lambda x: getattr(x, "stem", x))
def test_gpu_presets_change_only_scale_keys(nb, preset):
    params = presets.load_params(nb.stem, preset, params_dir=ROOT / "params")
    tiny = presets.load_params(nb.stem, DEFAULT_PRESET.get(nb.stem, "tiny"), params_dir=ROOT / "params")
    changed = {k for k, v in params.items() if tiny[k] != v}
    lists, counts = BUDGET_LISTS.get(nb.stem, set()), BUDGET_COUNTS.get(nb.stem, set())
    flags = BUDGET_FLAGS.get(nb.stem, set())
    allowed = SCALE_KEYS | NOTEBOOK_SCALE_KEYS.get(nb.stem, set()) | lists | counts | flags
    assert changed, f"{nb.stem}/{preset} changes nothing against tiny"
    assert changed <= allowed, sorted(changed - allowed)
    for k in lists & changed:
        assert set(str(tiny[k]).split(",")) < set(str(params[k]).split(",")), (k, tiny[k], params[k])
    for k in counts & changed:
        assert tiny[k] < params[k], (k, tiny[k], params[k])
    for k in flags & changed:
        assert (tiny[k], params[k]) == (False, True), (k, tiny[k], params[k])


@pytest.mark.parametrize("nb,preset", PRESETS, ids=lambda x: getattr(x, "stem", x))
def test_every_preset_sets_every_parameter(nb, preset):
    """A preset that left a parameter to the notebook's default would change when the default is edited (one save
    in JupyterLab): every preset names every parameter but run_dir."""
    params = presets.load_params(nb.stem, preset, params_dir=ROOT / "params")
    declared = [k for k in presets.notebook_parameters(nb) if k != presets.RUN_DIR_PARAM]
    assert sorted(set(declared) - set(params)) == [], f"params/{nb.stem}/{preset}.yaml lacks these parameters"
    assert list(params) == declared, f"params/{nb.stem}/{preset}.yaml: keys out of the notebook's order"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_defaults_are_the_tiny_preset(nb):
    """The parameters cell says "Defaults = the `tiny` preset" (a real-model notebook's: its own CPU preset): an edited
    default (a Lab save) fails here."""
    default = DEFAULT_PRESET.get(nb.stem, "tiny")
    if nb.stem in DEFAULT_PRESET:
        assert f"Defaults = the `{default}` preset" in nb.with_suffix(".py").read_text(encoding="utf-8")
    defaults = {k: presets.notebook_default(v) for k, v in presets.notebook_parameters(nb).items()
                if k != presets.RUN_DIR_PARAM}
    tiny = presets.load_params(nb.stem, default, params_dir=ROOT / "params")
    differs = {k: (defaults[k], tiny[k]) for k in defaults if not presets.same_value(defaults[k], tiny[k])}
    assert differs == {}, f"{nb.stem}: (notebook default, tiny preset) differ; one of them was edited"


YAML_FILES = sorted([*ROOT.glob("params/**/*.yaml"), *ROOT.glob("configs/**/*.yaml")])


def _typed(obj):
    """A loaded YAML document with every scalar paired with its type (1 == 1.0 == True in Python)."""
    if isinstance(obj, dict):
        return {k: _typed(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_typed(v) for v in obj]
    return (type(obj).__name__, obj)


def test_there_are_yaml_files():
    assert len(YAML_FILES) >= 28


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_preset_and_config_reads_alike_under_yaml_1_1(path):
    text = path.read_text(encoding="utf-8")
    assert _typed(yaml.safe_load(text)) == _typed(presets.load_yaml_file(path))


def test_a_file_that_yaml_1_1_reads_otherwise_is_refused_naming_the_key(tmp_path):
    (tmp_path / "p.yaml").write_text("seeds: \"0\"\nsft_lr: 4e-3\n", encoding="utf-8")
    with pytest.raises(presets.KlearError, match=r"p\.yaml: sft_lr is the str '4e-3' under YAML 1\.1 .* but the float "
                                             r"0\.004 under klear's reader; write 0\.004"):
        presets.load_yaml_file(tmp_path / "p.yaml", like_yaml_1_1=True)
    (tmp_path / "c.yaml").write_text("run:\n  lrs: [1.0e-4, 1e-5]\n", encoding="utf-8")
    with pytest.raises(presets.KlearError, match=r"run\.lrs\[1\] is the str '1e-5'.*write 1\.0e-05"):
        presets.load_yaml_file(tmp_path / "c.yaml", like_yaml_1_1=True)
    assert presets.load_yaml_file(tmp_path / "c.yaml") == {"run": {"lrs": [1e-4, 1e-5]}}  # launch configs: lenient
    (tmp_path / "params" / "nb").mkdir(parents=True)
    (tmp_path / "params" / "nb" / "tiny.yaml").write_text("lr: 1e-3\n", encoding="utf-8")
    # a preset, as klear run reads it
    with pytest.raises(presets.KlearError, match=r"tiny\.yaml: lr is the str '1e-3'"):
        presets.load_params("nb", "tiny", params_dir=tmp_path / "params")


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "klear_lib" / "cli.py"]
P_EXAMPLE = re.compile(r"(?:-p|--param) +([A-Za-z_]\w*)=([^\s`'\"]+)")


def test_every_p_example_in_the_docs_reads_alike_under_yaml_1_1():
    examples = [(doc.name, key, value) for doc in DOCS for key, value in P_EXAMPLE.findall(doc.read_text("utf-8"))
                if not any(mark in value for mark in ("...", "$", "<"))]  # placeholders, not values
    assert len(examples) >= 6, examples
    differ = [(doc, f"{key}={value}") for doc, key, value in examples
              if _typed(yaml.safe_load(value)) != _typed(presets.parse_value(value))]
    assert differ == []


# --------------------------------------------------------------------------------------------------------------
# Can the rule decide each claim at a preset's seeds (`tiny` and `gpu`)? Holm holds the first of m secondaries to
# 5%/m, and from 6 seeds the sign-flip test must agree at that level; its smallest p is 2^(1-n). A claim whose level
# is below that floor comes out `inconclusive` before the run (`claims.mde` is infinite there): a design with a
# built-in answer. Which declared claims a preset makes is each claim's `requires` (claims.made), the rule the
# notebooks read.


SUBSET_SEEDS = {"defects.": "defect_seeds", "sparse.": "sparse_seeds"}
"""Claims run on a subset of the seeds: 01's defects check (``defect_seeds``), 05's sparse regime (``sparse_seeds``)."""


def undecidable(nb: str, params: dict, declared: dict) -> list[str]:
    """The claims of ``declared`` that notebook ``nb`` makes with ``params`` and that the rule cannot decide."""
    made = claims.made(declared, params, where=nb)
    n_secondary = sum(d["role"] == "secondary" for d in made.values())
    out = []
    for cid, d in made.items():
        if d["role"] == "check" and "expect" not in d:
            continue  # a pass/fail threshold, not the paired rule
        key = next((k for prefix, k in SUBSET_SEEDS.items() if cid.startswith(prefix) and k in params), "seeds")
        seeds = params[key]
        n = len(str(seeds).split(","))
        level = claims.ALPHA / n_secondary if d["role"] == "secondary" else claims.ALPHA
        if n < claims.MIN_SEEDS or not math.isfinite(claims.mde(1.0, n, alpha=level)):
            out.append(cid)
    return out


def test_undecidable_finds_the_secondaries_below_the_sign_flip_floor():
    """Hand-made declarations: at 6 seeds two secondaries (level 0.025, below the floor 2^-5 = 0.031) cannot be
    decided and the primary (0.05) can; at 7 seeds (2^-6 = 0.016) all can; a claim the preset does not make (02's
    easy subset left out) neither counts nor is listed, and one secondary alone (0.05) is decided at 6 seeds; an A/A
    check at 2 seeds is listed (below 3 the rule never decides)."""
    hard, easy = {"requires": {"subsets": "hard"}}, {"requires": {"subsets": "easy"}}
    decl = {"hard.mixed_vs_only_true": {"role": "primary", **hard},
            "hard.mixed_vs_only_true_matched": {"role": "secondary", **hard},
            "hard.mixed_vs_only_true_covered": {"role": "secondary", **hard},
            "easy.mixed_vs_only_true": {"role": "secondary", **easy}, "starts_learned": {"role": "check"}}
    six, seven = "0,1,2,3,4,5", "0,1,2,3,4,5,6"
    nb = "02_sft_accuracy_filtering"
    assert undecidable(nb, {"seeds": six, "subsets": "hard"}, decl) == [
        "hard.mixed_vs_only_true_matched", "hard.mixed_vs_only_true_covered"]
    assert undecidable(nb, {"seeds": seven, "subsets": "hard"}, decl) == []
    one = {k: v for k, v in decl.items() if k != "hard.mixed_vs_only_true_covered"}
    assert undecidable(nb, {"seeds": six, "subsets": "hard"}, one) == []
    assert undecidable(nb, {"seeds": six, "subsets": "easy,hard"}, one) == [
        "hard.mixed_vs_only_true_matched", "easy.mixed_vs_only_true"]
    sparse = {"soft_vs_hard.final": {"role": "primary"}, "sparse.soft_vs_hard.final": {"role": "secondary"}}
    assert undecidable("05_code_reward", {"seeds": six, "sparse_seeds": "0,1"}, sparse) == [
        "sparse.soft_vs_hard.final"]  # the sparse regime's own seeds count: 2, below the rule's 3
    assert undecidable("05_code_reward", {"seeds": six, "sparse_seeds": six}, sparse) == []
    aa = {"aa": {"role": "check", "expect": "inconclusive"}}
    assert undecidable("06_sft_loss_alpha", {"seeds": "0,1", "alphas": "0,0.1"}, aa) == ["aa"]


# Every tiny and gpu preset decides every claim it makes (k Holm-adjusted secondaries need k · 2^-(n-1) < 5%:
# 01 runs 7 seeds for its two).
@pytest.mark.parametrize("nb,preset", [
    (p.stem, preset)
    for p in NOTEBOOKS if (ROOT / "params" / p.stem / "claims.yaml").exists()
    for preset in ("tiny", "gpu") if (ROOT / "params" / p.stem / f"{preset}.yaml").exists()
    and "seeds" in presets.load_params(p.stem, preset, params_dir=ROOT / "params")])
def test_every_claim_of_the_tiny_and_gpu_presets_can_be_decided_at_their_seeds(nb, preset):
    assert undecidable(nb, presets.load_params(nb, preset, params_dir=ROOT / "params"),
                       claims.load_declared(ROOT / "params" / nb / "claims.yaml")) == []
