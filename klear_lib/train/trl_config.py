"""TRL's GRPO settings read into klear's recipe, so that none is silently ignored: ``klear_from_trl`` honours TRL's
``loss_type``, ``epsilon``/``epsilon_high`` and ``importance_sampling_level`` through klear's loss registry and refuses
what klear has no counterpart for, naming the klear field to set; ``reward_total_range`` is what the reward
functions' declared ranges allow (``KlearGRPOTrainer`` refuses a Klear group filter they can never meet)."""

from __future__ import annotations

import dataclasses

from trl import GRPOConfig

from klear_lib.losses import POLICY_LOSSES, PolicyLossConfig
from klear_lib.recipe import KlearLossConfig

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
