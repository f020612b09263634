"""RL on TRL: ``KlearGRPOTrainer``, TRL's ``GRPOTrainer`` with Klear's policy loss and data rules.

How it departs from TRL's GRPOTrainer (and so from GRPO as TRL implements it):

1. The policy loss is ``klear_lib.losses`` (any registered name: ``ppo_clip``/DAPO, ``cispo``, ``gspo``, ``gppo``),
   ERC included, instead of the if/elif inside ``GRPOTrainer._compute_loss``. TRL's loss settings are never
   ignored (``klear_from_trl``): without ``klear=``, ``loss_type`` (``cispo``, ``grpo``, ``bnpo``, ``dr_grpo``),
   ``epsilon``/``epsilon_high`` (the clip range) and ``importance_sampling_level="sequence"`` (``gspo``) become the
   ``KlearLossConfig``; with ``klear=``, a TRL setting that disagrees with it is refused, naming the klear field.
   ``beta`` > 0 and the TRL options klear has no counterpart for are refused.
2. The rollout policy's per-token entropies are kept from the old-log-prob pass (TRL discards them) and handed
   to the loss as ``old_entropy`` for ERC. Log-probs and entropies come from ``klear_lib.logprobs`` on the
   backbone's hidden states (``KlearLossConfig.logprob_backend="klear"``) or from TRL's fused LM head ("trl").
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

import contextlib
import dataclasses
import json
import math
import os
import random
import tempfile
import time
import warnings
from collections.abc import Callable
from functools import partial

import torch
import trl
from datasets import Dataset
from transformers import PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from klear_lib.advantages import grpo_advantages, zero_advantage_group_mask
from klear_lib.config import checkpointing
from klear_lib.data.tasks import exact_answer_reward, fork_token_mask, parse_fork_facts, prompt_messages
from klear_lib.evaluation.heldout import arithmetic_probes, evaluate_heldout
from klear_lib.logprobs import IGNORE_INDEX, token_logprobs_and_entropy
from klear_lib.losses import (
    ENTROPY_BUCKETS,
    POLICY_LOSSES,
    PolicyLossConfig,
    compute_policy_loss,
    entropy_diagnostics,
    positive_sample_loss,
)
from klear_lib.recipe import KlearLossConfig
from klear_lib.train.tracking import add_hparams, tracking_env
from klear_lib.train.tracking import names as tracker_names

TRL_VERSION = "1.16.0"  # the TRL release whose internals this trainer overrides

# KlearLossConfig and PolicyLossConfig are re-exported: a TRL user's script imports the trainer and its config from
# one place (README, "GPPO+ERC in your own trainer").
__all__ = ["KlearGRPOTrainer", "KlearLossConfig", "PolicyLossConfig", "NoUpdatesError", "DataError", "DATA_ERROR",
           "klear_from_trl", "reward_total_range", "correctness_reward", "run_rl", "TRL_VERSION"]


def causal_lm(model):
    """The transformers ``PreTrainedModel`` inside ``model``'s wrappers: DDP and DeepSpeed (``.module``), PEFT
    (``get_base_model()``). The wrappers themselves are what gets called; this is for reading the config and the
    LM head."""
    from transformers import PreTrainedModel

    m = model
    for _ in range(8):
        if isinstance(m, PreTrainedModel):
            return m
        if callable(getattr(m, "get_base_model", None)):  # PEFT
            m = m.get_base_model()
        elif isinstance(getattr(m, "module", None), torch.nn.Module):  # DDP, DeepSpeedEngine, FSDP1
            m = m.module
        else:
            break
    raise TypeError(f"logprob_backend='klear': found no transformers model inside {type(model).__name__}; use "
                    "logprob_backend='trl'")


@contextlib.contextmanager
def _head_returns_token_stats(head, labels, logits_to_keep: int, temperature: float, calls: list):
    """For the duration of the block, ``head(hidden)`` (the LM head module, called by the CausalLM's own forward)
    returns ``stack([log p(label), entropy], -1)`` (b, logits_to_keep, 2) from ``klear_lib.logprobs`` instead of
    logits. The head module is kept, only its ``forward`` is swapped: the hooks that DDP, DeepSpeed ZeRO-3 and FSDP
    put on the wrapped model and on the head (gather before the call, reduce after backward) still run."""

    def forward(hidden):  # (b, T, H): every position, since the CausalLM is called with logits_to_keep=0
        # the hidden state at position t predicts token t + 1: keep the logits_to_keep positions before each
        # scored token
        h = hidden[:, -logits_to_keep - 1:-1]
        weight = head.weight
        if type(weight).__name__ == "DTensor":  # an FSDP2 head wrapped on its own and resharded: gather it
            weight = weight.full_tensor()
        with torch.autocast(h.device.type, enabled=False):  # the chunked head computes in fp32 itself
            logps, ent = token_logprobs_and_entropy(h, weight, labels, temperature=temperature)
        stats = torch.stack([logps, ent], dim=-1)
        calls.append(stats.detach())  # to check that the CausalLM hands back exactly this
        return stats

    saved = head.__dict__.get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if saved is None:
            del head.forward
        else:
            head.forward = saved


def klear_token_stats(model, input_ids, attention_mask, logits_to_keep, *, temperature=1.0, batch_size=None,
                      autocast=contextlib.nullcontext):
    """Per-token log-probs and entropies of the last ``logits_to_keep`` tokens, as TRL's pass returns them
    ``(logps, entropies, None)``, each (B, logits_to_keep), from the last hidden states and the LM-head weight
    through ``klear_lib.logprobs.token_logprobs_and_entropy`` (chunked; no (B, T, V) logits, in forward or
    backward). Positions with ``attention_mask == 0`` get 0.

    ``model`` is called as it is, wrappers included (DDP, DeepSpeed, FSDP, PEFT): the chunked head runs inside the
    LM head module's call during the CausalLM's forward (``_head_returns_token_stats``), so a data-parallel wrapper
    prepares its gradient reduction and a sharded one gathers every parameter, the head's included. Models whose
    logits are scaled or soft-capped after the LM head, or whose head has a bias, are refused (their logits are not
    ``hidden @ W.T``)."""
    inner = causal_lm(model)
    cfg = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier",
                 "lm_head_multiplier"):
        if getattr(cfg, attr, None) not in (None, 1, 1.0):
            raise ValueError(f"logprob_backend='klear' needs logits = hidden @ W.T; {type(inner).__name__} sets "
                             f"{attr}={getattr(cfg, attr)!r}: use logprob_backend='trl'")
    head = inner.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("logprob_backend='klear' needs an LM head without bias: use logprob_backend='trl'")
    batch_size = batch_size or input_ids.size(0)
    all_logps, all_ent = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
        labels = ids[:, -logits_to_keep:].masked_fill(mask[:, -logits_to_keep:] == 0, IGNORE_INDEX)
        calls = []
        with _head_returns_token_stats(head, labels, logits_to_keep, temperature, calls), autocast():
            stats = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (b, logits_to_keep, 2)
        if len(calls) != 1 or stats is None or not torch.equal(stats.detach(), calls[0]):
            # a forward that computes its logits without calling the head module, or that changes what the head
            # returned (a cast to bf16, a scale: a patched forward such as unsloth's can), would hand back something
            # else than these statistics: never read that as log-probs
            raise RuntimeError(f"logprob_backend='klear': {type(inner).__name__}'s forward called its LM head module "
                               f"{len(calls)} time(s) and must return what it returned unchanged; use "
                               "logprob_backend='trl'")
        all_logps.append(stats[..., 0])
        all_ent.append(stats[..., 1])
    return torch.cat(all_logps), torch.cat(all_ent), None


class _NoUpdatesLeft(Exception):
    """Raised before the first optimizer step when every rollout of the budget kept no group."""


#: The reason a reward function gives (``RewardResult.reason`` in its ``last_results``) when the data it judges by is
#: malformed (a code record's tests): the batch fails instead of being trained on that score.
DATA_ERROR = "data_error"


class DataError(ValueError):
    """A reward function judged responses against malformed data (reason ``DATA_ERROR``)."""


class NoUpdatesError(RuntimeError):
    """A run that made no optimizer step: every group of every rollout was filtered (the message says why and what
    to set). The model is unchanged."""


# TRL's GRPO loss types that klear's registry reproduces: (KlearLossConfig.loss_name, loss_agg_mode). TRL's default,
# "dapo" (PPO-clip, token-mean), stands for "not set": the KlearLossConfig default (GPPO, token-mean) applies.
TRL_LOSS_TYPES = {
    "cispo": ("cispo", "token-mean"),
    "grpo": ("ppo_clip", "seq-mean-token-mean"),
    "bnpo": ("ppo_clip", "token-mean"),
    "dr_grpo": ("ppo_clip", "seq-mean-token-sum-norm"),
}
# GRPOConfig fields klear has no counterpart for: (TRL's value that means "off", what to do instead)
TRL_UNSUPPORTED = {
    "delta": (None, "klear's dual-clip is KlearLossConfig.policy_loss.clip_ratio_c"),
    "top_entropy_quantile": (1.0, "klear's entropy-based token selection is ERC: KlearLossConfig.policy_loss"
                                  ".erc_low/erc_high"),
    "scale_rewards": ("group", "klear normalises advantages per group itself: KlearLossConfig.adv_std ('unbiased', "
                               "'population' or 'none')"),
    "off_policy_mask_threshold": (None, "klear has no off-policy sequence mask; leave it unset"),
}


def _trl_default(name: str):
    return {f.name: f.default for f in dataclasses.fields(GRPOConfig)}[name]


def klear_from_trl(args: GRPOConfig, klear: KlearLossConfig | None) -> KlearLossConfig:
    """The ``KlearLossConfig`` a run uses, given TRL's loss settings in ``args``, so that none is silently ignored.

    Without ``klear``: TRL's ``loss_type`` (``TRL_LOSS_TYPES``), ``epsilon``/``epsilon_high`` (the clip range, as
    TRL reads them: ``epsilon_high`` defaults to ``epsilon``) and ``importance_sampling_level="sequence"`` (``gspo``)
    are honoured on top of the ``KlearLossConfig`` defaults. With ``klear``: each TRL setting away from TRL's
    default must agree with it, else a ValueError names the klear field to set. ``beta`` > 0, loss types without a
    klear counterpart and ``TRL_UNSUPPORTED`` are refused either way."""
    if args.beta != 0.0:
        raise ValueError(f"GRPOConfig.beta={args.beta}: Klear's recipe has no KL term and KlearLossConfig none to "
                         "set; set GRPOConfig.beta=0.0")
    for name, (off, instead) in TRL_UNSUPPORTED.items():
        if hasattr(args, name) and getattr(args, name) != off:
            raise ValueError(f"GRPOConfig.{name}={getattr(args, name)!r} is not read by KlearGRPOTrainer: {instead}; "
                             f"leave GRPOConfig.{name} at {off!r}")
    want: dict[str, object] = {}  # KlearLossConfig field (dotted for policy_loss) -> what TRL's settings ask for
    default_loss = _trl_default("loss_type")
    if args.loss_type != default_loss:
        if args.loss_type not in TRL_LOSS_TYPES:
            raise ValueError(f"GRPOConfig.loss_type={args.loss_type!r} has no counterpart in klear's registry: set "
                             f"KlearLossConfig.loss_name (one of {sorted(POLICY_LOSSES)}) and loss_agg_mode, and "
                             f"leave loss_type at {default_loss!r}; TRL loss types klear reproduces: "
                             f"{sorted(TRL_LOSS_TYPES)}")
        want["loss_name"], want["loss_agg_mode"] = TRL_LOSS_TYPES[args.loss_type]
        if args.loss_type == "dr_grpo":
            want["policy_loss.loss_scale_factor"] = float(args.max_completion_length)
    if args.importance_sampling_level != "token":
        if args.importance_sampling_level != "sequence" or want.get("loss_name", "ppo_clip") != "ppo_clip":
            raise ValueError(f"GRPOConfig.importance_sampling_level={args.importance_sampling_level!r} with "
                             f"loss_type={args.loss_type!r}: set KlearLossConfig.loss_name='gspo' (GSPO's sequence "
                             "ratio) and leave importance_sampling_level at 'token'")
        want["loss_name"] = "gspo"
    if args.epsilon != _trl_default("epsilon"):
        want["policy_loss.clip_ratio_low"] = args.epsilon
        want["policy_loss.clip_ratio_high"] = args.epsilon  # TRL: epsilon_high defaults to epsilon
    if args.epsilon_high is not None:
        want["policy_loss.clip_ratio_high"] = args.epsilon_high
    trl_name = {"loss_name": "loss_type", "loss_agg_mode": "loss_type", "policy_loss.loss_scale_factor": "loss_type",
                "policy_loss.clip_ratio_low": "epsilon", "policy_loss.clip_ratio_high": "epsilon_high"}
    if klear is None:
        top = {k: v for k, v in want.items() if "." not in k}
        policy = {k.split(".", 1)[1]: v for k, v in want.items() if "." in k}
        return KlearLossConfig(**top, policy_loss=dataclasses.replace(PolicyLossConfig(), **policy))
    for key, value in want.items():
        obj = klear.policy_loss if key.startswith("policy_loss.") else klear
        have = getattr(obj, key.split(".")[-1])
        if have != value:
            src = "importance_sampling_level" if value == "gspo" else trl_name[key]
            if key == "policy_loss.clip_ratio_high" and args.epsilon_high is None:
                src = "epsilon"
            raise ValueError(f"GRPOConfig.{src}={getattr(args, src)!r} asks for KlearLossConfig.{key}={value!r}, "
                             f"but the klear= config given has {have!r}: set KlearLossConfig.{key}, and leave "
                             f"GRPOConfig.{src} at TRL's default (or drop klear= to take TRL's settings)")
    return klear


def reward_total_range(funcs, weights) -> tuple[float, float] | None:
    """The range of the weighted sum of the reward functions, from each one's declared ``reward_range`` (lo, hi);
    None when one of them declares none (a reward model, a function without the attribute)."""
    lo = hi = 0.0
    for fn, w in zip(funcs, weights):
        rng = getattr(fn, "reward_range", None)
        if rng is None:
            return None
        a, b = float(w) * float(rng[0]), float(w) * float(rng[1])
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


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
        self._last_rewards: torch.Tensor | None = None
        self._last_group_keep: torch.Tensor | None = None
        self._queue: list[dict] = []  # the packed mini-batches of the current rollout, not yet trained on
        self.rollouts_done = 0
        self._started = False
        self._pending: dict | None = None  # the current rollout's record, reported after its last update
        self._sampler_rng = random.Random(f"klear-prompts:{self.args.seed}")
        self._order: list[int] = []
        self._groups = [0, 0]  # groups generated, kept: since train() was called
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
        return head + why

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

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._check_data_errors()
        self._last_rewards = rewards_per_func  # (N_all, n_funcs), gathered over processes
        return rewards_per_func

    def _check_data_errors(self) -> None:
        """Fail the batch, loudly, when a reward function reports that it judged against malformed data (a result
        with reason ``DATA_ERROR`` in its ``last_results``, as ``rewards.pool.make_trl_reward_func`` keeps them):
        its score says nothing about the response, and training on it would be training on noise."""
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
        while len(order) < self.target_prompts and len(parts) < self.klear.max_gen_batches:
            # draw-order group g is generated by process g % world as its (g // world)-th prompt, so that the
            # kept groups, taken in draw order, spread over the processes
            idx = self._draw_prompts(self.gen_prompts)[rank::world]
            rows = [self.train_dataset[i] for i in idx for _ in range(G)]
            out = self._generate_and_score_completions(rows)
            gathered = self._last_group_keep  # (gen_prompts,) in gather order: process by process
            kept = [g for g in range(self.gen_prompts) if gathered[(g % world) * n_local + g // world]]
            self._groups[0] += self.gen_prompts
            self._groups[1] += len(kept)
            self._best_reward = max(self._best_reward, float(self._last_total_rewards.max()))
            order += [(len(parts), g) for g in kept][: self.target_prompts - len(order)]
            parts.append(out)
            generated += self.gen_prompts
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


class Stopwatch:
    """Wall-clock seconds since construction (for progress lines)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


