"""RL on TRL: ``KlearGRPOTrainer``, TRL's ``GRPOTrainer`` with Klear's policy loss and data rules.

How it departs from TRL's GRPOTrainer (and so from GRPO as TRL implements it):

1. The policy loss is ``klear_lib.losses`` (any registered name: ``ppo_clip``/DAPO, ``cispo``, ``gspo``, ``gppo``),
   ERC included, instead of the if/elif inside ``GRPOTrainer._compute_loss``. TRL's loss settings are never
   ignored (``klear_from_trl``): without ``klear=``, ``loss_type`` (``cispo``, ``grpo``, ``bnpo``, ``dr_grpo``),
   ``epsilon``/``epsilon_high`` (the clip range) and ``importance_sampling_level="sequence"`` (``gspo``) become the
   ``KlearLossConfig``; with ``klear=``, a TRL setting that disagrees with it is refused, naming the klear field.
   ``beta`` > 0 and the TRL options klear has no counterpart for are refused.
2. The rollout policy's per-token entropies are kept from the old-log-prob pass (TRL discards them) and handed
   to the loss as ``old_entropy`` for ERC; in a one-process text run that pass waits for the group filter and runs
   over the kept groups' rows only (``old_pass_kept_only``; TRL's, over every row). Log-probs and entropies come
   from ``klear_lib.logprobs`` on the hidden states (``logprob_backend="klear"``) or TRL's fused LM head ("trl").
3. Advantages are recomputed from the raw rewards with ``klear_lib.advantages.grpo_advantages`` (Klear: the
   unbiased std and ε = 1e-6; TRL: ε = 1e-4).
4. Dynamic sampling, as Klear does it, replaces TRL's fixed ``steps_per_generation`` buffer: a rollout generates
   ``oversample_factor`` × ``rollout_prompts`` prompts (Klear: 256 for 128), keeps the groups that pass the filter
   (``filter_rule``: Klear's fully-correct indicator or DAPO's rewards must vary) up to ``rollout_prompts`` in draw
   order, and packs them whole into mini-batches of ``mini_batch_prompts``, one optimizer step each; with
   ``max_gen_batches`` > 1 it draws further generation batches while it has kept fewer (DAPO's and Klear's
   ``max_num_gen_batches``). A rollout that keeps fewer groups makes fewer optimizer steps; one that keeps none
   makes none (no AdamW step ever runs without a response token). From the second mini-batch of a rollout on,
   the ratio differs from 1, which is what every clip variant acts on (reference §1, "on-policy steps hide
   GPPO"). Training counts rollouts, not steps or epochs (``rollouts``); ``on_rollout`` callbacks see every
   boundary. A run that ends with fewer optimizer steps than planned warns, one that made none raises
   (``NoUpdatesError``), each naming the filter rule, the share of groups kept and the fix; with
   ``filter_rule="klear"``, reward functions whose declared ``reward_range`` cannot reach ``max_reward`` are
   refused before training.
5. The positive-sample SFT term ``α · NLL`` over fully-correct responses is added (reference §2). With several
   processes each token-mean is over the global mini-batch (docs/scale.md, "Token-mean normalisation").

With vLLM rollouts, the old log-probs and entropies come from the training model's scoring pass (as in verl);
TRL's vLLM importance-sampling correction is not applied and must be off.

TRL internals overridden (pinned to ``TRL_VERSION``; ``tests/test_trl_contract.py`` fails when they move):
``_generate_and_score_completions``, ``_calculate_rewards``, ``_get_per_token_logps_and_entropies``,
``_compute_loss``, ``_prepare_inputs`` (the dataloader's batch is ignored: rollouts draw their own prompts) and
``_save_checkpoint`` (the rollout count and the prompt sampler are saved beside each checkpoint; a resumed run
generates the rollout it was in again).
"""

from __future__ import annotations

import collections
import json
import math
import os
import random
import warnings
from collections.abc import Callable

import torch
import trl
from transformers import TrainerCallback
from trl import GRPOTrainer

from klear_lib.advantages import grpo_advantages, zero_advantage_group_mask
from klear_lib.losses import (
    ENTROPY_BUCKETS,
    PolicyLossConfig,
    compute_policy_loss,
    entropy_diagnostics,
    positive_sample_loss,
)
from klear_lib.recipe import KlearLossConfig
from klear_lib.rewards.result import DATA_ERROR
from klear_lib.train.token_stats import klear_token_stats
from klear_lib.train.trl_config import klear_from_trl, reward_total_range

TRL_VERSION = "1.16.0"  # the TRL release whose internals this trainer overrides

# KlearLossConfig and PolicyLossConfig are re-exported: a TRL user's script imports the trainer and its config from
# one place (README, "GPPO+ERC in your own trainer").
__all__ = ["KlearGRPOTrainer", "KlearLossConfig", "PolicyLossConfig", "NoUpdatesError", "DataError", "DATA_ERROR",
           "klear_from_trl", "reward_total_range", "TRL_VERSION"]


class _NoUpdatesLeft(Exception):
    """Raised before the first optimizer step when every rollout of the budget kept no group."""


class DataError(ValueError):
    """A reward function judged responses against malformed data (reason ``DATA_ERROR``)."""


