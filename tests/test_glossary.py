"""The metric glossary: every key a run logs is defined once. The RL notebooks' check cells assert, at their smoke
preset under nbval, that their metrics.jsonl holds no key the glossary lacks; these tests pin the lookup."""

from klear_lib import glossary
from klear_lib.losses import METRICS


def test_every_loss_metric_is_in_the_glossary_with_its_formula():
    for key, formula in METRICS.items():
        assert glossary.lookup(key)[1] == formula


def test_patterns_match_one_path_component_only():
    assert glossary.lookup("rewards/correctness_reward/mean") is not None
    assert glossary.lookup("rewards/a/b/mean") is None
    assert glossary.lookup("eval/avg_at_n_level3") is not None
    assert glossary.lookup("completions/mean_length") is not None
    assert glossary.undefined(["step", "actor/pg_loss", "made/up"]) == ["made/up"]
    assert glossary.title("klear/p_correct_fork") == "p(right digit) at the forks"
    assert glossary.title("made/up") == "made/up"


def test_trainer_metrics_are_defined():
    for key in ("klear/informative_completions", "klear/kept_groups", "klear/generated_groups",
                "klear/updates_this_rollout", "klear/p_correct_fork", "actor/pg_clipfrac_low_fork",
                "actor/random_stop_frac", "erc/masked_frac_low", "eval/avg_at_n_fork"):
        assert glossary.lookup(key) is not None, key
