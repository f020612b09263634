"""RL on TRL: ``KlearGRPOTrainer``, TRL's ``GRPOTrainer`` with Klear's policy loss and data rules.

How it departs from TRL's GRPOTrainer (and so from GRPO as TRL implements it):

1. The policy loss is ``klear_lib.losses`` (any registered name: ``ppo_clip``/DAPO, ``cispo``, ``gspo``, ``gppo``),
   ERC included, instead of the if/elif inside ``GRPOTrainer._compute_loss``. TRL's ``loss_type``,
   ``epsilon`` and ``epsilon_high`` are ignored.
2. The rollout policy's per-token entropies are kept from the old-log-prob pass (TRL discards them) and handed
   to the loss as ``old_entropy`` for ERC. Log-probs and entropies come from ``klear_lib.logprobs`` on the
   backbone's hidden states (``KlearLossConfig.logprob_backend="klear"``) or from TRL's fused LM head ("trl").
3. Advantages are recomputed from the raw rewards with ``klear_lib.advantages.grpo_advantages`` (Klear: the
   unbiased std and ε = 1e-6; TRL: ε = 1e-4), and Klear's zero-advantage group filter removes whole groups
   from the loss (their tokens leave the token-mean denominator; the batch is not refilled, as in Klear).
4. The positive-sample SFT term ``α · NLL`` over fully-correct responses is added (reference section 2).
5. Several optimizer steps per rollout batch come from TRL's own ``steps_per_generation`` (one rollout batch
   of ``rollout_prompts`` prompts, split into mini-batches of ``mini_batch_prompts``): from the second
   mini-batch on, the ratio differs from 1, which is what every clip variant acts on (reference section 1,
   "on-policy steps hide GPPO").

With vLLM rollouts, the old log-probs and entropies come from the training model's scoring pass (as in verl);
TRL's vLLM importance-sampling correction is not applied and must be off.

TRL internals overridden (pinned to ``TRL_VERSION``; ``tests/test_trl_contract.py`` fails when they move):
``_generate_and_score_completions``, ``_calculate_rewards``, ``_get_per_token_logps_and_entropies``,
``_compute_loss``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from functools import partial

import torch
import trl
from datasets import Dataset
from transformers import PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from klear_lib.data.tasks import exact_answer_reward, prompt_messages
from klear_lib.evaluation.heldout import evaluate_heldout

from klear_lib.advantages import grpo_advantages, zero_advantage_group_mask
from klear_lib.logprobs import IGNORE_INDEX, token_logprobs_and_entropy
from klear_lib.losses import (POLICY_LOSSES, PolicyLossConfig, compute_policy_loss, entropy_diagnostics,
                              positive_sample_loss)

TRL_VERSION = "1.16.0"  # the TRL release whose internals this trainer overrides


@dataclass
class KlearLossConfig:
    """What the Klear recipe adds to a GRPO step (reference sections 1-3)."""

    loss_name: str = "gppo"
    """A name in ``klear_lib.losses.POLICY_LOSSES``."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Clip range, dual-clip, GPPO β and ERC bounds."""
    loss_agg_mode: str = "token-mean"
    """Loss normalisation (Klear: token-mean)."""
    adv_std: str = "unbiased"
    """GRPO std: ``unbiased`` (Klear's code, N-1), ``population`` (the paper, N) or ``none`` (Dr. GRPO)."""
    adv_eps: float = 1e-6
    """ε in (R - mean) / (std + ε)."""
    filter_groups: bool = True
    """Drop groups whose fully-correct indicator has zero std (Klear's zero-advantage filter)."""
    filter_rule: str = "klear"
    """``klear`` (std of the fully-correct indicator > 0) or ``dapo`` (std of the rewards > 0)."""
    max_reward: float = 1.0
    """The reward of a fully-correct response (for the filter and the positive-sample term)."""
    sft_alpha: float = 0.1
    """α of the positive-sample NLL term (Klear: 0.1; 0 turns it off)."""
    logprob_backend: str = "klear"
    """Where per-token log-probs and entropies come from: ``klear`` (``klear_lib.logprobs``: chunked over tokens,
    the LM head's logits recomputed in backward; text-only models without logit scaling) or ``trl`` (TRL 1.16's
    fused LM head). Both avoid (B, T, V) logits; tests check they agree to 1e-5."""

    def __post_init__(self) -> None:
        if self.logprob_backend not in ("klear", "trl"):
            raise ValueError(f"logprob_backend must be 'klear' or 'trl', got {self.logprob_backend!r}")
        if self.loss_name not in POLICY_LOSSES:
            raise ValueError(f"loss_name {self.loss_name!r} is not registered; registered: {sorted(POLICY_LOSSES)}")
        if self.filter_rule not in ("klear", "dapo"):
            raise ValueError(f"filter_rule must be 'klear' or 'dapo', got {self.filter_rule!r}")
        if self.sft_alpha < 0:
            raise ValueError(f"sft_alpha must be >= 0, got {self.sft_alpha}")


