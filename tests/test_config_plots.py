"""Strict configs, and the plots/tables that read a run directory."""

import math

import pytest

from klear_lib import plots, runs
from klear_lib.config import RLExperimentConfig


def test_unknown_key_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['rl_lrr'\]; valid keys: .*'rl_lr'"):
        RLExperimentConfig.from_params({"rl_lrr": 1e-4})


def test_types_are_checked_and_ints_pass_as_floats():
    cfg = RLExperimentConfig.from_params({"rl_lr": 1, "erc_low": None, "seed": 3})
    assert cfg.rl_lr == 1.0 and isinstance(cfg.rl_lr, float) and cfg.seed == 3
    with pytest.raises(TypeError, match=r"RLExperimentConfig.seed must be int, got '3'"):
        RLExperimentConfig.from_params({"seed": "3"})
    with pytest.raises(TypeError, match="use_cpu must be bool"):
        RLExperimentConfig.from_params({"use_cpu": 1})


def test_derived_values_and_validation():
    cfg = RLExperimentConfig(rollouts=10, rollout_prompts=32, mini_batch_prompts=4)
    assert cfg.updates_per_rollout == 8 and cfg.max_steps == 80
    with pytest.raises(ValueError, match="multiple of mini_batch_prompts"):
        RLExperimentConfig(rollout_prompts=10, mini_batch_prompts=4)
    with pytest.raises(ValueError, match="loss_name must be a registered loss"):
        RLExperimentConfig(loss_name="ppo")
    with pytest.raises(ValueError, match="erc"):
        RLExperimentConfig(erc_low=0.9)  # ERC needs both bounds


@pytest.mark.parametrize("bad, message", [
    (dict(rl_lr=-1e-3), r"rl_lr must be > 0, got -0.001"),
    (dict(rl_lr=0.0), r"rl_lr must be > 0"),
    (dict(rollouts=0), r"rollouts must be > 0, got 0"),
    (dict(num_generations=1), r"num_generations must be >= 2"),
    (dict(fork_wrong_rate=1.5), r"fork_wrong_rate must be in \[0, 1\]"),
    (dict(fork_facts="2+3->5"), r"fork fact '2\+3->5'.*is right"),
    (dict(fork_facts="2+9->1"), r"addend must be in 1..3"),
    (dict(fork_facts="two"), r"expected VALUE\+ADDEND->WRONG"),
    (dict(oversample_factor=0.5), r"oversample_factor must be >= 1"),
    (dict(max_gen_batches=0), r"max_gen_batches must be an int >= 1"),
    (dict(weight_decay=-0.1), r"weight_decay must be >= 0"),
])
def test_bad_values_are_refused_before_any_work(bad, message):
    with pytest.raises(ValueError, match=message):
        RLExperimentConfig.from_params(bad)


def test_replace_is_a_checked_diff():
    base = RLExperimentConfig()
    v = base.replace(loss_name="gppo", beta_low=0.5)
    assert v.beta_low == 0.5 and v.klear_loss.policy_loss.beta_low == 0.5
    assert {k for k in vars(v) if getattr(v, k) != getattr(base, k)} == {"beta_low"}
    with pytest.raises(ValueError, match="unknown key"):
        base.replace(betalow=0.5)


@pytest.fixture
def run_dir(tmp_path):
    # two variants x two seeds; eval before RL (rollout 0) and after rollout 1; one rollout of two steps
    with runs.MetricsWriter(tmp_path / "metrics.jsonl") as w:
        for variant, start, gain in (("a", 0.5, 0.1), ("b", 0.4, 0.3)):
            for seed in (0, 1):
                w.write({"variant": variant, "seed": seed, "rollout": 0, "step": 0, "eval/avg_at_n": start})
                for step in (1, 2):
                    w.write({"variant": variant, "seed": seed, "rollout": 1, "step": step, "actor/pg_loss": 0.1,
                             "actor/pg_clipfrac_high": 0.01 * step, "entropy": 1.0, "grad_norm": 1.0})
                w.write({"variant": variant, "seed": seed, "rollout": 1, "step": 2,
                         "eval/avg_at_n": start + gain + 0.02 * seed})
    return tmp_path


def test_final_table_by_hand(run_dir):
    table = plots.final_table(plots.metrics_frame(run_dir))
    assert list(table.index) == ["a", "b"]
    # a: finals 0.6, 0.62 -> mean 0.61, std 0.01414; deltas 0.1, 0.12 -> mean 0.11, min 0.1
    assert table.loc["a", "final"] == pytest.approx(0.61)
    assert table.loc["a", "final_std"] == pytest.approx(math.sqrt(2) * 0.01)
    assert table.loc["a", "delta"] == pytest.approx(0.11) and table.loc["a", "delta_min"] == pytest.approx(0.1)
    assert table.loc["b", "start"] == pytest.approx(0.4) and table.loc["b", "seeds"] == 2
    # clip fraction: mean over steps 1, 2 of 0.01, 0.02
    assert table.loc["b", "pg_clipfrac_high"] == pytest.approx(0.015)


def test_curves_mean_and_std_over_seeds(run_dir):
    c = plots.curves(plots.metrics_frame(run_dir), "eval/avg_at_n")
    row = c[(c["variant"] == "b") & (c["rollout"] == 1)].iloc[0]
    assert row["mean"] == pytest.approx(0.71) and row["count"] == 2


def test_plot_writes_a_figure(run_dir, tmp_path):
    fig = plots.plot_curves(plots.metrics_frame(run_dir), ["eval/avg_at_n", "actor/pg_clipfrac_high", "missing"],
                            out=tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 1000
    assert len([ax for ax in fig.axes if ax.lines]) == 2


def test_one_name_per_knob_every_recipe_field_reaches_the_recipe_config():
    """RLExperimentConfig names each loss and recipe knob as KlearLossConfig / PolicyLossConfig do, and klear_loss
    hands every same-named field over (a new knob: a field there and a field here, nothing else)."""
    import dataclasses

    from klear_lib.losses import PolicyLossConfig
    from klear_lib.recipe import KlearLossConfig

    changed = RLExperimentConfig(loss_name="cispo", clip_ratio_low=0.15, clip_ratio_high=0.3, clip_ratio_c=5.0,
                                 beta_low=0.5, erc_low=0.9, erc_high=1.1, sft_alpha=0.2, adv_std="population",
                                 filter_rule="dapo", oversample_factor=1.5, max_gen_batches=3, random_stop_frac=0.1)
    k = changed.klear_loss
    for cls, obj in ((KlearLossConfig, k), (PolicyLossConfig, k.policy_loss)):
        for f in dataclasses.fields(cls):
            if hasattr(changed, f.name) and f.name != "policy_loss":
                assert getattr(obj, f.name) == getattr(changed, f.name), f.name
    assert (k.loss_name, k.policy_loss.clip_ratio_c, k.max_gen_batches) == ("cispo", 5.0, 3)