class NoUpdatesError(RuntimeError):
    """A run that made no optimizer step: every group of every rollout was filtered (the message says why and what
    to set). The model is unchanged."""


ROLLOUT_STATE_FILE = "klear_rollouts.json"  # saved beside each checkpoint: rollouts done, the prompt sampler


class KlearGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with Klear's loss family, ERC entropies, dynamic sampling and positive-sample term.

    Training is driven by rollouts, not by TRL's fixed ``steps_per_generation`` buffer. A rollout draws
    ``oversample_factor`` × the target prompt count from the training set (its own seeded sampler), generates
    ``num_generations`` completions for each, scores them, keeps the groups that pass the filter up to the target
    (drawing another generation batch, up to ``max_gen_batches``, while it has fewer), and packs the kept groups,
    whole, into mini-batches of ``mini_batch_prompts`` prompts: one optimizer step each. The target is
    ``per_device_train_batch_size × world / num_generations × steps_per_generation`` prompts (the run config's
    ``rollout_prompts``), a mini-batch ``per_device_train_batch_size × world / num_generations`` prompts. Only the
    last mini-batch of a rollout can be short; a rollout that kept nothing makes no optimizer step (AdamW's weight
    decay and momentum never move the weights without a response token). ``rollouts`` rollouts are run;
    ``args.max_steps`` must be at least ``rollouts × steps_per_generation``.

    ``on_no_updates``: what a run that made no optimizer step does: ``"raise"`` (``NoUpdatesError``, the default)
    or ``"warn"`` (as a short run does; ``run_rl`` uses it: its rollout records log every rollout's kept groups,
    and an ablation arm whose filter keeps nothing, e.g. a hard reward in a sparse regime, is a result to report).

    ``on_rollout`` callbacks run at every rollout boundary, after the last update of a rollout (and once before the
    first), with the trainer and a record: ``rollout`` (rollouts done), ``step`` (optimizer steps done), ``final``,
    and the finished rollout's ``klear/*`` counts and TRL's generation metrics (``reward``, lengths ...).
    """

    old_pass_kept_only = True
    """Run a training rollout's old-log-prob pass over the rows of the groups it trains on only (after the group
    filter and the cap), not over every generated row; False: TRL's pass over every row (the benchmark's baseline)."""

    def __init__(self, *args, klear: KlearLossConfig | None = None, rollouts: int | None = None,
                 on_rollout: tuple[Callable[["KlearGRPOTrainer", dict], None], ...] = (),
                 focus: Callable | None = None, on_no_updates: str = "raise", **kwargs):
        if trl.__version__ != TRL_VERSION:
            warnings.warn(
                f"KlearGRPOTrainer overrides TRL {TRL_VERSION} internals; TRL {trl.__version__} is installed. "
                "Run tests/test_trl_contract.py before trusting its numbers.",
                stacklevel=2,
            )
        if on_no_updates not in ("raise", "warn"):
            raise ValueError(f"on_no_updates must be 'raise' or 'warn', got {on_no_updates!r}")
        self.on_no_updates = on_no_updates
        super().__init__(*args, **kwargs)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            raise ValueError(
                "KlearGRPOTrainer does not apply TRL's vLLM importance-sampling correction (Klear has none; the old "
                "log-probs are the training model's, as in verl): set "
                "GRPOConfig.vllm_importance_sampling_correction=False"
            )
        self.klear = klear_from_trl(self.args, klear)  # TRL's loss settings honoured or refused, never ignored
        if self.args.gradient_accumulation_steps != 1:
            raise ValueError("KlearGRPOTrainer packs whole mini-batches per optimizer step: set "
                             f"gradient_accumulation_steps=1, got {self.args.gradient_accumulation_steps}")
        world, G = self.accelerator.num_processes, self.num_generations
        if (self.args.per_device_train_batch_size * world) % G:
            raise ValueError(f"per_device_train_batch_size × processes = "
                             f"{self.args.per_device_train_batch_size * world}"
                             f" completions per optimizer step must hold whole groups of num_generations={G}")
        self.mini_batch_prompts = self.args.per_device_train_batch_size * world // G
        self.target_prompts = self.mini_batch_prompts * self.args.steps_per_generation
        gen = math.ceil(self.target_prompts * self.klear.oversample_factor)
        self.gen_prompts = math.ceil(gen / world) * world  # every process generates the same number of prompts
        spg = self.args.steps_per_generation
        if rollouts is None and self.args.max_steps <= 0:
            raise ValueError(
                f"KlearGRPOTrainer counts rollouts, not epochs (GRPOConfig.max_steps={self.args.max_steps}, "
                f"num_train_epochs={self.args.num_train_epochs} is not read): pass rollouts=N to KlearGRPOTrainer "
                f"(each rollout makes at most steps_per_generation={spg} optimizer steps), or set "
                f"GRPOConfig.max_steps to a multiple of steps_per_generation")
        if rollouts is not None and self.args.max_steps <= 0:
            self.args.max_steps = rollouts * spg  # epoch-based config: the rollout budget sets the length
        default_budget = self.args.max_steps // spg
        self.rollout_budget = rollouts if rollouts is not None else default_budget
        if self.rollout_budget < 1:
            raise ValueError(f"rollouts must be >= 1, got {self.rollout_budget}: pass rollouts=N to KlearGRPOTrainer "
                             f"or set GRPOConfig.max_steps >= steps_per_generation={spg}")
        if self.args.max_steps < self.rollout_budget * self.args.steps_per_generation:
            raise ValueError(f"max_steps={self.args.max_steps} is below rollouts × steps_per_generation = "
                             f"{self.rollout_budget} × {self.args.steps_per_generation}: the run would stop early")
        self.on_rollout = list(on_rollout)
        self.focus = focus  # (prompt_ids, completion_ids, completion_mask) -> (B, T) bool: the tokens the clip
        # statistics are also restricted to (``actor/*_fork``), e.g. the fork digits of the arithmetic task
        self._random_stop = torch.Generator().manual_seed(self.args.seed)  # the ERC control's own draws
        self._stop_table = self.klear.stop_classes()
        if any(name.endswith("/fork") and p > 0 for name, p in self._stop_table.items()) and focus is None:
            raise ValueError("random_stop_classes names fork classes, but the task has no fork tokens (no focus)")
        self._capture_old_entropy = False
        self._captured_old_entropy: torch.Tensor | None = None
        self._defer_old_pass, self._deferred_old = False, None  # a generation batch's old pass, run after the filter
        self._last_rewards: torch.Tensor | None = None
        self._last_group_keep: torch.Tensor | None = None
        self._queue: list[dict] = []  # the packed mini-batches of the current rollout, not yet trained on
        self.rollouts_done = 0
        self._started = False
        self._pending: dict | None = None  # the current rollout's record, reported after its last update
        self._sampler_rng = random.Random(f"klear-prompts:{self.args.seed}")
        self._order: list[int] = []
        self._groups = [0, 0]  # groups generated, kept: since train() was called
        self._judged: collections.Counter = collections.Counter()  # the judges' reasons for every response seen
        self._best_reward = -math.inf
        self._steps_made = 0
        self._check_reward_range()
        self.add_callback(_RolloutDriver(self))

    def _check_reward_range(self) -> None:
        """Refuse, before training, a Klear group filter that no response can pass: the reward functions' declared
        ranges (``reward_range``) give a total that never equals ``max_reward``, so no response is fully correct."""
        k = self.klear
        if not (k.filter_groups and k.filter_rule == "klear"):
            return
        rng = reward_total_range(self.reward_funcs, self.reward_weights.tolist())
        if rng is not None and not rng[0] <= k.max_reward <= rng[1]:
            raise ValueError(
                f"filter_rule='klear' keeps a group only when some but not all of its responses are fully correct "
                f"(reward == KlearLossConfig.max_reward={k.max_reward}), but the reward functions' declared ranges "
                f"give totals in [{rng[0]}, {rng[1]}]: every group would be filtered and no step made. Set "
                f"KlearLossConfig.max_reward to what a fully correct response scores, or filter_rule='dapo' (the "
                f"rewards must vary), or filter_groups=False")

    def _filter_message(self, made: int, planned: int) -> str:
        """Why a run made ``made`` of ``planned`` optimizer steps, and what to set."""
        k = self.klear
        generated, kept = self._groups
        share = kept / generated if generated else 0.0
        head = (f"KlearGRPOTrainer made {made} of {planned} planned optimizer steps: filter_rule={k.filter_rule!r} "
                f"kept {kept} of {generated} generated groups ({share:.1%})")
        best = f"{self._best_reward:.4g}" if math.isfinite(self._best_reward) else "none"
        if k.filter_rule == "klear":
            why = (f"; it keeps a group only when some but not all of its responses reach "
                   f"KlearLossConfig.max_reward={k.max_reward} (fully correct), and the highest reward seen was "
                   f"{best}. Fix: with a continuous or differently scaled reward set filter_rule='dapo' (keep groups "
                   f"whose rewards vary) or KlearLossConfig.max_reward to what a fully correct response scores; "
                   f"otherwise raise oversample_factor or max_gen_batches, or set filter_groups=False")
        else:
            why = ("; it keeps a group only when its rewards vary. Fix: a reward that separates the responses, more "
                   "num_generations, a larger oversample_factor or max_gen_batches, or filter_groups=False")
        return head + why + self._judge_message()

    def _judge_message(self) -> str:
        """The judges' reasons for the responses seen, and, when most failed Klear's think format, the format rule
        and whether the model's chat template writes one (``format_rule``: the run config's key)."""
        reasons = {k: v for k, v in self._judged.items() if k is not None}
        total = sum(reasons.values())
        if not total:
            return ""
        counts = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
        out = f". The judge's reasons for the {total} responses it saw: {counts}"
        unformatted = reasons.get("no_think_close", 0) + reasons.get("no_think_open", 0)
        if unformatted * 2 > total:
            rules = sorted({str(fn.format_rule) for fn in self.reward_funcs if getattr(fn, "format_rule", None)})
            rule = (f"the format rule is {' / '.join(repr(r) for r in rules)}" if rules else
                    "the reward functions declare no format rule (a `format_rule` attribute)")
            template = getattr(self.processing_class, "chat_template", None) or ""
            has_think = "<think>" in template or "</think>" in template
            out += (f"; {unformatted} of {total} have no <think>...</think> format, and {rule}; this model's chat "
                    f"template {'writes' if has_think else 'has no'} think format. Fix: set format_rule: none (the "
                    f"answer is read from the whole response) or run a format SFT first")
        return out

    def _check_steps_made(self, planned: int) -> None:
        """After a run: raise when it made no optimizer step, warn when it made fewer than planned."""
        if planned <= 0:
            return
        if self._steps_made == 0 and self.on_no_updates == "raise":
            raise NoUpdatesError(self._filter_message(0, planned) + "; the model is unchanged")
        if self._steps_made < planned:
            warnings.warn(self._filter_message(self._steps_made, planned), stacklevel=3)

    # -- rollout: keep the entropies and the raw rewards that TRL throws away --------------------------------
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *a, **kw):
        if self._capture_old_entropy and self._defer_old_pass and self._deferrable(a, kw):
            # a training rollout's old-log-prob pass: run over the kept rows after the filter (_old_pass_over_kept);
            # until then every row reads NaN, so that a row never computed cannot pass unseen
            self._deferred_old = (input_ids, attention_mask, logits_to_keep, (a[0] if a else kw.get("batch_size")))
            self._capture_old_entropy = False
            nan = torch.full(input_ids[:, -logits_to_keep:].shape, float("nan"), device=input_ids.device)
            self._captured_old_entropy = nan.clone()
            return nan, nan.clone(), None
        if self._capture_old_entropy:  # the old-log-prob pass inside _generate_and_score_completions
            kw["compute_entropy"] = True
            logps, entropies, aux = self._logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *a,
                                                              **kw)
            self._captured_old_entropy = entropies
            self._capture_old_entropy = False  # only the first pass is the rollout policy's
            return logps, entropies, aux
        return self._logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *a, **kw)

    def _logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                             compute_entropy=False, compute_aux_loss=False, **multimodal):
        """TRL's pass, or ``klear_lib.logprobs`` on the backbone's hidden states (``logprob_backend``)."""
        if self.klear.logprob_backend == "trl" or compute_aux_loss or any(v is not None for v in multimodal.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **multimodal)
        return klear_token_stats(model, input_ids, attention_mask, logits_to_keep, temperature=self.temperature,
                                 batch_size=batch_size, autocast=self.accelerator.autocast)

    def _deferrable(self, args: tuple, kw: dict) -> bool:
        """Whether the rollout's old-log-prob pass may wait for the group filter: one process (under ZeRO-3 or FSDP
        each forward gathers parameters with the others, so all must run as many), text only, no auxiliary loss
        (TRL's vLLM importance-sampling correction, which reads the pass inside TRL's, is refused in __init__)."""
        return len(args) <= 1 and self.accelerator.num_processes == 1 and not kw.get("compute_aux_loss") and all(
            v is None for k, v in kw.items() if k not in ("batch_size", "compute_entropy", "compute_aux_loss"))

    def _old_pass_over_kept(self, part: dict, deferred: tuple, rows: list[int]) -> None:
        """The old-log-prob pass (the rollout policy's log-probs and entropies) over ``rows`` of one generation batch
        into its ``old_per_token_logps``/``old_entropy`` (NaN elsewhere): a rollout trains on its kept groups only
        (``benchmarks/bench_old_pass.py``). Runs before the rollout's first optimizer step, as TRL's pass does."""
        from trl.models.utils import disable_gradient_checkpointing

        if not rows:
            return
        input_ids, attention_mask, logits_to_keep, batch_size = deferred
        index = torch.tensor(rows, dtype=torch.long, device=input_ids.device)
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, entropies, _ = self._logps_and_entropies(
                self.model, input_ids[index], attention_mask[index], logits_to_keep, batch_size, compute_entropy=True)
        part["old_per_token_logps"][index] = logps.to(part["old_per_token_logps"].dtype)
        part["old_entropy"][index] = entropies.to(part["old_entropy"].dtype)

    # -- issue 46: generation through klear_lib.sampler (this method only) ------------------------------------
    def _generate_single_turn(self, *args, **kwargs):
        """TRL's, whose plain-transformers branch calls ``unwrapped_model.generate``: within it, that call goes
        to ``klear_lib.sampler`` (the same tokens as HF generate for the same seed, in less time), which hands
        any model or setting it does not cover back to HF generate; ``KLEAR_SAMPLER=off`` switches it off."""
        from klear_lib import sampler

        if self.use_vllm or self.use_transformers_continuous_batching or not sampler.enabled():
            return super()._generate_single_turn(*args, **kwargs)
        with sampler.swap_generate(self.accelerator.unwrap_model(self.model_wrapped)):
            return super()._generate_single_turn(*args, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._check_data_errors()
        self._last_rewards = rewards_per_func  # (N_all, n_funcs), gathered over processes
        for fn in self.reward_funcs:  # the judges' reasons, for the message of a run that made no step
            self._judged.update(getattr(r, "reason", None) for r in getattr(fn, "last_results", None) or [])
        return rewards_per_func

    def _check_data_errors(self) -> None:
        """Fail the batch, loudly, when a reward function reports that it judged against malformed data (a result
        with reason ``DATA_ERROR`` in its ``last_results``, as ``rewards.pool_wrappers.make_trl_reward_func`` keeps
        them): its score says nothing about the response, and training on it would be training on noise."""
        for name, fn in zip(self.reward_func_names, self.reward_funcs):
            results = getattr(fn, "last_results", None) or []
            bad = [r for r in results if getattr(r, "reason", None) == DATA_ERROR]
            if bad:
                raise DataError(f"reward {name!r}: {len(bad)} of {len(results)} responses of this batch were judged "
                                f"against malformed data ({bad[0].detail or 'no detail'}); the batch is not trained "
                                "on. Fix the dataset row (klear_lib.data.hub.load_klear_rl checks code records' "
                                "tests when it loads and names the row)")

    def _generate_and_score_completions(self, inputs):
        self._capture_old_entropy, self._captured_old_entropy = True, None
        try:
            out = super()._generate_and_score_completions(inputs)
        finally:
            self._capture_old_entropy = False
        mode = "train" if self.model.training else "eval"
        k = self.klear
        weights = self.reward_weights.to(self._last_rewards.device)
        rewards = torch.nansum(self._last_rewards * weights, dim=1)  # (N_all,)
        self._last_total_rewards = rewards
        group = self.num_generations if mode == "train" else self.num_generations_eval
        adv = grpo_advantages(rewards, group, std=k.adv_std, eps=k.adv_eps)  # (N_all,)
        if k.filter_groups:
            keep = zero_advantage_group_mask(rewards, group, rule=k.filter_rule,
                                             max_reward=k.max_reward if k.filter_rule == "klear" else None)
        else:
            keep = torch.ones_like(rewards, dtype=torch.bool)
        n_local = out["completion_ids"].shape[0]
        local = slice(self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local)
        out["advantages"] = adv[local].to(out["completion_ids"].device)
        out["klear_keep"] = keep[local].float().to(out["completion_ids"].device)
        out["klear_positive"] = (rewards[local] == k.max_reward).to(out["completion_ids"].device)
        out.pop("num_items_in_batch", None)  # TRL's loss normaliser; ours is the loss's aggregation
        if self._captured_old_entropy is not None:
            out["old_entropy"] = self._captured_old_entropy
        self._last_group_keep = keep.view(-1, group)[:, 0].cpu()  # (N_all / G,) global, in prompt order
        self._metrics[mode]["klear/fully_correct_frac"].append((rewards == k.max_reward).float().mean().item())
        return out

    # -- dynamic sampling: rollouts, the filter, packing -----------------------------------------------------
    def _draw_prompts(self, n: int) -> list[int]:
        """``n`` dataset indices, the same on every process: epochs of seeded permutations, without replacement
        inside an epoch."""
        out = []
        while len(out) < n:
            if not self._order:
                self._order = list(range(len(self.train_dataset)))
                self._sampler_rng.shuffle(self._order)
            out.append(self._order.pop())
        return out

    def _generate_rollout(self) -> tuple[list[dict], dict]:
        """One rollout: generation batches until ``target_prompts`` groups are kept (at most ``max_gen_batches``),
        the kept groups capped at the target and packed whole into mini-batches. Returns the local mini-batches
        and the rollout's record (``klear/*`` counts and TRL's generation metrics, averaged)."""
        G, world, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        n_local = self.gen_prompts // world
        before = {key: len(v) for key, v in self._metrics["train"].items()}
        parts, order, generated = [], [], 0  # order: (part, global group index) of kept groups, in draw order
        deferred = []  # per part: its old-log-prob pass's inputs, when it waits for the filter (else None)
        while len(order) < self.target_prompts and len(parts) < self.klear.max_gen_batches:
            # draw-order group g is generated by process g % world as its (g // world)-th prompt, so that the
            # kept groups, taken in draw order, spread over the processes
            idx = self._draw_prompts(self.gen_prompts)[rank::world]
            rows = [self.train_dataset[i] for i in idx for _ in range(G)]
            self._defer_old_pass, self._deferred_old = self.old_pass_kept_only, None
            try:
                out = self._generate_and_score_completions(rows)
            finally:
                self._defer_old_pass = False
            deferred.append(self._deferred_old)
            gathered = self._last_group_keep  # (gen_prompts,) in gather order: process by process
            kept = [g for g in range(self.gen_prompts) if gathered[(g % world) * n_local + g // world]]
            self._groups[0] += self.gen_prompts
            self._groups[1] += len(kept)
            self._best_reward = max(self._best_reward, float(self._last_total_rewards.max()))
            order += [(len(parts), g) for g in kept][: self.target_prompts - len(order)]
            parts.append(out)
            generated += self.gen_prompts
        for p, args in [(p, a) for p, a in enumerate(deferred) if a is not None]:  # the old pass, kept rows only
            self._old_pass_over_kept(parts[p], args, [r for part, g in order if part == p and g % world == rank
                                                      for r in range((g // world) * G, (g // world + 1) * G)])
        record, metrics = {}, self._metrics["train"]
        for key in list(metrics):  # generation metrics belong to the rollout, not to an optimizer step
            new = metrics[key][before.get(key, 0):]
            if new and key != "num_tokens":
                valid = [v for v in new if not math.isnan(v)]
                record[key] = sum(valid) / len(valid) if valid else float("nan")
                del metrics[key][before.get(key, 0):]
                if not metrics[key]:
                    del metrics[key]
        mbp = self.mini_batch_prompts
        batches = [self._local_mini_batch(parts, order[i:i + mbp]) for i in range(0, len(order), mbp)]
        record.update({
            "klear/generated_groups": generated,
            "klear/kept_groups": len(order),
            "klear/gen_batches": len(parts),
            "klear/updates_this_rollout": len(batches),
            "klear/kept_group_frac": len(order) / generated,
        })
        return batches, record

    def _local_mini_batch(self, parts: list[dict], groups: list[tuple[int, int]]) -> dict:
        """This process's rows of a mini-batch of kept groups (whole groups: every completion of a kept prompt).
        A process that holds none of them gets one row with ``klear_keep`` 0, so that every process takes part in
        the step (its gradient is zero)."""
        G, rank, world = self.num_generations, self.accelerator.process_index, self.accelerator.num_processes
        picks = {}  # part -> local row indices
        for part, g in groups:
            if g % world == rank:
                start = (g // world) * G
                picks.setdefault(part, []).extend(range(start, start + G))
        if picks:
            pieces = [_select_rows(parts[p], rows) for p, rows in sorted(picks.items())]
        else:
            pieces = [_select_rows(parts[0], [0])]
            pieces[0]["klear_keep"] = torch.zeros_like(pieces[0]["klear_keep"])
            for key in {"old_per_token_logps", "old_entropy"} & pieces[0].keys():  # NaN if never computed: 0 x NaN
                pieces[0][key] = torch.nan_to_num(pieces[0][key], nan=0.0)  # is NaN in the masked loss
        batch = _concat_rows(pieces, pad_id=self._tokenizer.pad_token_id)
        batch["klear_informative"] = len(groups) * G  # global count of kept completions in this mini-batch
        return batch

    def _report(self, record: dict | None) -> None:
        """Run the ``on_rollout`` callbacks for the boundary after ``self.rollouts_done`` rollouts."""
        full = {"rollout": self.rollouts_done, "step": self.state.global_step,
                "final": self.rollouts_done >= self.rollout_budget, **(record or {})}
        for fn in self.on_rollout:
            fn(self, full)

    def _refill(self) -> None:
        """Report the rollout just trained on, then generate rollouts until one has a mini-batch or the budget is
        spent; a rollout that kept nothing is reported at once (it made no optimizer step)."""
        if self._pending is not None:
            self._report(self._pending)
            self._pending = None
        while not self._queue and self.rollouts_done < self.rollout_budget:
            batches, record = self._generate_rollout()
            self.rollouts_done += 1
            if batches:
                self._queue, self._pending = batches, record
            else:
                self._report(record)

    def _prepare_inputs(self, generation_batch):
        if not self.model.training:  # evaluation: TRL's own path
            return super()._prepare_inputs(generation_batch)
        # The dataloader's batch is ignored: rollouts draw their own prompts (oversampled, see the class docstring).
        if not self._started:
            self._started = True
            if self.rollouts_done == 0:
                self._report(None)  # the model before RL
        if not self._queue:
            self._refill()
        if not self._queue:
            raise _NoUpdatesLeft()
        return self._queue.pop(0)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """TRL's training loop over rollouts. Raises ``NoUpdatesError`` when no optimizer step was made and warns
        when fewer than ``rollouts × steps_per_generation`` were, naming the filter, its kept share and the fix."""
        if resume_from_checkpoint:
            self._load_rollout_state(resume_from_checkpoint)
        planned = (self.rollout_budget - self.rollouts_done) * self.args.steps_per_generation
        self._groups, self._best_reward, self._steps_made = [0, 0], -math.inf, 0
        out = None
        try:
            out = super().train(resume_from_checkpoint, *args, **kwargs)
        except _NoUpdatesLeft:  # every rollout of the budget kept nothing: no optimizer step was taken
            pass
        finally:
            if self._pending is not None:
                self._report(self._pending)
                self._pending = None
        self._check_steps_made(planned)
        return out

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
            # the rollout being trained on is not saved: a resumed run generates it again
            done = self.rollouts_done - (1 if self._queue else 0)
            state = {"rollouts_done": done, "order": self._order,
                     "rng": _jsonable_rng(self._sampler_rng.getstate())}
            with open(os.path.join(folder, ROLLOUT_STATE_FILE), "w", encoding="utf-8") as f:
                json.dump(state, f)

    def _load_rollout_state(self, checkpoint: str | bool) -> None:
        """Rollouts done and the prompt sampler of the checkpoint a resumed run starts from. The rollout that was
        being trained on when the checkpoint was saved is not restored: the resumed run generates a new one."""
        if checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            checkpoint = get_last_checkpoint(self.args.output_dir)
        path = os.path.join(str(checkpoint), ROLLOUT_STATE_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: missing; this checkpoint was not written by KlearGRPOTrainer")
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        self.rollouts_done, self._order, self._started = state["rollouts_done"], state["order"], True
        self._sampler_rng.setstate(_rng_state(state["rng"]))

    # -- loss: klear_lib.losses instead of TRL's if/elif -------------------------------------------------------
    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P+T)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        log_prob, entropy, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=True
        )  # (B, T), (B, T)
        keep = inputs["klear_keep"]  # (B,): 0 only on a placeholder row (a process with no kept group)
        mask = completion_mask * keep.unsqueeze(1)  # (B, T)
        # Without a separate old-log-prob pass (one update per rollout) the policy is on-policy: r == 1.
        old_log_prob = inputs.get("old_per_token_logps")
        old_log_prob = log_prob.detach() if old_log_prob is None else old_log_prob
        old_entropy = inputs.get("old_entropy")
        old_entropy = entropy.detach() if old_entropy is None else old_entropy
        k = self.klear
        pg_log_prob, stopped = log_prob, None
        classes = self._token_classes(inputs, mask, old_entropy) if self.focus is not None else None
        if k.random_stop_frac > 0 or self._stop_table:  # the ERC control: a random mask, as ERC's stop-gradient
            draw = torch.rand(mask.shape, generator=self._random_stop).to(mask.device)
            if self._stop_table:  # per token class: ERC's stopped share where ERC stopped it
                p = torch.zeros_like(mask, dtype=torch.float)
                for name, in_class in (classes or self._token_classes(inputs, mask, old_entropy)).items():
                    p = torch.where(in_class, torch.tensor(self._stop_table.get(name, 0.0), device=p.device), p)
            else:
                p = torch.full_like(mask, k.random_stop_frac, dtype=torch.float)
            stopped = (draw < p) & mask.bool()  # (B, T)
            pg_log_prob = torch.where(stopped, log_prob.detach(), log_prob)
        loss, metrics = compute_policy_loss(
            k.loss_name,
            old_log_prob=old_log_prob,
            log_prob=pg_log_prob,
            advantages=inputs["advantages"],
            response_mask=mask,
            loss_agg_mode=k.loss_agg_mode,
            config=k.policy_loss,
            entropy=entropy,
            old_entropy=old_entropy,
        )
        mode = "train" if self.model.training else "eval"
        # policy_loss = pg_loss + α · positive_loss (reference section 2). The NLL is logged at α = 0 too, so that
        # an α sweep compares it across runs; it joins the graph only when α > 0.
        pos = positive_sample_loss(log_prob, mask, inputs["klear_positive"], loss_agg_mode=k.loss_agg_mode)
        world = self.accelerator.num_processes
        pos_term = pos
        if world > 1 and k.loss_agg_mode == "token-mean":
            # Each process divided by its own token counts and DDP averages over processes; rescale each term so
            # that the average is its token-mean over the global mini-batch (verl's normalisation): the policy loss
            # over every response token, the positive-sample NLL over the fully-correct responses' tokens.
            pos_mask = mask * inputs["klear_positive"].to(mask.dtype).unsqueeze(1)
            counts = torch.stack([mask.sum(), pos_mask.sum()]).detach()  # (2,) local tokens, local positive tokens
            totals = self.accelerator.reduce(counts.clone(), reduction="sum")
            scale = counts.clamp(min=1) * world / totals.clamp(min=1)
            loss, pos_term = loss * scale[0], pos * scale[1]
        if k.sft_alpha > 0:
            loss = loss + k.sft_alpha * pos_term
        m = self._metrics[mode]
        m["actor/positive_loss"].append(pos.item())
        m["klear/positive_frac"].append(inputs["klear_positive"].float().mean().item())
        if "klear_informative" in inputs:
            m["klear/informative_completions"].append(float(inputs["klear_informative"]))
            m["klear/rollout"].append(float(self.rollouts_done))
        pl = k.policy_loss
        metrics.update(entropy_diagnostics(entropy, old_entropy, mask, erc_low=pl.erc_low, erc_high=pl.erc_high))
        if stopped is not None:
            metrics["actor/random_stop_frac"] = float(stopped.sum() / mask.sum().clamp(min=1))
        if classes is not None:
            metrics.update(self._class_metrics(classes, mask, stopped, entropy, old_entropy))
        if self.focus is not None:
            metrics.update(self._focus_metrics(inputs, mask, old_log_prob, log_prob, entropy, old_entropy))
        # TRL's names for the clip fractions too, for those who read GRPOTrainer's logs (glossary: clip_ratio/*)
        metrics["clip_ratio/low_mean"] = metrics["actor/pg_clipfrac_low"]
        metrics["clip_ratio/high_mean"] = metrics["actor/pg_clipfrac_high"]
        metrics["clip_ratio/region_mean"] = metrics["actor/pg_clipfrac_low"] + metrics["actor/pg_clipfrac_high"]
        for name, value in metrics.items():
            m[name].append(value)
        denom = mask.sum().clamp(min=1.0)
        m["entropy"].append(((entropy.detach() * mask).sum() / denom).item())
        m["old_entropy"].append(((old_entropy * mask).sum() / denom).item())
        m["actor/response_tokens"].append(mask.sum().item())
        if mode == "train":  # HF's own loss scaling is off in GRPOTrainer: scale for gradient accumulation
            loss = loss / self.current_gradient_accumulation_steps
        return loss


    @torch.no_grad()
    def _token_classes(self, inputs, mask, old_entropy) -> dict[str, torch.Tensor]:
        """The token classes of the ERC control: ``{"<bucket>/<fork|rest>": (B, T) bool}``, the bucket of the rollout
        policy's entropy (``losses.ENTROPY_BUCKETS``), fork = a ``focus`` token (none without a focus)."""
        valid = mask.bool()
        fork = (self.focus(inputs["prompt_ids"], inputs["completion_ids"], mask) if self.focus is not None
                else torch.zeros_like(valid)) & valid
        out = {}
        for name, lo, hi in ENTROPY_BUCKETS:
            in_bucket = valid & (old_entropy >= lo) & (old_entropy < hi)
            out[f"{name}/fork"], out[f"{name}/rest"] = in_bucket & fork, in_bucket & ~fork
        return out

    def _class_metrics(self, classes, mask, stopped, entropy, old_entropy) -> dict:
        """Per token class its share of the response tokens and the share of it stopped: by the random control
        where it runs, else by ERC's bounds (nothing when neither is on)."""
        pl = self.klear.policy_loss
        if stopped is None and pl.erc_low is not None and pl.erc_high is not None:
            rho = (entropy.detach() + 1e-8) / (old_entropy + 1e-8)  # reference §3
            stopped = ((rho <= pl.erc_low) | (rho >= pl.erc_high)) & mask.bool()
        total = mask.sum().clamp(min=1)
        out = {}
        for name, in_class in classes.items():
            tag = name.replace("/", "_")
            n = in_class.sum()
            out[f"klear/token_share/{tag}"] = float(n / total)
            if stopped is not None and int(n) > 0:
                out[f"klear/stopped_frac/{tag}"] = float((stopped & in_class).sum() / n)
        return out

    def _focus_metrics(self, inputs, mask, old_log_prob, log_prob, entropy, old_entropy) -> dict:
        """The clip statistics of the loss restricted to the ``focus`` tokens, and their share of the tokens."""
        fmask = self.focus(inputs["prompt_ids"], inputs["completion_ids"], mask) & mask.bool()  # (B, T)
        out = {"klear/fork_token_frac": float(fmask.sum() / mask.sum().clamp(min=1))}
        if bool(fmask.any()):
            k = self.klear
            _, m = compute_policy_loss(k.loss_name, old_log_prob=old_log_prob, log_prob=log_prob.detach(),
                                       advantages=inputs["advantages"], response_mask=fmask.float(),
                                       loss_agg_mode=k.loss_agg_mode, config=k.policy_loss, entropy=entropy.detach(),
                                       old_entropy=old_entropy)
            for name in ("actor/pg_clipfrac_low", "actor/pg_clipfrac_high", "actor/gppo_preserved_frac",
                         "actor/erc_frac_low", "actor/erc_frac_high", "actor/ratio_mean"):
                out[f"{name}_fork"] = m[name]
        return out