# -- one RL run end to end ------------------------------------------------------------------------------------
class MetricsCallback(TrainerCallback):
    """Writes every log line of the trainer (one per optimizer step) to the run's ``metrics.jsonl``.

    Each record carries ``step`` (optimizer step), ``rollout`` (the rollout whose mini-batch it trained on, from
    1) and the metrics TRL averaged over the step (``actor/*`` from klear_lib.losses, ``entropy``,
    ``grad_norm``, ``klear/informative_completions`` ...). Rollout-level metrics are in the rollout records.
    """

    def __init__(self, writer, tags: dict):
        self.writer, self.tags = writer, tags

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "train_runtime" not in logs and "klear/rollout" in logs:  # a training step's line
            logs = dict(logs)
            rollout = int(round(logs.pop("klear/rollout")))
            self.writer.write({**self.tags, "step": state.global_step, "rollout": rollout, **logs})


class RolloutRecorder:
    """The ``on_rollout`` callback of ``run_rl``: one record per rollout boundary in ``metrics.jsonl`` with the
    rollout's ``klear/*`` counts and generation metrics, the fork probe (``klear/p_correct_fork``) when the task
    has fork facts, and the held-out evaluation (``eval/*``) every ``eval_every`` rollouts, before RL (unless
    ``eval_start`` is False) and at the end. ``history`` keeps the records that hold an evaluation."""

    def __init__(self, writer, tags: dict, *, evaluate, eval_every: int, probe=None, progress=print,
                 eval_start: bool = True):
        self.writer, self.tags, self.evaluate, self.every, self.probe = writer, tags, evaluate, eval_every, probe
        self.progress, self.eval_start = progress, eval_start
        self.history: list[dict] = []
        self.clock = Stopwatch()

    def __call__(self, trainer: KlearGRPOTrainer, record: dict) -> None:
        rec = {**self.tags, **record}
        if self.probe is not None:
            rec.update({f"klear/{k}": v for k, v in self.probe(trainer.model).items()})
        due = record["rollout"] % self.every == 0 and (record["rollout"] > 0 or self.eval_start)
        if due or record["final"]:
            res = self.evaluate(trainer.model)  # {"avg_at_n": float, "n": int, other floats, "by_level": {...}}
            rec.update({f"eval/{k}": v for k, v in res.items() if isinstance(v, float)})
            rec.update({f"eval/avg_at_n_level{lvl}": v for lvl, v in res.get("by_level", {}).items()})
            self.history.append(rec)
            tags = " ".join(f"{k}={v}" for k, v in self.tags.items())
            extra = "".join(f", {k.split('/')[-1]} {v:.3f}" for k, v in rec.items()
                            if k in ("eval/avg_at_n_fork", "klear/p_correct_fork"))
            self.progress(f"  [{self.clock():6.1f}s] {tags} rollout {record['rollout']:3d} (step {record['step']:3d}): "
                          f"held-out avg@{res['n']} = {res['avg_at_n']:.3f}{extra}")
        self.writer.write(rec)
        numbers = {k: v for k, v in rec.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and k not in self.tags and k != "step"}
        # the experiment tracker (report_to) sees the rollout records too; MetricsCallback ignores them. The handler's
        # on_log clears control.should_log, which the optimizer step being finished still needs: keep it.
        should_log = trainer.control.should_log
        trainer.callback_handler.on_log(trainer.args, trainer.state, trainer.control, logs=numbers)
        trainer.control.should_log = should_log


