"""Typed, strict run configs. A notebook's flat parameters become one of these in the cell after them.

Unknown keys are errors that list the valid ones; types are checked; derived values are properties, never
parameters (papermill injects overrides after the ``parameters`` cell, so a value derived there goes stale).
Defaults are the ``tiny`` CPU preset; the ``gpu``/``paper`` presets change only scale keys.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
import types
import typing
from dataclasses import dataclass, fields

from klear_lib.data.tasks import DEFAULT_FORK_FACTS, FORMAT_RULES, LEVELS, parse_fork_facts
from klear_lib.losses import PolicyLossConfig
from klear_lib.recipe import KlearLossConfig


def checkpointing(cfg) -> bool:
    """Whether a run with ``cfg`` (any config with ``use_cpu`` and ``gradient_checkpointing``) recomputes activations
    in the backward pass: as set, or, for ``None``, on a GPU and not with ``use_cpu``. On a CPU memory does not limit
    the tiny runs, and recomputing costs about a quarter of an SFT step (60 steps of 05's warm start: 22.5 s against
    16.7 s on one thread) for weights that came out identical."""
    if cfg.gradient_checkpointing is None:
        return not cfg.use_cpu
    return bool(cfg.gradient_checkpointing)


def from_dict(cls, d: typing.Mapping, *, where: str | None = None):
    """Build dataclass ``cls`` from a flat mapping, strictly: unknown keys and wrong types are errors."""
    where = where or cls.__name__
    valid = {f.name: f for f in fields(cls)}
    unknown = sorted(set(d) - set(valid))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(valid)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in d.items():
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
    return cls(**kwargs)


def _coerce(value, hint, where: str):
    """Accept ``value`` for type ``hint`` (int for float allowed, None for Optional); else a clear error."""
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in options:
        return None
    for opt in options:
        if opt is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # inf passes every range check below; NaN fails none of them
                raise ValueError(f"{where} must be a finite number, got {value!r}")
            return float(value)
        if opt in (int, str, bool) and type(value) is opt:
            return value
    names = " | ".join(getattr(o, "__name__", str(o)) for o in options)
    raise TypeError(f"{where} must be {names}, got {value!r} ({type(value).__name__})")


TRACKERS = ("none", "tensorboard", "trackio", "wandb")
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb"}


def check_tracker(report_to: str, where: str = "report_to") -> None:
    """ValueError unless ``report_to`` is ``none`` or a tracker whose package is installed."""
    package = TRACKER_PACKAGES.get(report_to)
    if package is not None and importlib.util.find_spec(package) is None:
        raise ValueError(f"{where} = {report_to!r}: {package} is not installed in this environment "
                         f"({sys.executable}); `pip install {package}`, or report_to='none'")


def _same_named(cfg, cls, *, skip=()) -> dict:
    """The values of ``cfg``'s fields that ``cls`` has under the same name (``skip`` left out)."""
    own = {f.name for f in fields(cfg)}
    return {f.name: getattr(cfg, f.name) for f in fields(cls) if f.name in own and f.name not in skip}


def _check_ranges(cfg, *, positive=(), unit=(), non_negative=()) -> None:
    """Raise ValueError naming the first field out of its range: ``positive`` (> 0), ``unit`` (in [0, 1]),
    ``non_negative`` (>= 0)."""
    name = type(cfg).__name__
    for key in positive:
        if not getattr(cfg, key) > 0:
            raise ValueError(f"{name}.{key} must be > 0, got {getattr(cfg, key)!r}")
    for key in unit:
        if not 0 <= getattr(cfg, key) <= 1:
            raise ValueError(f"{name}.{key} must be in [0, 1], got {getattr(cfg, key)!r}")
    for key in non_negative:
        if not getattr(cfg, key) >= 0:
            raise ValueError(f"{name}.{key} must be >= 0, got {getattr(cfg, key)!r}")


