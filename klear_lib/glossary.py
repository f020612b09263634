"""Every key a run writes to ``metrics.jsonl``, defined once: a short title (plots use it) and its formula.

The policy losses' metrics are defined in ``klear_lib.losses.METRICS`` (with the losses) and included here.
Notation: m the response-token mask of an optimizer step's mini-batch, Σ over its tokens; r = π_θ / π_old the
token ratio; A the advantage; H the entropy of the full next-token distribution; a "rollout" is one round of
generation (klear_lib.train.rl); "fork" tokens are the result digits of the fork facts (klear_lib.data.tasks).
A key may contain ``*`` to stand for one path component (``rewards/*/mean``: one per reward function).

``tests/test_glossary.py`` runs an RL notebook at its smoke preset and fails on any logged key missing here.
"""

from __future__ import annotations

import fnmatch

from klear_lib.losses import METRICS

_LOSS_TITLES = {
    "actor/pg_loss": "policy loss",
    "actor/pg_clipfrac_low": "clip fraction, low (A<0, r<1-ε_l)",
    "actor/pg_clipfrac_high": "clip fraction, high (A>0, r>1+ε_h)",
    "actor/gppo_preserved_frac": "GPPO-preserved fraction",
    "actor/pg_clipfrac_dual": "dual-clip fraction (A<0, r>c)",
    "actor/erc_frac_low": "ERC-stopped fraction, low",
    "actor/erc_frac_high": "ERC-stopped fraction, high",
    "actor/ratio_mean": "mean token ratio r",
    "actor/ratio_max": "max token ratio r",
    "actor/approx_kl_k3": "KL(π_old ‖ π_θ), k3",
}

