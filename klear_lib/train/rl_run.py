"""One RL run on the tiny arithmetic task (or a hub model at the gpu preset), as the notebooks' units run it:
``run_rl`` builds ``KlearGRPOTrainer`` from an ``RLExperimentConfig``, records every optimizer step and every rollout
boundary (``MetricsCallback``, ``RolloutRecorder``: the held-out evaluation and the exact probes), and resumes from its
last checkpoint; ``correctness_reward`` is the task's reward."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import typing
from functools import partial

from datasets import Dataset
from transformers import PrinterCallback, TrainerCallback
from trl import GRPOConfig

from klear_lib.config import checkpointing
from klear_lib.data.tasks import exact_answer_reward, fork_token_mask, parse_fork_facts, prompt_messages
from klear_lib.evaluation.heldout import arithmetic_probes, evaluate_heldout
from klear_lib.train.rl import KlearGRPOTrainer
from klear_lib.train.tracking import add_hparams, tracking_env
from klear_lib.train.tracking import names as tracker_names


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
    ``eval_start`` is False) and at the end (unless ``eval_final`` is False). ``history`` keeps the records that
    hold an evaluation."""

    def __init__(self, writer, tags: dict, *, evaluate, eval_every: int, probe=None, progress=print,
                 eval_start: bool = True, eval_final: bool = True):
        self.writer, self.tags, self.evaluate, self.every, self.probe = writer, tags, evaluate, eval_every, probe
        self.progress, self.eval_start, self.eval_final = progress, eval_start, eval_final
        self.history: list[dict] = []
        self.clock = Stopwatch()

    def __call__(self, trainer: KlearGRPOTrainer, record: dict) -> None:
        rec = {**self.tags, **record}
        if self.probe is not None:
            rec.update({f"klear/{k}": v for k, v in self.probe(trainer.model).items()})
        due = record["rollout"] % self.every == 0 and (record["rollout"] > 0 or self.eval_start)
        if due or (record["final"] and self.eval_final):
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


def correctness_reward(completions, answer, format_rule: str = "released", **kwargs) -> list[float]:
    """TRL reward function: 1.0 for the right boxed answer after ``</think>`` (anywhere under ``format_rule="none"``),
    else 0.0 (tiny task). The reasons of the last batch are kept in ``correctness_reward.last_results``."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    judged = [exact_answer_reward(t, a, format_rule) for t, a in zip(texts, answer)]
    correctness_reward.last_results = [_Judged(score, reason) for score, reason in judged]
    return [score for score, _ in judged]


class _Judged(typing.NamedTuple):
    score: float
    reason: str


correctness_reward.reward_range = (0.0, 1.0)  # KlearGRPOTrainer checks the Klear filter can be met before training
correctness_reward.last_results = []


def task_reward(format_rule: str):
    """``correctness_reward`` judged under ``format_rule`` (the run config's), named as TRL logs it; its
    ``last_results`` and ``format_rule`` are what ``KlearGRPOTrainer`` names when a run makes no step."""
    if format_rule == "released":
        return correctness_reward

    def reward(completions, answer, **kwargs) -> list[float]:
        scores = correctness_reward(completions, answer, format_rule=format_rule)
        reward.last_results = correctness_reward.last_results
        return scores

    reward.__name__ = reward.__qualname__ = "correctness_reward"
    reward.reward_range, reward.format_rule, reward.last_results = correctness_reward.reward_range, format_rule, []
    return reward


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
            format_rule=getattr(cfg, "format_rule", "released"),
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
                               eval_final=getattr(cfg, "eval_final", True), progress=progress)
    # the trackers read their folders and names when the trainer is built
    tracking.enter_context(tracking_env(tracking_dir if report_to != "none" else None))
    trainer = KlearGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs or [task_reward(getattr(cfg, "format_rule", "released"))],
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
