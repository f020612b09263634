"""Klear's actor loss inside verl (multi-GPU, multi-node training on Ray), reusing ``klear_lib.losses``.

Load it in every verl process by naming it in ``VERL_USE_EXTERNAL_MODULES`` (``import verl`` imports the listed
modules; Ray workers inherit the variable through the runtime environment, see ``scripts/verl_klear.sh``)::

    VERL_USE_EXTERNAL_MODULES=klear_lib.integrations.verl \\
    KLEAR_VERL_LOSS='{"erc_low": 0.8, "erc_high": 1.2, "sft_alpha": 0.1}' \\
    python -m verl.trainer.main_ppo actor_rollout_ref.actor.policy_loss.loss_mode=gppo_erc \\
        actor_rollout_ref.actor.calculate_entropy=True ...

Registered into verl's policy-loss registry (``core_algos.register_policy_loss``), each as
``pg_loss + α · positive_loss`` (reference §2):

==================  ====================================================================================
``gppo``            GPPO (reference §1) with β_l/β_h, dual-clip; ``klear_lib.losses.gppo_loss``
``gppo_erc``        GPPO with Entropy Ratio Clipping (reference §3)
``ppo_clip_erc``    DAPO-style PPO-clip (clip-higher, dual-clip) with ERC; ``klear_lib.losses.ppo_clip_loss``
==================  ====================================================================================

``positive_loss`` is ``klear_lib.losses.positive_sample_loss``: the NLL of the fully-correct responses (reward
== ``verl_reward.FULL_SCORE``), aggregated like the policy loss. verl's own losses (``vanilla``, ``cispo``, ...)
run untouched, without the α term.

Options. Clip ranges come from verl's actor config (``clip_ratio_low``/``clip_ratio_high``, else ``clip_ratio``;
``clip_ratio_c``, whose verl default is 3.0 where Klear uses 10; ``loss_scale_factor``). What verl's config has no
field for comes from the JSON in ``KLEAR_VERL_LOSS``: ``beta_low``, ``beta_high``, ``gppo_beta_scales_value``,
``erc_low``, ``erc_high`` (the ERC variants default to the ERC paper's config bounds 0.8 / 1.2; its training
scripts used 0.95 / 1.05) and ``sft_alpha`` (α, default 0.1 as in Klear's script; 0 turns the term off).
The resolved options are logged (logger ``klear_lib.integrations.verl``) when the module loads, and again when
verl's tracker starts (``verl.utils.tracking.Tracking``, in the process that runs the trainer), where they are
complete: verl's clip ranges and loss mode from the run's config with ``KLEAR_VERL_LOSS``. There they are also added
to the config the tracker records as the run's config (key ``klear_verl_loss``: wandb, mlflow, swanlab, clearml
store it) and written as ``klear_verl_loss.json`` into ``trainer.default_local_dir``, beside verl's checkpoints.
verl's own saved config (hydra's ``.hydra/config.yaml``) is written by the driver before this module can see it, so
the options file sits beside the checkpoints instead (``resolved_options``).

Aggregation (global normalisation). verl 0.9.1 normalises every micro-batch's loss by counts of the whole
mini-batch over all data-parallel ranks and multiplies by the DP size: ``agg_loss`` computes
``Σ_micro ℓ / batch_num_tokens · dp_size`` for ``token-mean``, where the engine all-reduces ``batch_num_tokens``
over the DP group before splitting the mini-batch into micro-batches; micro-batch gradients are summed and DP
averages over ranks, so the update follows the token-mean over the global mini-batch whatever the split (the seq
modes use ``global_batch_size`` the same way). Our losses normalise by the micro-batch's own count; the adapter
multiplies by (our count / verl's count per rank), which is exact because every aggregation is linear in the
per-token losses. The α term is a token-mean over the *fully-correct* responses' tokens, a count verl does not
keep: the ``TrainingWorker.train_batch`` hook counts them in each mini-batch and all-reduces the counts over the
DP group exactly as verl does ``batch_num_tokens``, and the α term is rescaled by them the same way.
(Klear's own verl fork normalised both terms per micro-batch, the verl of its time; see docs/scale.md.)

The hooks. verl's policy-loss signature carries no entropies and no rewards. ``install_hooks`` (run when this
module is imported) makes small changes, each pinned to verl ``VERIFIED_VERL`` by ``tests/test_verl.py``:

1. legacy trainer (``trainer.use_v1=False``): ``RayPPOTrainer._compute_old_log_prob`` also stores the rollout
   policy's entropies under ``old_entropys``, which ``fit`` does not pop (it pops ``entropys`` after logging). The
   V1 trainer (verl 0.9.1's default) keeps them itself, under ``entropy``, in the batch the actor reads;
2. ``verl.workers.utils.losses.ppo_loss`` (the actor's loss, also bound by name in
   ``verl.workers.engine_workers``) hands the Klear loss, through a context variable: the current entropies
   (``model_output["entropy"]``, computed when ``actor.calculate_entropy=True``), the rollout entropies
   (``old_entropys`` or ``entropy``), the fully-correct flags (``rm_scores`` summed over tokens == FULL_SCORE; verl
   keeps ``rm_scores``, the reward before any KL penalty, in the actor's batch in both trainers) and the
   mini-batch's positive counts; verl's own losses are called as before;
3. ``verl.workers.engine_workers.TrainingWorker.train_batch`` (once per mini-batch on each rank) stores the global
   positive counts of the mini-batch in it, when the actor's loss is a Klear loss with α > 0.

A Klear ERC loss called without entropies raises, and so does one with α > 0 called without the fully-correct
flags, or with verl's global counts but not the positive ones (nothing silently runs without ERC or α).

Klear's group filter is verl's own ``algorithm.filter_groups`` (V1 trainer) on the ``acc`` key of
``klear_lib.integrations.verl_reward``: the same rule, but verl refills dropped groups instead of drawing Klear's
fixed 2x batch; docs/scale.md and scripts/verl_klear.sh give the settings and the difference.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.abc
import importlib.util
import json
import logging
import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from klear_lib import losses
from klear_lib.integrations.verl_reward import FULL_SCORE

#: The verl release the hooks were written against and the tests pin.
VERIFIED_VERL = "0.9.1"
#: verl loss name -> (klear loss name, ERC on)
LOSSES = {"gppo": ("gppo", False), "gppo_erc": ("gppo", True), "ppo_clip_erc": ("ppo_clip", True)}
#: Environment variable holding the Klear-only options as JSON.
OPTIONS_ENV = "KLEAR_VERL_LOSS"
KLEAR_ONLY_KEYS = ("beta_low", "beta_high", "gppo_beta_scales_value", "erc_low", "erc_high", "sft_alpha")
DEFAULT_ERC = (0.8, 1.2)
#: α of the positive-sample term (Klear's script: actor.postive_loss_coeff=0.1).
DEFAULT_SFT_ALPHA = 0.1
#: Loss aggregations the α term supports (seq-mean-token-sum-norm divides by the padded width, which varies
#: between micro-batches, so it has no split-invariant positive-sample version).
POSITIVE_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
#: Non-tensor keys of the actor's mini-batch holding its global positive counts (set by the train_batch hook).
POSITIVE_TOKENS_KEY = "klear_positive_tokens"
POSITIVE_SEQS_KEY = "klear_positive_seqs"
#: The resolved options: a key of the config verl's tracker records, and a file in ``trainer.default_local_dir``.
OPTIONS_KEY = "klear_verl_loss"
OPTIONS_FILE = "klear_verl_loss.json"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LossInputs:
    """What the hooked ``ppo_loss`` hands the Klear loss beyond verl's signature."""

    entropy: torch.Tensor | None = None  # (B, T) current policy
    old_entropy: torch.Tensor | None = None  # (B, T) rollout policy
    is_positive: torch.Tensor | None = None  # (B,) bool, fully-correct responses
    positive_totals: dict | None = None  # {"tokens", "seqs"}: fully-correct counts of the global mini-batch