# key -> (title, formula)
GLOSSARY: dict[str, tuple[str, str]] = {k: (_LOSS_TITLES.get(k, k), v) for k, v in METRICS.items()}
GLOSSARY.update({
    # -- one record per optimizer step (klear_lib.train.rl.KlearGRPOTrainer._compute_loss, TRL, transformers) ----
    "step": ("optimizer step", "optimizer steps taken so far (1 for the first)"),
    "rollout": ("rollout", "step records: the rollout whose mini-batch the step trained on (from 1); rollout "
                "records: rollouts done (0 = before RL)"),
    "actor/positive_loss": ("positive-sample NLL", "-Σ_{j fully correct} Σ_t log π_θ(y_j,t) / "
                            "Σ_{j fully correct} |y_j| "
                            "(token-mean over the fully-correct responses); the loss adds α times it"),
    "actor/response_tokens": ("response tokens", "Σ m: response tokens of the mini-batch that enter the loss"),
    "actor/random_stop_frac": ("randomly stopped fraction", "Σ m·[u < p] / Σ m, u ~ U(0,1) per token, p = "
                               "random_stop_frac: the ERC control's stop-gradient mask"),
    "actor/pg_clipfrac_low_fork": ("clip fraction at forks, low", "actor/pg_clipfrac_low over the fork tokens only"),
    "actor/pg_clipfrac_high_fork": ("clip fraction at forks, high", "actor/pg_clipfrac_high over the fork tokens only"),
    "actor/gppo_preserved_frac_fork": ("GPPO-preserved fraction at forks",
                                       "actor/gppo_preserved_frac over the fork tokens only"),
    "actor/erc_frac_low_fork": ("ERC-stopped at forks, low", "actor/erc_frac_low over the fork tokens only"),
    "actor/erc_frac_high_fork": ("ERC-stopped at forks, high", "actor/erc_frac_high over the fork tokens only"),
    "actor/ratio_mean_fork": ("mean ratio at forks", "actor/ratio_mean over the fork tokens only"),
    "klear/fork_token_frac": ("fork tokens / response tokens", "Σ m·[fork token] / Σ m"),
    "klear/informative_completions": ("completions in the step", "completions of the kept groups in the optimizer "
                                      "step's mini-batch, over every process (= mini_batch_prompts × "
                                      "num_generations but on a rollout's last step)"),
    "klear/positive_frac": ("fully-correct share (step)",
                            "share of the step's completions whose reward is the maximum"),
    # TRL's GRPOTrainer names for the same clip fractions, logged beside klear's (verl's) for readers of TRL's logs
    "clip_ratio/low_mean": ("clip fraction, low (TRL's name)", "= actor/pg_clipfrac_low: Σ m·[A<0 ∧ r<1-ε_l] / Σ m"),
    "clip_ratio/high_mean": ("clip fraction, high (TRL's name)", "= actor/pg_clipfrac_high: Σ m·[A>0 ∧ r>1+ε_h] / Σ m"),
    "clip_ratio/region_mean": ("clip fraction, either side (TRL's name)",
                               "= actor/pg_clipfrac_low + actor/pg_clipfrac_high: Σ m·([A<0 ∧ r<1-ε_l] ∨ "
                               "[A>0 ∧ r>1+ε_h]) / Σ m (the two sides never share a token)"),
    "entropy": ("token entropy (current policy)", "Σ m·H_θ / Σ m, H of the temperature-scaled next-token distribution"),
    "old_entropy": ("token entropy (rollout policy)", "Σ m·H_old / Σ m"),
    "grad_norm": ("gradient norm (before clipping)", "‖∇_θ loss‖₂ over every parameter, before max_grad_norm clipping"),
    "learning_rate": ("learning rate", "the scheduler's learning rate at the step"),
    "loss": ("trainer loss", "the loss the trainer minimised at the step (pg_loss + α·positive_loss)"),
    "epoch": ("epoch", "transformers' epoch counter over the (unused) dataloader: not meaningful for rollouts"),
    "step_time": ("step time (s)", "seconds of the optimizer step's forward and backward (TRL)"),
    "num_tokens": ("tokens seen", "input tokens seen so far (transformers' counter, TRL)"),
    "erc/ratio_p05": ("ρ, 5th percentile", "5th percentile over response tokens of ρ = (H+1e-8)/(H_old+1e-8)"),
    "erc/ratio_p50": ("ρ, median", "median over response tokens of ρ"),
    "erc/ratio_p95": ("ρ, 95th percentile", "95th percentile over response tokens of ρ"),
    "erc/token_share_*": ("token share of an entropy bucket", "share of response tokens whose H_old is in the bucket "
                          "(low [0, 0.1), mid [0.1, 1), high [1, ∞) nats)"),
    "erc/masked_frac_*": ("ERC-stopped share of a bucket", "share of the bucket's tokens with ρ ≤ erc_low or "
                          "ρ ≥ erc_high (0 when ERC is off)"),
    # -- one record per rollout boundary (klear_lib.train.rl_run.RolloutRecorder) --------------------------------
    "final": ("last rollout", "true on the record after the last rollout of the run"),
    "klear/generated_groups": ("groups generated", "prompts sampled in the rollout (oversample_factor × "
                               "rollout_prompts per generation batch), each with num_generations completions"),
    "klear/kept_groups": ("groups kept", "groups that passed the filter, capped at rollout_prompts"),
    "klear/kept_group_frac": ("kept share of groups", "klear/kept_groups / klear/generated_groups"),
    "klear/gen_batches": ("generation batches", "generation batches the rollout drew (≤ max_gen_batches)"),
    "klear/updates_this_rollout": ("optimizer steps in the rollout", "⌈klear/kept_groups / mini_batch_prompts⌉"),
    "klear/fully_correct_frac": ("fully-correct share (rollout)", "share of generated completions whose reward is "
                                 "the maximum"),
    "klear/p_correct_fork": ("p(right digit) at the forks", "mean over the fork probes of π_θ(right digit | the "
                             "correct chain up to the fork), temperature 1 (klear_lib.evaluation.heldout.fork_probe)"),
    "klear/p_wrong_fork": ("p(teacher's wrong digit) at the forks", "as klear/p_correct_fork, for the fork fact's "
                           "wrong digit"),
    "klear/p_correct_rest": ("p(right digit) off the forks", "mean over every step of the first 32 held-out "
                             "problems that need no fork fact of π_θ(right result digit | the correct chain up to it), "
                             "temperature 1 (klear_lib.evaluation.heldout.rest_probe): what the start already knows"),
    "klear/token_share/*": ("share of a token class", "Σ m·[class c] / Σ m, c = the old entropy's bucket (low < 0.1 ≤ "
                            "mid < 1 ≤ high nats) / fork or rest (the fork facts' result digits or not)"),
    "klear/stopped_frac/*": ("stopped share of a token class", "Σ m·[class c]·[stopped] / Σ m·[class c]: stopped = "
                             "ERC's ρ outside its bounds, or the random control's draw (a token class as in "
                             "klear/token_share/*)"),
    "reward": ("mean reward (rollout)", "mean over the rollout's generated completions of the weighted reward (TRL)"),
    "reward_std": ("reward std (rollout)", "mean over groups of the std of the rewards in a group (TRL)"),
    "frac_reward_zero_std": ("groups with one reward", "share of generated groups whose rewards all agree (TRL)"),
    "rewards/*/mean": ("mean of one reward function", "mean over the rollout's completions of that reward "
                       "function's score (TRL)"),
    "rewards/*/std": ("std of one reward function", "std over the rollout's completions of that reward (TRL)"),
    "completions/*": ("completion lengths", "TRL's length statistics of the rollout's completions, in tokens "
                      "(mean/min/max, over all or over those that ended with EOS; clipped_ratio: share cut at "
                      "max_completion_length)"),
    # -- evaluation (klear_lib.evaluation.heldout, at rollout boundaries) -----------------------------------------
    "eval/avg_at_n": ("held-out avg@n", "mean over held-out problems of the share of n samples judged correct"),
    "eval/avg_at_n_fork": ("held-out avg@n, fork problems", "eval/avg_at_n over the problems whose correct chain "
                           "uses a fork fact"),
    "eval/avg_at_n_rest": ("held-out avg@n, other problems", "eval/avg_at_n over the other problems"),
    "eval/avg_at_n_level*": ("held-out avg@n at a level", "eval/avg_at_n over the problems of that level"),
    "eval/format_rate": ("format rate", "share of samples with </think> and a boxed answer after it"),
    "eval/pass_rate": ("held-out mean test pass rate", "mean over held-out programs and samples of the share of "
                       "tests passed (code task)"),
    "eval/all_pass": ("held-out all-tests accuracy", "mean over held-out programs and samples of [every test "
                      "passes] (code task)"),
    # -- the code task (notebook 05; klear_lib.train.code_jobs.group_signal, per rollout over its generated groups)
    "klear/group_signal_dapo": ("groups with signal, DAPO's rule", "share of generated groups whose rewards are not "
                                "all equal (a non-zero GRPO advantage; what DAPO's filter keeps), uncapped"),
    "klear/group_signal_klear": ("groups with signal, Klear's rule", "share of generated groups whose all-tests "
                                 "indicator is not all equal (what Klear's filter keeps), uncapped"),
    "klear/full_pass_frac": ("share passing every test (rollout)", "share of generated completions whose program "
                             "passes every test"),
    "klear/partial_pass_frac": ("share passing some tests (rollout)", "share of generated completions whose program "
                                "passes at least one test but not all"),
    # -- one record per SFT unit (notebooks 01, 02; klear_lib.train.sft_jobs.sft_unit) ---------------------------
    "samples": ("SFT samples", "samples the unit fine-tuned on (one epoch: samples / batch size optimizer steps)"),
    "distinct_prompts": ("distinct prompts", "distinct questions among the unit's SFT samples"),
    "sft/padding_share": ("SFT padding share", "1 - (real tokens) / (positions the model saw), over the unit's SFT "
                          "batches (klear_lib.train.sft.TokenCounter; packed batches, the default: about 6%; padded "
                          "random ones about 30%)"),
    "teacher_correct": ("correct share of the SFT data", "share of the unit's SFT samples whose answer is right"),
    "level_*": ("SFT samples of a level", "the unit's SFT samples of that level"),
    "stage": ("stage", "score (a source's quality score) or top_k (an arm), a tag"),
    "condition": ("condition", "the source pool: styles (matched quality) or defects (a tag)"),
    "source": ("source", "the source a scoring unit trained on (a tag)"),
    "sources": ("sources mixed", "the Top-K sources of an arm, best first (a tag)"),
    "k": ("K", "how many sources an arm mixes (a tag)"),
    "subset": ("training subset", "easy, hard or all problems, by the teacher's measured pass rate (a tag)"),
    "mode": ("correctness mode", "only_true, only_true_matched (upsampled to mixed's count) or mixed (a tag)"),
    "reward_mode": ("code reward", "soft (share of tests passed), hard (all or nothing) or signed (a tag)"),
    "filter_rule": ("group filter", "klear (the all-tests indicator varies) or dapo (the rewards vary) (a tag)"),
    "regime": ("code-reward regime", "main (the SFT teacher errs on 40% of values) or sparse (60%: full passes rare), "
               "notebook 05 (a tag)"),
    # -- tags that every record of a unit carries -----------------------------------------------------------------
    "variant": ("arm", "the arm of the ablation (a tag)"),
    "seed": ("seed", "the run's seed (a tag)"),
    "lr": ("learning rate (arm)", "the arm's learning rate (a tag)"),
    "loss_name": ("loss", "the arm's loss (a tag)"),
    "erc": ("ERC bounds", "the arm's ERC bounds (a tag)"),
    "alpha": ("α", "the arm's α of the positive-sample term (a tag)"),
    "arm": ("arm", "the arm of the ablation (a tag)"),
})


def lookup(key: str) -> tuple[str, str] | None:
    """(title, formula) of ``key``, by exact name or by a ``*`` pattern (one path component); None if undefined."""
    if key in GLOSSARY:
        return GLOSSARY[key]
    for pattern, entry in GLOSSARY.items():
        if "*" in pattern and fnmatch.fnmatchcase(key, pattern) and key.count("/") == pattern.count("/"):
            return entry
    return None


def title(key: str) -> str:
    """The plot title of ``key`` (the key itself when the glossary lacks it)."""
    entry = lookup(key)
    return entry[0] if entry else key


def undefined(keys) -> list[str]:
    """The keys the glossary does not define, sorted."""
    return sorted(k for k in set(keys) if lookup(k) is None)
