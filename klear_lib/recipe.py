"""What the Klear recipe adds to a GRPO step, as a config importable without the trainer (reference §1-4).

``KlearLossConfig`` holds the loss (``klear_lib.losses``), the advantage normalisation, the group filter and
dynamic sampling, and the positive-sample term. The TRL trainer (``klear_lib.train.rl``), the launch configs
and the verl adapter all read it; ``klear_lib.config.RLExperimentConfig.klear_loss`` builds it from a
notebook's flat parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from klear_lib.advantages import FILTER_RULES, STD_MODES
from klear_lib.losses import AGG_MODES, ENTROPY_BUCKETS, POLICY_LOSSES, PolicyLossConfig


@dataclass
class KlearLossConfig:
    """The Klear recipe around a GRPO step (reference §1-4)."""

    loss_name: str = "gppo"
    """A name in ``klear_lib.losses.POLICY_LOSSES``."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Clip range, dual-clip, GPPO β and ERC bounds."""
    loss_agg_mode: str = "token-mean"
    """Loss normalisation (Klear: token-mean). With several processes, each token-mean (the policy loss over every
    response token, the positive-sample NLL over the fully-correct responses' tokens) is over the global
    mini-batch, as in the verl path; see docs/scale.md, "Token-mean normalisation"."""
    adv_std: str = "unbiased"
    """GRPO std: ``unbiased`` (Klear's code, N-1), ``population`` (the paper, N) or ``none`` (Dr. GRPO)."""
    adv_eps: float = 1e-6
    """ε in (R - mean) / (std + ε)."""
    filter_groups: bool = True
    """Dynamic sampling: train only on groups that pass the filter (``filter_rule``); the others are dropped
    before mini-batches are packed."""
    filter_rule: str = "klear"
    """``klear`` (std of the fully-correct indicator > 0) or ``dapo`` (std of the rewards > 0)."""
    oversample_factor: float = 2.0
    """Prompts generated per rollout, as a multiple of the rollout's target prompt count (Klear: 256 generated for
    128 trained on, 2.0). The groups that pass the filter are kept up to the target, in draw order."""
    max_gen_batches: int = 1
    """Generation batches a rollout may draw until it has the target number of kept groups (DAPO's and Klear's
    ``max_num_gen_batches``; 1: one oversampled batch, then train on what was kept). A rollout that keeps fewer
    groups than the target makes fewer optimizer steps; one that keeps none makes none."""
    max_reward: float = 1.0
    """The reward of a fully-correct response (for the filter and the positive-sample term)."""
    sft_alpha: float = 0.1
    """α of the positive-sample NLL term (Klear: 0.1; 0 turns it off)."""
    random_stop_frac: float = 0.0
    """A control for ERC, not a method: each response token loses its policy-gradient (keeps its value and its
    place in the token-mean) with this probability, drawn from the trainer's own seeded generator. Set to the
    fraction ERC stopped, it separates "ERC stops the right tokens" from "ERC stops some tokens"."""
    random_stop_classes: str = ""
    """The same control, matched to where ERC stops: a stop probability per token class, ``"low/fork:0.02,
    low/rest:0.01,..."``, the classes being the rollout policy's entropy bucket (``losses.ENTROPY_BUCKETS`` by the
    old entropy: low, mid, high) and whether the token is a focus ("fork") token or not ("rest"); a class not named
    is never stopped. Exclusive with ``random_stop_frac``."""
    logprob_backend: str = "klear"
    """Where per-token log-probs and entropies come from: ``klear`` (``klear_lib.logprobs``: chunked over tokens,
    the LM head's logits recomputed in backward; run inside the wrapped model's forward, so DDP, FSDP and ZeRO see
    the head; text-only models without logit scaling) or ``trl`` (TRL 1.16's fused LM head). Both avoid (B, T, V)
    logits; tests check they agree to 1e-5."""

    def stop_classes(self) -> dict[str, float]:
        """``random_stop_classes`` as ``{"low/fork": p, ...}``; errors name the entry and the valid classes."""
        out: dict[str, float] = {}
        valid = [f"{b}/{part}" for b, _, _ in ENTROPY_BUCKETS for part in ("fork", "rest")]
        for entry in filter(None, (e.strip() for e in self.random_stop_classes.split(","))):
            name, sep, value = entry.partition(":")
            try:
                p = float(value)
            except ValueError:
                p = float("nan")
            if not sep or name.strip() not in valid or not 0 <= p <= 1:  # 1: every token of the class, as ERC
                raise ValueError(f"KlearLossConfig.random_stop_classes: entry {entry!r} must be CLASS:P with CLASS "
                                 f"one of {valid} and P in [0, 1]")
            out[name.strip()] = p
        return out

    def __post_init__(self) -> None:
        def bad(name: str, must: str) -> ValueError:
            return ValueError(f"KlearLossConfig.{name} must {must}, got {getattr(self, name)!r}")

        if self.logprob_backend not in ("klear", "trl"):
            raise bad("logprob_backend", "be 'klear' or 'trl'")
        if self.loss_name not in POLICY_LOSSES:
            raise bad("loss_name", f"be a registered loss ({sorted(POLICY_LOSSES)})")
        if self.loss_agg_mode not in AGG_MODES:
            raise bad("loss_agg_mode", f"be one of {list(AGG_MODES)}")
        if self.adv_std not in STD_MODES:
            raise bad("adv_std", f"be one of {list(STD_MODES)}")
        if self.filter_rule not in FILTER_RULES:
            raise bad("filter_rule", f"be one of {list(FILTER_RULES)}")
        if not self.sft_alpha >= 0:
            raise bad("sft_alpha", "be >= 0")
        if not self.adv_eps >= 0:
            raise bad("adv_eps", "be >= 0")
        if not 0 <= self.random_stop_frac < 1:
            raise bad("random_stop_frac", "be in [0, 1)")
        classes = self.stop_classes()  # raises on a malformed table
        if classes and self.random_stop_frac > 0:
            raise bad("random_stop_classes", "be empty when random_stop_frac is set (one control at a time)")
        if not self.oversample_factor >= 1:
            raise bad("oversample_factor", "be >= 1 (1: generate exactly the target prompt count)")
        n = self.max_gen_batches
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise bad("max_gen_batches", "be an int >= 1")