_INPUTS: contextvars.ContextVar[LossInputs] = contextvars.ContextVar("klear_verl_loss_inputs", default=LossInputs())


def klear_options(env: dict | None = None) -> dict:
    """The Klear-only options from ``KLEAR_VERL_LOSS`` (JSON object); an unknown key is a ValueError."""
    text = (os.environ if env is None else env).get(OPTIONS_ENV, "").strip()
    if not text:
        return {}
    try:
        opts = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{OPTIONS_ENV} must be a JSON object, got {text!r}: {err}") from None
    if not isinstance(opts, dict):
        raise ValueError(f"{OPTIONS_ENV} must be a JSON object, got {text!r}")
    unknown = sorted(set(opts) - set(KLEAR_ONLY_KEYS))
    if unknown:
        raise ValueError(f"{OPTIONS_ENV}: unknown key(s) {unknown}; valid: {list(KLEAR_ONLY_KEYS)} (clip ranges "
                         "come from verl's actor config)")
    return opts


def sft_alpha(env: dict | None = None) -> float:
    """α of the positive-sample term: ``sft_alpha`` of ``KLEAR_VERL_LOSS``, default ``DEFAULT_SFT_ALPHA``."""
    alpha = klear_options(env).get("sft_alpha", DEFAULT_SFT_ALPHA)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (alpha >= 0 and math.isfinite(alpha)):
        raise ValueError(f"{OPTIONS_ENV}: sft_alpha must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


def _get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    if hasattr(config, "get"):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


def klear_config(verl_config: Any, *, erc: bool, env: dict | None = None) -> losses.PolicyLossConfig:
    """``klear_lib.losses.PolicyLossConfig`` from verl's actor config and ``KLEAR_VERL_LOSS``."""
    opts = klear_options(env)
    clip = _get(verl_config, "clip_ratio", 0.2)
    d = {
        "clip_ratio_low": float(_get(verl_config, "clip_ratio_low", clip)),
        "clip_ratio_high": float(_get(verl_config, "clip_ratio_high", clip)),
        "clip_ratio_c": float(_get(verl_config, "clip_ratio_c", 3.0)),
        "loss_scale_factor": _get(verl_config, "loss_scale_factor", None),
        **{k: v for k, v in opts.items() if k not in ("erc_low", "erc_high", "sft_alpha")},
    }
    if erc:
        d["erc_low"] = opts.get("erc_low", DEFAULT_ERC[0])
        d["erc_high"] = opts.get("erc_high", DEFAULT_ERC[1])
    return losses.PolicyLossConfig.from_dict(d)


def resolved_options(actor_config: Any = None, env: dict | None = None) -> dict:
    """What the Klear losses run with: ``KLEAR_VERL_LOSS`` as given, α, and for each registered loss its
    ``PolicyLossConfig`` (clip ranges from ``actor_config``, verl's actor config, when given; verl's defaults
    otherwise), plus the loss mode ``actor_config`` selects. Raises on invalid options, as the losses would."""
    text = (os.environ if env is None else env).get(OPTIONS_ENV, "")
    out = {"env": {OPTIONS_ENV: text}, "sft_alpha": sft_alpha(env), "verl": VERIFIED_VERL,
           "loss_mode": _get(_get(actor_config, "policy_loss", {}), "loss_mode", None),
           "losses": {}}
    for name, (klear_name, erc) in LOSSES.items():
        cfg = klear_config(actor_config, erc=erc, env=env)
        out["losses"][name] = {"klear_loss": klear_name, **{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}}
    return out


def _announce(text: str) -> None:
    """One line on stderr through this module's logger (verl leaves the root logger at WARNING)."""
    if not _log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        _log.addHandler(handler)
        _log.setLevel(logging.INFO)
        _log.propagate = False
    _log.info(text)


def record_options(config: dict) -> str | None:
    """At the start of a verl run (its tracker's config, a plain dict of the whole run config): resolve the options
    against the actor config, log them, add them under ``OPTIONS_KEY`` (so the tracker records them with the run's
    config) and write them to ``trainer.default_local_dir``/``OPTIONS_FILE``; returns that path (None without a
    ``default_local_dir``)."""
    actor = _get(_get(config, "actor_rollout_ref", {}), "actor", None)
    opts = resolved_options(actor)
    config[OPTIONS_KEY] = opts
    folder = _get(_get(config, "trainer", {}), "default_local_dir", None)
    path = None
    if folder:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(str(folder), OPTIONS_FILE)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(opts, f, indent=2, sort_keys=True)
    mode = opts["loss_mode"]
    used = opts["losses"].get(mode)
    what = (f"actor loss {mode!r} runs with {json.dumps(used, sort_keys=True)}, sft_alpha={opts['sft_alpha']}"
            if used else f"actor loss {mode!r} is not a Klear loss: the Klear options are unused")
    _announce(f"{what}; options written to {path or 'no file (trainer.default_local_dir is unset)'} and to the "
              f"tracker's config under {OPTIONS_KEY!r}")
    return path


def _rescale(loss_mat_mask: torch.Tensor, loss_agg_mode: str, info: dict) -> float:
    """Factor turning our micro-batch normalisation into verl's global one (module docstring)."""
    mask = loss_mat_mask.bool()
    dp = int(info.get("dp_size") or 1)
    if loss_agg_mode == "token-mean":
        ours = max(int(mask.sum()), 1)
        total = info.get("batch_num_tokens")
        theirs = float(total) / dp if total is not None else ours
    elif loss_agg_mode in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        rows = int((mask.sum(-1) > 0).sum())
        ours = mask.shape[0] if loss_agg_mode == "seq-mean-token-sum-norm" else max(rows, 1)
        total = info.get("global_batch_size")
        theirs = float(total) / dp if total is not None else max(rows, 1)
    else:
        raise ValueError(f"loss_agg_mode={loss_agg_mode!r} is not supported by the Klear losses in verl; "
                         f"valid: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm")
    return ours / theirs


def positive_flags(rm_scores: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the responses whose reward (``rm_scores``, (B, T), summed over tokens) is ``FULL_SCORE``."""
    return rm_scores.sum(-1) == FULL_SCORE


def _positive_loss(log_prob, mask, is_positive, totals, loss_agg_mode, info, name) -> torch.Tensor:
    """α's NLL under verl's global normalisation: the micro-batch's own ``positive_sample_loss`` times (its positive
    count / the global positive count per rank), the same rescaling as ``_rescale`` with the positive counts."""
    if loss_agg_mode not in POSITIVE_AGG_MODES:
        raise ValueError(f"{name}: the positive-sample term (sft_alpha > 0) supports loss_agg_mode in "
                         f"{list(POSITIVE_AGG_MODES)}, got {loss_agg_mode!r}; set sft_alpha to 0 for this mode")
    local = losses.positive_sample_loss(log_prob, mask, is_positive, loss_agg_mode=loss_agg_mode)
    dp = int(info.get("dp_size") or 1)
    if totals is None:
        if info.get("batch_num_tokens") is not None or info.get("global_batch_size") is not None or dp > 1:
            raise ValueError(f"{name}: verl normalises by global counts but the mini-batch carries no global count "
                             "of fully-correct tokens: load klear_lib.integrations.verl through "
                             "VERL_USE_EXTERNAL_MODULES in every process (its TrainingWorker.train_batch hook "
                             "counts them)")
        return local  # one call over the whole batch: its own count is the global one
    pos = mask & is_positive.bool().unsqueeze(-1)  # (B, T)
    if loss_agg_mode == "token-mean":
        ours, total = max(int(pos.sum()), 1), totals["tokens"]
    else:
        ours, total = max(int((pos.sum(-1) > 0).sum()), 1), totals["seqs"]
    return local * (ours * dp / total) if total > 0 else local * 0.0  # total 0: no positive anywhere, local is 0


def make_verl_loss(name: str):
    """The verl-signature function registered as ``name`` (a key of ``LOSSES``)."""
    klear_name, erc = LOSSES[name]
    fn = losses.POLICY_LOSSES[klear_name]

    def verl_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode: str = "token-mean",
                         config=None, rollout_is_weights=None, *, entropy=None, old_entropy=None, is_positive=None,
                         positive_totals=None):
        if rollout_is_weights is not None:
            raise NotImplementedError(f"{name}: rollout-correction weights are not supported by the Klear losses; "
                                      "turn algorithm.rollout_correction off")
        cfg = klear_config(config, erc=erc)
        alpha = sft_alpha()
        extra = _INPUTS.get()
        if entropy is None and old_entropy is None:
            entropy, old_entropy = extra.entropy, extra.old_entropy
        if is_positive is None and positive_totals is None:
            is_positive, positive_totals = extra.is_positive, extra.positive_totals
        if cfg.erc_enabled and (entropy is None or old_entropy is None):
            raise ValueError(f"{name}: ERC needs the current and the rollout policy's per-token entropies, and "
                             "none reached the loss: set actor_rollout_ref.actor.calculate_entropy=True and load "
                             "klear_lib.integrations.verl through VERL_USE_EXTERNAL_MODULES in every process (its "
                             "hook carries them)")
        if alpha > 0 and is_positive is None:
            raise ValueError(f"{name}: sft_alpha={alpha} needs the fully-correct flags, and none reached the loss "
                             "(the hooked ppo_loss reads them from the batch's rm_scores); set sft_alpha to 0 in "
                             f"{OPTIONS_ENV} to train without the positive-sample term")
        mask = response_mask.bool()
        loss, metrics = fn(old_log_prob, log_prob, advantages, mask, loss_agg_mode, cfg,
                           entropy=entropy, old_entropy=old_entropy)
        info = dict(_get(config, "global_batch_info", {}) or {})
        loss = loss * _rescale(mask, loss_agg_mode, info)
        # verl's names for the clip statistics (its dashboards read these) next to ours
        metrics = {**metrics, "actor/pg_clipfrac": metrics["actor/pg_clipfrac_low"] + metrics["actor/pg_clipfrac_high"],
                   "actor/pg_clipfrac_lower": metrics["actor/pg_clipfrac_dual"]}
        if alpha > 0:
            # policy_loss = pg_loss + α · positive_loss (reference §2), both under verl's global normalisation
            loss = loss + alpha * _positive_loss(log_prob, mask, is_positive, positive_totals, loss_agg_mode, info,
                                                 name)
        if is_positive is not None:  # logged at α = 0 too, so that an α sweep compares it across runs
            with torch.no_grad():
                pos = losses.positive_sample_loss(log_prob.detach(), mask, is_positive, loss_agg_mode="token-mean")
            metrics["actor/positive_loss"] = float(pos)  # this micro-batch's token-mean NLL of fully-correct ones
            metrics["klear/positive_frac"] = float(is_positive.float().mean())
        return loss, metrics

    verl_policy_loss.__name__ = f"klear_{name}"
    verl_policy_loss.__doc__ = (f"verl adapter of klear_lib.losses.{fn.__name__} (ERC {'on' if erc else 'off'}) "
                                "plus α · positive_sample_loss.")
    return verl_policy_loss


def register(core_algos=None) -> dict:
    """Register every loss of ``LOSSES`` in verl's registry; returns name -> function."""
    if core_algos is None:
        from verl.trainer.ppo import core_algos
    made = {}
    for name in LOSSES:
        made[name] = core_algos.register_policy_loss(name)(make_verl_loss(name))
    return made


# ---------------------------------------------------------------------------------------------------------
# The hooks
# ---------------------------------------------------------------------------------------------------------
def _patch_compute_old_log_prob(ray_trainer) -> None:
    cls = ray_trainer.RayPPOTrainer
    original = cls._compute_old_log_prob
    if getattr(original, "_klear_hooked", False):
        return

    @functools.wraps(original)
    def _compute_old_log_prob(self, batch, *args, **kwargs):
        out = original(self, batch, *args, **kwargs)
        old = out[0] if isinstance(out, tuple) else out
        if "entropys" in old.batch.keys():
            old.batch["old_entropys"] = old.batch["entropys"].clone()  # `fit` pops "entropys" after logging
        return out

    _compute_old_log_prob._klear_hooked = True
    cls._compute_old_log_prob = _compute_old_log_prob


def _padded(data, key: str) -> torch.Tensor | None:
    """``data[key]`` as a padded (B, T) tensor (verl 0.9.1's V1 batches hold jagged ones), or None."""
    if key not in data.keys():
        return None
    return data.select(key).to_padded_tensor()[key]


def hooked_ppo_loss(original):
    """``ppo_loss`` that makes ``LossInputs`` visible to the Klear losses for the duration of the call."""
    if getattr(original, "_klear_hooked", False):
        return original

    @functools.wraps(original)
    def ppo_loss(config, model_output, data, dp_group=None):
        mode = _get(_get(config, "policy_loss", {}), "loss_mode", "vanilla")
        if mode not in LOSSES:
            return original(config, model_output, data, dp_group)
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        entropy = model_output.get("entropy", None)
        if entropy is not None:
            entropy = no_padding_2_padding(entropy, data)  # (B, T), as ppo_loss does for log-probs
        # the rollout policy's entropies: legacy trainer (our copy) or V1 trainer (its own field)
        old_entropy = _padded(data, "old_entropys")
        if old_entropy is None:
            old_entropy = _padded(data, "entropy")
        rm_scores = _padded(data, "rm_scores")  # (B, T)
        tokens = tu.get_non_tensor_data(data, POSITIVE_TOKENS_KEY, None)
        seqs = tu.get_non_tensor_data(data, POSITIVE_SEQS_KEY, None)
        token = _INPUTS.set(LossInputs(
            entropy=entropy, old_entropy=old_entropy,
            is_positive=None if rm_scores is None else positive_flags(rm_scores),
            positive_totals=None if tokens is None else {"tokens": int(tokens), "seqs": int(seqs)}))
        try:
            return original(config, model_output, data, dp_group)
        finally:
            _INPUTS.reset(token)

    ppo_loss._klear_hooked = True
    return ppo_loss


def positive_totals(data, dp_group=None) -> dict:
    """Fully-correct response tokens and sequences of a mini-batch (a TensorDict with ``rm_scores`` and
    ``response_mask``), summed over the data-parallel group when torch.distributed is initialised (as verl's engines
    sum ``batch_num_tokens``)."""
    if "rm_scores" not in data.keys():
        raise ValueError("the positive-sample term needs rm_scores (the per-token reward) in the actor's batch; it "
                         f"is missing: set sft_alpha to 0 in {OPTIONS_ENV} or use a rule-based reward")
    padded = data.select("rm_scores", "response_mask").to_padded_tensor()
    pos = positive_flags(padded["rm_scores"])  # (B,)
    n_tok = padded["response_mask"].bool().sum(-1)  # (B,)
    counts = torch.stack([n_tok[pos].sum(), (pos & (n_tok > 0)).sum()]).to(torch.int64)  # (2,)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from verl.utils.device import get_device_id

        counts = counts.to(get_device_id())
        torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.SUM, group=dp_group)
    return {"tokens": int(counts[0]), "seqs": int(counts[1])}


