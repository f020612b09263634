"""KlearGRPOTrainer overrides TRL internals. These tests fail loudly when TRL moves them."""

import inspect

import trl
from trl import GRPOTrainer

from klear_lib.train.rl import TRL_VERSION


def params(fn):
    return list(inspect.signature(fn).parameters)


def test_trl_is_the_pinned_release():
    assert trl.__version__ == TRL_VERSION, (
        f"klear_lib.train.rl overrides TRL {TRL_VERSION} internals but TRL {trl.__version__} is installed: "
        "re-read GRPOTrainer and update the overrides and this pin together"
    )


def test_overridden_signatures():
    assert params(GRPOTrainer._get_per_token_logps_and_entropies)[:7] == [
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy"]
    assert params(GRPOTrainer._calculate_rewards) == ["self", "inputs", "prompts", "completions", "completion_ids_list"]
    assert params(GRPOTrainer._generate_and_score_completions) == ["self", "inputs"]
    assert params(GRPOTrainer._compute_loss) == ["self", "model", "inputs"]


def test_rollout_pass_order_that_the_entropy_capture_relies_on():
    """The first log-prob pass inside _generate_and_score_completions must be the old policy's (on self.model),
    before the rewards; its result must be stored as `old_per_token_logps`; advantages must be a top-level key."""
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    lhs = "old_per_token_logps, _, _ = "
    first_pass = src.index(lhs + "self._get_per_token_logps_and_entropies(") + len(lhs)
    assert src.index("self._get_per_token_logps_and_entropies(") == first_pass
    assert first_pass < src.index("self._calculate_rewards(")
    assert '"advantages": advantages' in src and 'output["old_per_token_logps"] = old_per_token_logps' in src
    # the pass is skipped when generation and optimizer steps align (one update per rollout): then r == 1
    assert "self.args.gradient_accumulation_steps % generate_every != 0" in src


def test_logps_come_from_the_fused_head_with_entropy_output():
    src = inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies)
    assert "outputs.entropy" in src and "outputs.log_probs" in src
    init = inspect.getsource(GRPOTrainer.__init__)
    assert 'outputs=("log_probs", "entropy")' in init and "temperature=self.temperature" in init