@dataclass
class TaskModelConfig:
    """What every experiment on the tiny tasks shares: seeds, the fixed splits, the model. The experiment
    configs below extend it; strict construction and diffs (``from_params``, ``replace``) live here."""

    seed: int = 0
    """The one seed of the run: data order, sampling and initialisation (set through ``runs.set_seed``)."""
    data_seed: int = 1234
    """Seed of the fixed train / held-out splits (the same for every run seed, so runs compare)."""
    n_train: int = 6000
    """Training problems."""
    n_heldout: int = 128
    """Held-out problems for avg@n."""
    levels: str = "1,2,3,4"
    """Difficulty levels drawn uniformly, comma-separated (klear_lib.data.tasks.LEVELS)."""
    model: str = "tiny"
    """``tiny`` (a ≈1M-parameter Qwen3 built here) or a hub name / local folder of a causal LM."""
    tiny_hidden: int = 128
    """Hidden size of the tiny model."""
    tiny_layers: int = 4
    """Layers of the tiny model."""
    vocab_size: int = 1024
    """Upper bound of the tiny tokenizer's BPE vocabulary (the task's text needs only a few hundred)."""
    report_to: str = "none"
    """Experiment tracker for TRL's trainers: ``none``, ``tensorboard``, ``trackio`` or ``wandb`` (the package must
    be installed). Its files go to ``<run dir>/tracking/<unit>``; ``metrics.jsonl`` is written either way."""

    def __post_init__(self) -> None:
        if self.report_to not in TRACKERS:
            raise ValueError(f"{type(self).__name__}.report_to must be one of {list(TRACKERS)}, got {self.report_to!r}")
        check_tracker(self.report_to, f"{type(self).__name__}.report_to")  # installed, or refused before any work
        _check_ranges(self, positive=("n_train", "n_heldout", "tiny_hidden", "tiny_layers", "vocab_size"),
                      non_negative=("seed", "data_seed"))
        self.level_list  # a malformed level list is an error here, naming it

    @property
    def level_list(self) -> tuple[int, ...]:
        try:
            out = tuple(int(x) for x in self.levels.split(","))
        except ValueError:
            out = ()
        if not out or any(x not in LEVELS for x in out) or len(set(out)) != len(out):
            raise ValueError(f"{type(self).__name__}.levels = {self.levels!r}: expected distinct levels from "
                             f"{sorted(LEVELS)}, comma-separated, e.g. '1,2'")
        return out

    @classmethod
    def from_params(cls, params: typing.Mapping):
        return from_dict(cls, params)

    def replace(self, **changes):
        """A copy with ``changes`` (an ablation is a diff), checked as strictly as ``from_params``."""
        return from_dict(type(self), {**dataclasses.asdict(self), **changes})


# A ceiling on rollouts a run, so that a typo (1000000000) fails before any work instead of showing an ETA of
# centuries: Klear-Reasoner's RL runs are hundreds of steps, 100x below it. TINY_ROLLOUT_CPU_S is what one rollout
# of notebook 03's tiny unit costs (16 CPU-s for 3 rollouts of 16 updates, docs/results.md), for the message's ETA.
MAX_ROLLOUTS = 10_000
TINY_ROLLOUT_CPU_S = 5.0