def _counts_positives(loss_fn) -> bool:
    """Whether a worker's loss (``partial(ppo_loss, config=actor_config)``) is a Klear loss with α > 0. The same on
    every rank (same config and environment), so either all ranks enter the all-reduce or none."""
    config = (getattr(loss_fn, "keywords", None) or {}).get("config")
    return _get(_get(config, "policy_loss", {}), "loss_mode", None) in LOSSES and sft_alpha() > 0


def hooked_train_batch(original):
    """``TrainingWorker.train_batch`` that first stores the mini-batch's global positive counts in it."""
    if getattr(original, "_klear_hooked", False):
        return original

    @functools.wraps(original)  # keeps verl's dispatch attributes (``@register``)
    def train_batch(self, data, *args, **kwargs):
        if _counts_positives(getattr(self, "loss_fn", None)):
            from verl.utils import tensordict_utils as tu

            totals = positive_totals(data, self.engine.get_data_parallel_group())
            tu.assign_non_tensor(data, **{POSITIVE_TOKENS_KEY: totals["tokens"], POSITIVE_SEQS_KEY: totals["seqs"]})
        return original(self, data, *args, **kwargs)

    train_batch._klear_hooked = True
    return train_batch


def _patch_losses_module(module) -> None:
    if hasattr(module, "ppo_loss"):
        module.ppo_loss = hooked_ppo_loss(module.ppo_loss)