def klear_token_stats(model, input_ids, attention_mask, logits_to_keep, *, temperature=1.0, batch_size=None,
                      autocast=contextlib.nullcontext):
    """Per-token log-probs and entropies of the last ``logits_to_keep`` tokens, as TRL's pass returns them
    ``(logps, entropies, None)``, each (B, logits_to_keep), from the backbone's last hidden states and the LM-head
    weight through ``klear_lib.logprobs.token_logprobs_and_entropy`` (chunked; no (B, T, V) logits, in forward
    or backward). Positions with ``attention_mask == 0`` get 0. Models whose logits are scaled or soft-capped
    after the LM head are refused (their logits are not ``hidden @ W.T``)."""
    unwrapped = model.module if hasattr(model, "module") and not hasattr(model, "get_output_embeddings") else model
    cfg = unwrapped.config.get_text_config() if hasattr(unwrapped.config, "get_text_config") else unwrapped.config
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier"):
        if getattr(cfg, attr, None) not in (None, 1, 1.0):
            raise ValueError(f"logprob_backend='klear' needs logits = hidden @ W.T; {type(unwrapped).__name__} sets "
                             f"{attr}={getattr(cfg, attr)!r}: use logprob_backend='trl'")
    head = unwrapped.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("logprob_backend='klear' needs an LM head without bias: use logprob_backend='trl'")
    backbone = getattr(unwrapped, unwrapped.base_model_prefix)
    batch_size = batch_size or input_ids.size(0)
    all_logps, all_ent = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
        with autocast():
            hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state  # (b, T, H)
        # the hidden state at position t predicts token t + 1: keep the logits_to_keep positions before each
        # scored token
        h = hidden[:, -logits_to_keep - 1:-1]
        labels = ids[:, -logits_to_keep:].masked_fill(mask[:, -logits_to_keep:] == 0, IGNORE_INDEX)
        logps, ent = token_logprobs_and_entropy(h, head.weight, labels, temperature=temperature)
        all_logps.append(logps)
        all_ent.append(ent)
    return torch.cat(all_logps), torch.cat(all_ent), None


class KlearGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with Klear's loss family, ERC entropies, group filter and positive-sample term."""

    def __init__(self, *args, klear: KlearLossConfig | None = None, **kwargs):
        if trl.__version__ != TRL_VERSION:
            warnings.warn(
                f"KlearGRPOTrainer overrides TRL {TRL_VERSION} internals; TRL {trl.__version__} is installed. "
                "Run tests/test_trl_contract.py before trusting its numbers.",
                stacklevel=2,
            )
        super().__init__(*args, **kwargs)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            raise ValueError(
                "KlearGRPOTrainer does not apply TRL's vLLM importance-sampling correction (Klear has none; the old "
                "log-probs are the training model's, as in verl): set GRPOConfig.vllm_importance_sampling_correction=False"
            )
        self.klear = klear or KlearLossConfig()
        if self.beta != 0.0:
            raise ValueError(f"Klear uses no KL term: GRPOConfig.beta must be 0.0, got {self.beta}")
        self._capture_old_entropy = False
        self._captured_old_entropy: torch.Tensor | None = None
        self._last_rewards: torch.Tensor | None = None

    # -- rollout: keep the entropies and the raw rewards that TRL throws away --------------------------------
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *a, **kw):
        if self._capture_old_entropy:  # the old-log-prob pass inside _generate_and_score_completions
            kw["compute_entropy"] = True
            logps, entropies, aux = self._logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *a, **kw)
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
        self._last_rewards = rewards_per_func  # (N_all, n_funcs), gathered over processes
        return rewards_per_func

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
        if self._captured_old_entropy is not None:
            out["old_entropy"] = self._captured_old_entropy
        self._metrics[mode]["klear/kept_group_frac"].append(keep.float().mean().item())
        self._metrics[mode]["klear/fully_correct_frac"].append((rewards == k.max_reward).float().mean().item())
        return out

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
        keep = inputs["klear_keep"]  # (B,)
        mask = completion_mask * keep.unsqueeze(1)  # (B, T): filtered groups leave the loss and its denominator
        # Without a separate old-log-prob pass (one update per rollout) the policy is on-policy: r == 1.
        old_log_prob = inputs.get("old_per_token_logps")
        old_log_prob = log_prob.detach() if old_log_prob is None else old_log_prob
        old_entropy = inputs.get("old_entropy")
        old_entropy = entropy.detach() if old_entropy is None else old_entropy
        k = self.klear
        loss, metrics = compute_policy_loss(
            k.loss_name,
            old_log_prob=old_log_prob,
            log_prob=log_prob,
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
        if k.sft_alpha > 0:
            loss = loss + k.sft_alpha * pos
        self._metrics[mode]["actor/positive_loss"].append(pos.item())
        self._metrics[mode]["klear/positive_frac"].append(inputs["klear_positive"].float().mean().item())
        pl = k.policy_loss
        metrics.update(entropy_diagnostics(entropy, old_entropy, mask, erc_low=pl.erc_low, erc_high=pl.erc_high))
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)
        denom = mask.sum().clamp(min=1.0)
        self._metrics[mode]["entropy"].append(((entropy.detach() * mask).sum() / denom).item())
        self._metrics[mode]["old_entropy"].append(((old_entropy * mask).sum() / denom).item())
        self._metrics[mode]["actor/response_tokens"].append(mask.sum().item())
        if mode == "train":  # HF's own loss scaling is off in GRPOTrainer: scale for gradient accumulation
            loss = loss / self.current_gradient_accumulation_steps
        return loss