@dataclass
class RLExperimentConfig(TaskModelConfig):
    """One RL run on the tiny arithmetic task (or a hub model at the gpu preset): data, SFT, RL, evaluation."""

    # -- SFT warm start -----------------------------------------------------------------------------------------
    sft_lr: float = 2e-3
    """Peak SFT learning rate (cosine decay). 5e-3 stalls the tiny model on a plateau before it learns to copy."""
    sft_epochs: float = 2.0
    """Passes over the SFT samples."""
    sft_batch_size: int = 32
    """SFT samples per optimizer step."""
    sft_error_rate: float = 0.0
    """I.i.d. per-step error rate of the synthetic SFT teacher (0: errors only on the fork facts). I.i.d. errors
    leave the student's most likely digit right everywhere, so RL evaluated at T 0.6 has nothing to build."""
    fork_facts: str = DEFAULT_FORK_FACTS
    """The facts the SFT teacher gets systematically wrong, ``VALUE+ADDEND->WRONG`` comma-separated (``tasks.ForkFact``;
    empty: none). After SFT the student's mode on them is wrong: RL must move it."""
    fork_wrong_rate: float = 0.8
    """How often the SFT teacher writes a fork fact's wrong result (the student starts near p(right) = 1 - this)."""
    # -- RL (reference section 4 for Klear's values) ------------------------------------------------------------
    loss_name: str = "gppo"
    """Policy loss, a name in klear_lib.losses.POLICY_LOSSES."""
    clip_ratio_low: float = 0.2
    """ε_l (Klear 0.2)."""
    clip_ratio_high: float = 0.28
    """ε_h (Klear 0.28; ε_h > ε_l is DAPO's clip-higher)."""
    clip_ratio_c: float | None = 10.0
    """Dual-clip constant for negative advantages (Klear 10); None turns it off."""
    beta_low: float = 1.0
    """GPPO β_l (paper 1; CE-GPPO 0.5 / 0.75)."""
    beta_high: float = 1.0
    """GPPO β_h (paper 1)."""
    erc_low: float | None = None
    """ERC lower bound on H/H_old; ERC is on when both bounds are set."""
    erc_high: float | None = None
    """ERC upper bound."""
    loss_agg_mode: str = "token-mean"
    """Loss normalisation (Klear: token-mean)."""
    sft_alpha: float = 0.1
    """α of the positive-sample NLL term (Klear 0.1)."""
    adv_std: str = "unbiased"
    """GRPO std: unbiased (Klear's code) / population (the paper) / none."""
    filter_groups: bool = True
    """Dynamic sampling: train only on the groups that pass the filter (Klear's and DAPO's dynamic sampling)."""
    filter_rule: str = "klear"
    """``klear``: keep a group if its fully-correct indicator varies; ``dapo``: if its rewards vary."""
    oversample_factor: float = 2.0
    """Prompts generated per rollout as a multiple of ``rollout_prompts`` (Klear: 256 generated for 128 kept)."""
    max_gen_batches: int = 1
    """Generation batches a rollout may draw until it keeps ``rollout_prompts`` groups (DAPO's
    ``max_num_gen_batches``); a rollout that keeps fewer makes fewer optimizer steps."""
    random_stop_frac: float = 0.0
    """The ERC control (notebook 04): each response token loses its policy gradient with this probability."""
    random_stop_classes: str = ""
    """The ERC control matched per token class (notebook 04): ``"low/fork:0.02,mid/rest:0.05,..."``, a stop
    probability per rollout-entropy bucket and fork/rest (``KlearLossConfig.random_stop_classes``)."""
    rollouts: int = 10
    """Rollouts (generation rounds), 1 to ``MAX_ROLLOUTS``. Each makes up to rollout_prompts / mini_batch_prompts
    optimizer steps: one per packed mini-batch of kept groups."""
    rollout_prompts: int = 32
    """Prompts trained on per rollout, at most (Klear 128): the kept groups are capped here."""
    mini_batch_prompts: int = 4
    """Prompts (whole groups) per optimizer step (Klear 16 math / 32 code): up to rollout_prompts /
    mini_batch_prompts updates per rollout, all but the first off-policy."""
    num_generations: int = 8
    """Responses per prompt (Klear 8)."""
    max_completion_length: int = 56
    """Longest response in tokens (Klear 32K). The tiny task's longest teacher answer (level 4) is 50 tokens."""
    rl_lr: float = 5e-5
    """RL learning rate, constant after warm-up (Klear 1e-6 math). On the tiny model 1e-3 destroys the SFT
    start within 8 steps, 1e-4 is noisy, 2e-5 to 5e-5 learns steadily."""
    warmup_steps: int = 2
    """Linear warm-up optimizer steps (Klear 10)."""
    weight_decay: float = 0.1
    """AdamW weight decay (Klear 0.1)."""
    max_grad_norm: float = 1.0
    """Gradient clipping (Klear 1.0)."""
    temperature: float = 1.0
    """Rollout sampling temperature (Klear 1.0)."""
    top_p: float = 1.0
    """Rollout top-p (Klear 1.0)."""
    use_vllm: bool = False
    """Generate rollouts with vLLM (GPU presets)."""
    vllm_mode: str = "colocate"
    """TRL's vLLM mode: ``colocate`` (vLLM inside the training process, one GPU) or ``server`` (a separate
    ``trl vllm-serve`` process; multi-GPU runs, docs/scale.md)."""
    vllm_gpu_memory_utilization: float = 0.3
    """Share of GPU memory vLLM may take in colocate mode (TRL's default)."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in the backward pass (long responses need it on GPUs). ``None``: on a GPU (TRL's
    default), off with ``use_cpu`` (``checkpointing``), for SFT and RL alike."""
    save_steps: int = 0
    """Save a checkpoint every this many optimizer steps (0: none; long GPU runs)."""
    use_cpu: bool = True
    """Train on the CPU even where a GPU is present."""
    bf16: bool = False
    """bf16 autocast for SFT and RL (GPU presets). TRL defaults it on, even on a CPU, where it is slower than
    fp32 and rounds log-probs (and so importance ratios) by ~1e-3."""
    # -- evaluation (reference section 7) ------------------------------------------------------------------------
    eval_every: int = 2
    """Evaluate held-out avg@n every this many rollout batches (and before RL, unless ``eval_start`` is off)."""
    eval_start: bool = True
    """Evaluate before the first rollout. Off where every arm starts from one shared model whose evaluation the
    notebook already has (the warm start's): the same numbers would be sampled again in every unit."""
    eval_final: bool = True
    """Evaluate after the last rollout, also where it is no ``eval_every`` boundary. 06 turns it off, with
    ``eval_every`` past the last rollout, so that none runs: an evaluation no claim reads costs unit time for
    nothing (issue 46)."""
    eval_n: int = 4
    """Samples per held-out problem (paper: 64 for AIME)."""
    eval_temperature: float = 0.6
    """Evaluation temperature (paper 0.6). With the fork facts the tiny SFT model's mode is wrong on them, so
    sampling at 0.6 does not hide what RL has to build (it did with i.i.d. teacher noise alone)."""
    eval_top_p: float = 0.95
    """Evaluation top-p (paper 0.95)."""
    # -- the judge's format (training and evaluation alike) --------------------------------------------------------
    format_rule: str = "released"
    """How the judge treats Klear's ``<think>...</think>`` format, in the training reward and the held-out evaluation
    alike (``klear_lib.data.tasks.FORMAT_RULES``): ``released`` (Klear's released code: without ``</think>`` −0.5,
    without ``<think>`` −2.0; the answer read after ``</think>``), ``paper`` (a format failure is a wrong answer) or
    ``none`` (no format check: the answer is read from the whole response, for a model without a think format such
    as an instruct model before a format SFT). The tiny task's exact-match reward has no penalties: under
    ``released`` and ``paper`` it scores 0 without ``</think>``, under ``none`` it reads the last boxed answer."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.format_rule not in FORMAT_RULES:
            raise ValueError(f"RLExperimentConfig.format_rule must be one of {list(FORMAT_RULES)}, got "
                             f"{self.format_rule!r}")
        _check_ranges(self, positive=("sft_lr", "rl_lr", "sft_epochs", "sft_batch_size", "rollouts", "rollout_prompts",
                                      "mini_batch_prompts", "max_completion_length", "eval_every", "eval_n",
                                      "temperature", "n_train", "n_heldout"),
                      unit=("sft_error_rate", "fork_wrong_rate", "top_p", "eval_top_p"),
                      non_negative=("warmup_steps", "weight_decay", "max_grad_norm", "eval_temperature", "save_steps"))
        if self.rollouts > MAX_ROLLOUTS:
            hours = self.rollouts * TINY_ROLLOUT_CPU_S / 3600
            raise ValueError(f"RLExperimentConfig.rollouts = {self.rollouts}: at most {MAX_ROLLOUTS} a run (at the "
                             f"tiny preset's ~{TINY_ROLLOUT_CPU_S:g} CPU-s a rollout, ~{hours:,.0f} h a unit)")
        if self.num_generations < 2:
            raise ValueError(f"RLExperimentConfig.num_generations must be >= 2 (a group needs two responses to have "
                             f"an advantage), got {self.num_generations}")
        self.fork_fact_list  # a malformed fork fact is an error here, naming it
        if self.rollout_prompts % self.mini_batch_prompts:
            raise ValueError(
                f"rollout_prompts ({self.rollout_prompts}) must be a multiple of mini_batch_prompts "
                f"({self.mini_batch_prompts})"
            )
        if self.vllm_mode not in ("colocate", "server"):
            raise ValueError(f"vllm_mode must be 'colocate' or 'server', got {self.vllm_mode!r}")
        if not 0 < self.vllm_gpu_memory_utilization < 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1), got {self.vllm_gpu_memory_utilization!r}")
        self.klear_loss  # validates the loss name and the clip/ERC values early

    @property
    def fork_fact_list(self):
        return parse_fork_facts(self.fork_facts)

    @property
    def updates_per_rollout(self) -> int:
        """The most optimizer steps per rollout (fewer when fewer groups pass the filter)."""
        return self.rollout_prompts // self.mini_batch_prompts

    @property
    def max_steps(self) -> int:
        """The most optimizer steps the run can make (every rollout keeping ``rollout_prompts`` groups)."""
        return self.rollouts * self.updates_per_rollout

    @property
    def klear_loss(self) -> KlearLossConfig:
        """The recipe config: every field of ``KlearLossConfig`` and of its ``PolicyLossConfig`` that this config has
        under the same name (one name per knob: a new loss option is a field there and a field here)."""
        return KlearLossConfig(**_same_named(self, KlearLossConfig, skip={"policy_loss"}),
                               policy_loss=PolicyLossConfig(**_same_named(self, PolicyLossConfig)))


@dataclass
class SFTExperimentConfig(TaskModelConfig):
    """One SFT data ablation on the tiny arithmetic task (or a hub model at the gpu/paper presets): a fresh model
    per run, trained on a selected set of teacher responses, evaluated on held-out problems."""

    n_val: int = 64
    """Validation problems (source scores, difficulty of held-out problems); disjoint from the test problems."""
    sft_lr: float = 2e-3
    """Peak SFT learning rate (Klear 8e-5 cosine to 4e-5 on an 8B model)."""
    sft_epochs: float = 2.0
    """Passes over the selected samples (Klear 4)."""
    sft_batch_size: int = 8
    """Samples per optimizer step. The tiny model needs ~500 steps to learn the addition table: at 3,000 samples
    and 2 epochs, batch 8 learns it (≈99% on a clean teacher), batch 32 does not (≈13%)."""
    max_length: int = 256
    """Longest tokenized sample."""
    eval_n: int = 4
    """Samples per held-out problem (paper: 64 for AIME)."""
    eval_temperature: float = 1.0
    """Evaluation temperature (paper 0.6; see the notebooks for why the tiny preset uses 1.0)."""
    eval_top_p: float = 0.95
    """Evaluation top-p (paper 0.95)."""
    max_new_tokens: int = 128
    """Longest evaluated response (the verbose source's level-4 answer is ≈100 tokens)."""
    use_cpu: bool = True
    """Train on the CPU even where a GPU is present."""
    bf16: bool = False
    """bf16 autocast (GPU presets)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_ranges(self, positive=("n_val", "sft_lr", "sft_epochs", "sft_batch_size", "max_length", "eval_n",
                                      "max_new_tokens"),
                      unit=("eval_top_p",), non_negative=("eval_temperature",))