def _patch_engine_workers(module) -> None:
    _patch_losses_module(module)
    if hasattr(module, "TrainingWorker"):
        module.TrainingWorker.train_batch = hooked_train_batch(module.TrainingWorker.train_batch)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after ``name`` is first imported (for modules that bind ``ppo_loss`` by name
    at import, or that are heavy to import here)."""

    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one-shot: find the real spec, patch once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, self.patch

        class _Loader(importlib.abc.Loader):
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                patch(module)

        spec.loader = _Loader()
        return spec


def _when_imported(name: str, patch) -> None:
    if name in sys.modules:
        patch(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, patch))


def hooked_tracking_init(original):
    """``Tracking.__init__`` that first records the resolved options in the run's config (``record_options``)."""
    if getattr(original, "_klear_hooked", False):
        return original

    @functools.wraps(original)
    def __init__(self, project_name, experiment_name, default_backend="console", config=None):
        if isinstance(config, dict):
            record_options(config)
        return original(self, project_name, experiment_name, default_backend, config)

    __init__._klear_hooked = True
    return __init__


def _patch_tracking(module) -> None:
    if hasattr(module, "Tracking"):
        module.Tracking.__init__ = hooked_tracking_init(module.Tracking.__init__)


def install_hooks() -> None:
    """Install the patches of the module docstring (now for loaded modules, on import for the others)."""
    _when_imported("verl.utils.tracking", _patch_tracking)
    _when_imported("verl.workers.utils.losses", _patch_losses_module)
    _when_imported("verl.workers.engine_workers", _patch_engine_workers)
    _when_imported("verl.trainer.distillation.losses", _patch_losses_module)
    _when_imported("verl.trainer.ppo.ray_trainer", _patch_compute_old_log_prob)


def _load() -> None:
    import verl

    version = getattr(verl, "__version__", "unknown")
    if version != VERIFIED_VERL:
        warnings.warn(f"klear_lib.integrations.verl was written against verl {VERIFIED_VERL}; this is verl "
                      f"{version}: run tests/test_verl.py before trusting ERC runs", stacklevel=2)
    register()
    install_hooks()
    opts = resolved_options()
    erc = {n: (o["erc_low"], o["erc_high"]) for n, o in opts["losses"].items() if o["erc_low"] is not None}
    first = opts["losses"]["gppo"]
    _announce(f"registered {sorted(LOSSES)} in verl {version}'s policy-loss registry; {OPTIONS_ENV}="
              f"{opts['env'][OPTIONS_ENV] or '(unset)'}: sft_alpha={opts['sft_alpha']}, beta_low={first['beta_low']}, "
              f"beta_high={first['beta_high']}, ERC bounds {erc} (clip ranges: verl's actor config)")


if importlib.util.find_spec("verl") is not None:
    _load()
