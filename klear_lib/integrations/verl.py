"""Klear's policy losses inside verl (multi-GPU, multi-node training on Ray), reusing ``klear_lib.losses``.

Load it in every verl process by naming it in ``VERL_USE_EXTERNAL_MODULES`` (``import verl`` imports the listed
modules; Ray workers inherit the variable through the runtime environment, see ``scripts/verl_klear.sh``)::

    VERL_USE_EXTERNAL_MODULES=klear_lib.integrations.verl \\
    KLEAR_VERL_LOSS='{"erc_low": 0.8, "erc_high": 1.2}' \\
    python -m verl.trainer.main_ppo actor_rollout_ref.actor.policy_loss.loss_mode=gppo_erc \\
        actor_rollout_ref.actor.calculate_entropy=True ...

Registered into verl's policy-loss registry (``core_algos.register_policy_loss``):

==================  ====================================================================================
``gppo``            GPPO (reference §1) with β_l/β_h, dual-clip; ``klear_lib.losses.gppo_loss``
``gppo_erc``        GPPO with Entropy Ratio Clipping (reference §3)
``ppo_clip_erc``    DAPO-style PPO-clip (clip-higher, dual-clip) with ERC; ``klear_lib.losses.ppo_clip_loss``
==================  ====================================================================================

Clip ranges come from verl's actor config (``clip_ratio_low``/``clip_ratio_high``, else ``clip_ratio``;
``clip_ratio_c``, whose verl default is 3.0 where Klear uses 10; ``loss_scale_factor``). What verl's config has no
field for comes from the JSON in ``KLEAR_VERL_LOSS``: ``beta_low``, ``beta_high``, ``gppo_beta_scales_value``,
``erc_low``, ``erc_high`` (the ERC variants default to the paper's config bounds 0.8 / 1.2).

Aggregation. verl normalises a micro-batch's loss by global counts (tokens or sequences of the whole mini-batch
across data-parallel ranks, ``config.global_batch_info``) so that gradients do not depend on how the batch is
split. Our losses normalise by the micro-batch's own count; the adapter rescales the result by (our count /
verl's count per rank), which is exact because every aggregation is linear in the per-token losses.

Entropies (the hook). verl's policy-loss signature carries no entropies, and its trainer drops the rollout
policy's per-token entropies after logging their mean (``old_log_prob.batch.pop("entropys")`` in
``RayPPOTrainer.fit``). ``install_entropy_hook`` (run when this module is imported) makes two small changes,
both pinned to verl ``VERIFIED_VERL`` by ``tests/test_verl.py``:

1. ``RayPPOTrainer._compute_old_log_prob`` also stores the entropies under ``old_entropys``, which ``fit`` does
   not pop, so they travel with the batch to the actor;
2. ``verl.workers.utils.losses.ppo_loss`` (the actor's loss, also bound by name in ``verl.workers.engine_workers``)
   hands the current entropies (``model_output["entropy"]``, computed when ``actor.calculate_entropy=True``) and
   ``old_entropys`` to the Klear loss through a context variable; verl's own losses are called as before.

A Klear ERC loss called without entropies raises (it never silently runs without ERC).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.abc
import importlib.util
import json
import os
import sys
import warnings
from typing import Any

import torch

from klear_lib import losses

#: The verl release the hook was written against and the tests pin.
VERIFIED_VERL = "0.9.1"
#: verl loss name -> (klear loss name, ERC on)
LOSSES = {"gppo": ("gppo", False), "gppo_erc": ("gppo", True), "ppo_clip_erc": ("ppo_clip", True)}
#: Environment variable holding the Klear-only options as JSON.
OPTIONS_ENV = "KLEAR_VERL_LOSS"
KLEAR_ONLY_KEYS = ("beta_low", "beta_high", "gppo_beta_scales_value", "erc_low", "erc_high")
DEFAULT_ERC = (0.8, 1.2)

# (entropy, old_entropy), each (B, T), set by the hooked ppo_loss for the duration of one loss call.
_ENTROPIES: contextvars.ContextVar[tuple[torch.Tensor | None, torch.Tensor | None]] = contextvars.ContextVar(
    "klear_verl_entropies", default=(None, None))


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
        **{k: v for k, v in opts.items() if k not in ("erc_low", "erc_high")},
    }
    if erc:
        d["erc_low"] = opts.get("erc_low", DEFAULT_ERC[0])
        d["erc_high"] = opts.get("erc_high", DEFAULT_ERC[1])
    return losses.PolicyLossConfig.from_dict(d)


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


def make_verl_loss(name: str):
    """The verl-signature function registered as ``name`` (a key of ``LOSSES``)."""
    klear_name, erc = LOSSES[name]
    fn = losses.POLICY_LOSSES[klear_name]

    def verl_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode: str = "token-mean",
                         config=None, rollout_is_weights=None, *, entropy=None, old_entropy=None):
        if rollout_is_weights is not None:
            raise NotImplementedError(f"{name}: rollout-correction weights are not supported by the Klear losses; "
                                      "turn algorithm.rollout_correction off")
        cfg = klear_config(config, erc=erc)
        if entropy is None and old_entropy is None:
            entropy, old_entropy = _ENTROPIES.get()
        if cfg.erc_enabled and (entropy is None or old_entropy is None):
            raise ValueError(f"{name}: ERC needs the current and the rollout policy's per-token entropies, and "
                             "none reached the loss: set actor_rollout_ref.actor.calculate_entropy=True and load "
                             "klear_lib.integrations.verl through VERL_USE_EXTERNAL_MODULES in every process (its "
                             "hook carries them)")
        mask = response_mask.bool()
        loss, metrics = fn(old_log_prob, log_prob, advantages, mask, loss_agg_mode, cfg,
                           entropy=entropy, old_entropy=old_entropy)
        info = dict(_get(config, "global_batch_info", {}) or {})
        factor = _rescale(mask, loss_agg_mode, info)
        # verl's names for the clip statistics (its dashboards read these) next to ours
        metrics = {**metrics, "actor/pg_clipfrac": metrics["actor/pg_clipfrac_low"] + metrics["actor/pg_clipfrac_high"],
                   "actor/pg_clipfrac_lower": metrics["actor/pg_clipfrac_dual"]}
        return loss * factor, metrics

    verl_policy_loss.__name__ = f"klear_{name}"
    verl_policy_loss.__doc__ = f"verl adapter of klear_lib.losses.{fn.__name__} (ERC {'on' if erc else 'off'})."
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
# The entropy hook
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


def hooked_ppo_loss(original):
    """``ppo_loss`` that makes the entropies visible to the Klear losses for the duration of the call."""
    if getattr(original, "_klear_hooked", False):
        return original

    @functools.wraps(original)
    def ppo_loss(config, model_output, data, dp_group=None):
        mode = _get(_get(config, "policy_loss", {}), "loss_mode", "vanilla")
        if mode not in LOSSES:
            return original(config, model_output, data, dp_group)
        from verl.workers.utils.padding import no_padding_2_padding

        entropy = model_output.get("entropy", None)
        if entropy is not None:
            entropy = no_padding_2_padding(entropy, data)  # (B, T), as ppo_loss does for log-probs
        old_entropy = None
        if "old_entropys" in data.keys():
            old_entropy = data.select("old_entropys").to_padded_tensor()["old_entropys"]  # (B, T)
        token = _ENTROPIES.set((entropy, old_entropy))
        try:
            return original(config, model_output, data, dp_group)
        finally:
            _ENTROPIES.reset(token)

    ppo_loss._klear_hooked = True
    return ppo_loss


def _patch_losses_module(module) -> None:
    if hasattr(module, "ppo_loss"):
        module.ppo_loss = hooked_ppo_loss(module.ppo_loss)


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


def install_entropy_hook() -> None:
    """Install both patches of the module docstring (now for loaded modules, on import for the others)."""
    _when_imported("verl.workers.utils.losses", _patch_losses_module)
    _when_imported("verl.workers.engine_workers", _patch_losses_module)
    _when_imported("verl.trainer.distillation.losses", _patch_losses_module)
    _when_imported("verl.trainer.ppo.ray_trainer", _patch_compute_old_log_prob)


def _load() -> None:
    import verl

    version = getattr(verl, "__version__", "unknown")
    if version != VERIFIED_VERL:
        warnings.warn(f"klear_lib.integrations.verl was written against verl {VERIFIED_VERL}; this is verl "
                      f"{version}: run tests/test_verl.py before trusting ERC runs", stacklevel=2)
    register()
    install_entropy_hook()


if importlib.util.find_spec("verl") is not None:
    _load()