def correctness_reward(completions, answer, **kwargs) -> list[float]:
    """TRL reward function: 1.0 for the right boxed answer after ``</think>``, else 0.0 (tiny task)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [exact_answer_reward(t, a)[0] for t, a in zip(texts, answer)]


correctness_reward.reward_range = (0.0, 1.0)  # KlearGRPOTrainer checks the Klear filter can be met before training


def run_rl(cfg, model, tokenizer, train_problems, heldout, writer, *, tags=None, output_dir=None, progress=print,
           rows=None, reward_funcs=None, evaluate=None, probe=None, save_dir=None, tracking_dir=None):
    """RL from ``model`` (the SFT start) with ``cfg`` (an ``RLExperimentConfig``); returns (model, eval history).

    The task is the tiny arithmetic one unless the caller passes its own: ``rows`` (dataset rows with a
    ``prompt`` and the columns its reward functions read), ``reward_funcs`` (TRL reward functions), ``evaluate``
    (model -> ``{"avg_at_n": float, "n": int, ...}``) and ``probe`` (model -> ``{name: float}``, logged per rollout
    as ``klear/<name>``; on the arithmetic task with fork facts, the fork probe). Metrics go to ``writer`` (a
    ``runs.MetricsWriter``): one record per optimizer step and one per rollout. The caller sets the seed
    (``runs.set_seed``) before building the model. ``save_dir``: save the final model there through the trainer
    (every process calls it, as sharded ZeRO-3/FSDP weights need). ``tracking_dir``: where the experiment tracker
    of ``cfg.report_to`` writes and under which names (a ``klear_lib.experiment.UnitTracking``, or a folder;
    ``klear_lib.train.tracking``; default ``<output_dir>/tracking``); the rollout records go to it too.
    ``output_dir``: the trainer's folder (its checkpoints when ``save_steps``; a run resumes from the newest); by
    default a scratch folder, removed when the run ends unless the tracker's default folder is inside it.
    """
    tags = dict(tags or {})
    arithmetic = rows is None
    facts = parse_fork_facts(getattr(cfg, "fork_facts", "")) if arithmetic else ()
    if arithmetic:
        rows = [{"prompt": prompt_messages(p), "answer": p.answer} for p in train_problems]
    if evaluate is None:
        evaluate = partial(
            evaluate_heldout,
            tokenizer=tokenizer,
            problems=heldout,
            n=cfg.eval_n,
            temperature=cfg.eval_temperature,
            top_p=cfg.eval_top_p,
            max_new_tokens=cfg.max_completion_length,
            fork_facts=facts,
        )
    if probe is None and facts:
        probe = partial(arithmetic_probes, tokenizer=tokenizer, facts=facts, problems=heldout)
    focus = None
    if facts:
        def focus(prompt_ids, completion_ids, completion_mask):
            return fork_token_mask(tokenizer, completion_ids, completion_mask, facts)
    dataset = Dataset.from_list(rows)
    upr = cfg.updates_per_rollout
    report_to = getattr(cfg, "report_to", "none")
    tracking = contextlib.ExitStack()
    tracker_inside = report_to != "none" and tracking_dir is None  # launch.py: beside the checkpoints
    if output_dir is None:  # a scratch folder for the trainer, removed after the run unless the tracker writes in it
        output_dir = (tempfile.mkdtemp(prefix="klear-rl-") if tracker_inside
                      else tracking.enter_context(tempfile.TemporaryDirectory(prefix="klear-rl-")))
    output_dir = str(output_dir)
    if tracker_inside:  # named after the checkpoints' folder
        tracking_dir = os.path.join(output_dir, "tracking")
    args = GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=_per_device(cfg.mini_batch_prompts * cfg.num_generations),  # completions per update
        steps_per_generation=upr,  # at most `upr` optimizer steps per rollout (dynamic sampling may make fewer)
        gradient_accumulation_steps=1,
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        learning_rate=cfg.rl_lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        max_steps=cfg.max_steps + upr,  # a bound, never reached: the rollout budget ends the run (+1 rollout: resume)
        beta=0.0,
        epsilon=cfg.clip_ratio_low,  # unused by our loss; set so TRL's own logs agree
        epsilon_high=cfg.clip_ratio_high,
        use_vllm=cfg.use_vllm,
        vllm_mode=cfg.vllm_mode,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        gradient_checkpointing=checkpointing(cfg),
        vllm_importance_sampling_correction=False,  # see KlearGRPOTrainer.__init__
        use_cpu=cfg.use_cpu,
        bf16=cfg.bf16,
        seed=cfg.seed,
        data_seed=cfg.seed,
        logging_steps=1,
        save_strategy="steps" if cfg.save_steps else "no",
        save_steps=cfg.save_steps or 500,
        report_to=report_to,
        disable_tqdm=True,
        **tracker_names(tracking_dir),  # the unit is the run, the notebook the project (klear_lib.train.tracking)
    )
    recorder = RolloutRecorder(writer, tags, evaluate=lambda m: evaluate(m), eval_every=cfg.eval_every, probe=probe,
                               eval_start=getattr(cfg, "eval_start", True),
                               progress=progress)
    # the trackers read their folders and names when the trainer is built
    tracking.enter_context(tracking_env(tracking_dir if report_to != "none" else None))
    trainer = KlearGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs or [correctness_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        klear=cfg.klear_loss,
        rollouts=cfg.rollouts,
        on_rollout=(recorder,),
        focus=focus,
        on_no_updates="warn",  # a notebook arm whose filter keeps nothing is a result; the records show it
        callbacks=[MetricsCallback(writer, tags)],
    )
    trainer.remove_callback(PrinterCallback)  # one progress line per evaluation instead of a dict per step
    add_hparams(trainer, cfg, args.report_to)  # TensorBoard: the resolved config as hparams
    try:
        trainer.train(resume_from_checkpoint=_last_checkpoint(args.output_dir) if cfg.save_steps else None)
    finally:
        tracking.close()
    if save_dir is not None:
        trainer.save_model(str(save_dir))
        if trainer.accelerator.is_main_process:
            tokenizer.save_pretrained(str(save_dir))
    return trainer.model, recorder.history


def _per_device(completions_per_update: int) -> int:
    """A mini-batch's completions per process: ``mini_batch_prompts`` is global (Klear's 16 prompts per optimizer
    step, however many GPUs), so each of WORLD_SIZE processes takes its share."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if completions_per_update % world:
        raise ValueError(f"mini_batch_prompts x num_generations = {completions_per_update} completions per optimizer "
                         f"step must divide evenly over the {world} processes")
    return completions_per_update // world


def _last_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` folder in ``output_dir`` (an interrupted run resumes there), or None."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
