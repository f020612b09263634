"""Every committed preset is valid for its notebook, and the presets keep the project's promises:
`smoke` and `tiny` exist for every notebook, and `gpu`/`paper` change only scale keys (plus the few keys that a
GPU run must change: precision, device, rollout engine, the paper's evaluation temperature)."""

import pathlib

import pytest

from klear_lib import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PRESETS = [(nb, y.stem) for nb in NOTEBOOKS for y in sorted((ROOT / "params" / nb.stem).glob("*.yaml"))]
SCALE_KEYS = {
    "model", "n_train", "n_heldout", "sft_epochs", "sft_lr", "sft_batch_size", "rollouts", "rollout_prompts",
    "mini_batch_prompts", "num_generations", "max_completion_length", "rl_lr", "eval_every", "eval_n",
    "eval_temperature", "use_vllm", "use_cpu", "bf16", "variants", "reward_modes", "seeds",
    # the RL notebooks' learning rates (a real model needs ~1e-6) and how many runs share a machine at once
    "lrs", "workers",
    # the SFT data notebooks (01, 02): data volume, the base model's and the ablation runs' SFT scale
    "n_val", "pool_per_source", "budget", "score_samples", "pool_size", "base_lr", "base_epochs",
    "base_batch_size",
}
# The evaluation notebook's gpu/paper presets also choose what is evaluated and how (checkpoints, benchmarks,
# engine, samples, budgets): there the whole notebook is about scale.
NOTEBOOK_SCALE_KEYS = {
    "07_evaluation": {"benchmarks", "benchmark_paths", "checkpoints", "train_tiny", "engine", "n", "budgets",
                      "yarn_factor", "limit", "batch_size", "judge_workers", "temperature"},
    "05_code_reward": {"reward_workers"},  # sandbox processes per unit: a GPU box has more cores
}


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_has_smoke_and_tiny(nb):
    assert {"smoke", "tiny"} <= set(cli.list_presets(nb.stem, ROOT / "params"))


@pytest.mark.parametrize("nb,preset", PRESETS, ids=lambda x: getattr(x, "stem", x))
def test_preset_keys_are_notebook_parameters(nb, preset):
    params = cli.load_params(nb.stem, preset, params_dir=ROOT / "params")
    cli.validate_params(params, cli.notebook_parameters(nb), notebook=nb.stem)


@pytest.mark.parametrize("nb,preset", [(nb, p) for nb, p in PRESETS if p in ("gpu", "paper")],
                         ids=lambda x: getattr(x, "stem", x))
def test_gpu_presets_change_only_scale_keys(nb, preset):
    params = cli.load_params(nb.stem, preset, params_dir=ROOT / "params")
    allowed = SCALE_KEYS | NOTEBOOK_SCALE_KEYS.get(nb.stem, set())
    assert set(params) <= allowed, sorted(set(params) - allowed)