class _RolloutDriver(TrainerCallback):
    """After each optimizer step: when the rollout's mini-batches are used up, report it and generate the next
    (so that the boundary callbacks see the model after the rollout's last update); stop when the budget is spent."""

    def __init__(self, trainer: KlearGRPOTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        t._steps_made += 1
        if not t._queue:
            t._refill()
            if not t._queue:
                control.should_training_stop = True


def _select_rows(batch: dict, rows: list[int]) -> dict:
    """The rows ``rows`` of every per-row entry of a rollout batch (tensors and lists of length B)."""
    n = batch["completion_ids"].shape[0]
    index = torch.tensor(rows, dtype=torch.long)
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n:
            out[key] = value[index.to(value.device)]
        elif isinstance(value, list) and len(value) == n:
            out[key] = [value[i] for i in rows]
        else:
            out[key] = value
    return out


def _concat_rows(pieces: list[dict], *, pad_id: int) -> dict:
    """Rows of several rollout batches in one batch: prompts padded on the left, completions (and every per-token
    entry) on the right, to the longest piece; ids with ``pad_id``, masks and per-token values with 0."""
    if len(pieces) == 1:
        return dict(pieces[0])
    out = {}
    for key in pieces[0]:
        values = [p[key] for p in pieces]
        first = values[0]
        if isinstance(first, list):
            out[key] = [x for v in values for x in v]
        elif not isinstance(first, torch.Tensor) or first.dim() == 0:
            out[key] = first
        elif first.dim() == 1:
            out[key] = torch.cat(values)
        else:
            width = max(v.shape[1] for v in values)
            fill = pad_id if key.endswith("_ids") else 0
            left = key.startswith("prompt")
            padded = []
            for v in values:
                pad = v.new_full((v.shape[0], width - v.shape[1], *v.shape[2:]), fill)
                padded.append(torch.cat([pad, v] if left else [v, pad], dim=1))
            out[key] = torch.cat(padded)
    return out


def _jsonable_rng(state) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_state(obj: list):
    version, internal, gauss = obj
    return version, tuple(internal), gauss