class Stopwatch:
    """Wall-clock seconds since construction (for progress lines)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


# -- one RL run end to end ------------------------------------------------------------------------------------
class MetricsCallback(TrainerCallback):
    """Writes every log line of the trainer (one per optimizer step) to the run's ``metrics.jsonl``.

    Each record carries ``step`` (optimizer step), ``rollout`` (rollout batch, from 1) and the metrics TRL
    averaged over the step (``actor/*`` from klear_lib.losses, ``reward``, ``entropy``, ``grad_norm`` ...).
    """

    def __init__(self, writer, updates_per_rollout: int, tags: dict):
        self.writer, self.upr, self.tags = writer, updates_per_rollout, tags

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "train_runtime" not in logs:  # the final summary line is not a step
            step = state.global_step
            self.writer.write({**self.tags, "step": step, "rollout": (step - 1) // self.upr + 1, **logs})


class HeldoutEvalCallback(TrainerCallback):
    """Held-out avg@n before RL (step 0) and every ``every_steps`` optimizer steps, written as ``eval/*``."""

    def __init__(self, evaluate, writer, every_steps: int, tags: dict, progress=print):
        self.evaluate, self.writer, self.every, self.tags, self.progress = evaluate, writer, every_steps, tags, progress
        self.history: list[dict] = []
        self.clock = Stopwatch()

    def _run(self, model, step: int) -> None:
        res = self.evaluate(model)  # {"avg_at_n": float, "n": int, other floats, "by_level": {level: float}}
        rec = {**self.tags, "step": step}
        rec.update({f"eval/{k}": v for k, v in res.items() if isinstance(v, float)})
        rec.update({f"eval/avg_at_n_level{lvl}": v for lvl, v in res.get("by_level", {}).items()})
        self.writer.write(rec)
        self.history.append(rec)
        tags = " ".join(f"{k}={v}" for k, v in self.tags.items())
        self.progress(f"  [{self.clock():6.1f}s] {tags} step {step:3d}: held-out avg@{res['n']} = {res['avg_at_n']:.3f}")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._run(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self._run(model, state.global_step)


def correctness_reward(completions, answer, **kwargs) -> list[float]:
    """TRL reward function: 1.0 for the right boxed answer after ``</think>``, else 0.0 (tiny task)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [exact_answer_reward(t, a)[0] for t, a in zip(texts, answer)]


def run_rl(cfg, model, tokenizer, train_problems, heldout, writer, *, tags=None, output_dir=None, progress=print,
           rows=None, reward_funcs=None, evaluate=None, save_dir=None):
    """RL from ``model`` (the SFT start) with ``cfg`` (an ``RLExperimentConfig``); returns (model, eval history).

    The task is the tiny arithmetic one unless the caller passes its own: ``rows`` (dataset rows with a
    ``prompt`` and the columns its reward functions read), ``reward_funcs`` (TRL reward functions) and
    ``evaluate`` (model -> ``{"avg_at_n": float, "n": int, ...}``). Metrics go to ``writer`` (a
    ``runs.MetricsWriter``), one record per optimizer step and per evaluation. The caller sets the seed
    (``runs.set_seed``) before building the model. ``save_dir``: save the final model there through the trainer
    (every process calls it, as sharded ZeRO-3/FSDP weights need).
    """
    tags = dict(tags or {})
    if rows is None:
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
        )
    dataset = Dataset.from_list(rows)
    upr = cfg.updates_per_rollout
    args = GRPOConfig(
        output_dir=str(output_dir or tempfile.mkdtemp(prefix="klear-rl-")),
        per_device_train_batch_size=_per_device(cfg.mini_batch_prompts * cfg.num_generations),  # completions per update
        steps_per_generation=upr,  # one rollout batch feeds `upr` optimizer steps
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
        max_steps=cfg.max_steps,
        beta=0.0,
        epsilon=cfg.clip_low,  # unused by our loss; set so TRL's own logs agree
        epsilon_high=cfg.clip_high,
        use_vllm=cfg.use_vllm,
        vllm_mode=cfg.vllm_mode,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        gradient_checkpointing=cfg.gradient_checkpointing,
        vllm_importance_sampling_correction=False,  # see KlearGRPOTrainer.__init__
        use_cpu=cfg.use_cpu,
        bf16=cfg.bf16,
        seed=cfg.seed,
        data_seed=cfg.seed,
        logging_steps=1,
        save_strategy="steps" if cfg.save_steps else "no",
        save_steps=cfg.save_steps or 500,
        report_to="none",
        disable_tqdm=True,
    )
    eval_cb = HeldoutEvalCallback(lambda m: evaluate(m), writer, cfg.eval_every * upr, tags, progress)
    trainer = KlearGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs or [correctness_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        klear=cfg.klear_loss,
        callbacks=[MetricsCallback(writer, upr, tags), eval_cb],
    )
    trainer.remove_callback(PrinterCallback)  # one progress line per evaluation instead of a dict per step
    trainer.train(resume_from_checkpoint=_last_checkpoint(args.output_dir) if cfg.save_steps else None)
    if save_dir is not None:
        trainer.save_model(str(save_dir))
        if trainer.accelerator.is_main_process:
            tokenizer.save_pretrained(str(save_dir))
    return trainer.model, eval_cb.history


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
