"""The long-CoT SFT stage on TRL's ``SFTTrainer``: loss on the assistant's tokens only.

Samples are in TRL's conversational prompt-completion format (``prompt``: the user turn, ``completion``: the
assistant turn), so ``completion_only_loss`` masks the prompt tokens out of the loss. Resumable: when the
output directory holds a checkpoint and ``resume`` is set, training continues from the last one. Batches are TRL's
random ones, laid out packed (``SFTStageConfig.packed``, ``pack_batch``: the same samples and numbers in fewer
rows, issue 46) where the attention allows it.

``load_for_sft`` loads a model through plain transformers, or through unsloth's ``FastLanguageModel`` (faster
kernels, less memory; one CUDA GPU) when asked: ``use_unsloth=True`` / ``SFTStageConfig.use_unsloth``. unsloth is
never switched on because it is installed: it patches transformers and TRL on import, and its releases that know
transformers 5 pin trl 1.15.0, so it lives in its own environment (docs/scale.md). Trained weights are fp32 (master
weights, AdamW state in fp32) with bf16 autocast where ``bf16`` is set, unless ``weights_dtype`` says bfloat16.
"""

from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset
from transformers import PrinterCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTConfig, SFTTrainer

from klear_lib import models
from klear_lib.config import checkpointing
from klear_lib.data.tasks import Problem, prompt_messages, teacher_solution
from klear_lib.models import load_model_and_tokenizer
from klear_lib.train.tracking import add_hparams, tracking_env
from klear_lib.train.tracking import names as tracker_names


@dataclass
class SFTStageConfig:
    """Hyper-parameters of the SFT warm start (Klear: lr 8e-5 cosine to 4e-5, 4 epochs; tiny: minutes on a CPU)."""

    learning_rate: float = 3e-3
    """Peak learning rate; the tiny model from scratch needs a large one (Klear fine-tunes at 8e-5)."""
    epochs: float = 1.0
    """Passes over the SFT samples."""
    batch_size: int = 64
    """Samples per optimizer step."""
    warmup_ratio: float = 0.05
    """Linear warm-up as a fraction of all steps, then cosine decay."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_length: int = 256
    """Longest tokenized sample; longer ones are truncated."""
    seed: int = 0
    """Seed of the data order."""
    resume: bool = True
    """Continue from the last checkpoint in the output directory when there is one."""
    save_steps: int = 0
    """Checkpoint every this many steps (0: only the final model)."""
    use_cpu: bool = True
    """Train on the CPU even where a GPU is present (the tiny preset)."""
    report_to: str = "none"
    """Experiment tracker (``none``, ``tensorboard``, ``trackio``, ``wandb``); see ``run_sft``'s ``tracking_dir``."""
    bf16: bool = False
    """bf16 autocast. TRL 1.16 turns it on by default, also on a CPU, where it is slower than fp32 and rounds
    log-probs by ~1e-3; the project's CPU presets train in fp32, GPU presets in bf16."""
    weights_dtype: str = "float32"
    """dtype of the trained weights and of AdamW's state when ``sft_from`` loads the start model: ``float32`` (fp32
    master weights, bf16 compute through ``bf16``) or, only when set explicitly, ``bfloat16`` (updates below bf16's
    resolution round away: most of them at lr 1e-6)."""
    use_unsloth: bool = False
    """Load the start model with unsloth (opt-in; one CUDA GPU and unsloth's own environment, docs/scale.md)."""
    length_grouped: bool = False
    """Batches of samples of similar length (transformers' length-grouped sampler: mega-batches of 50 batches, each
    sorted by length, in a seeded random order; every sample once per epoch). On the tiny task's SFT the padding fell
    from 29.6% of the positions to 0.74% and an SFT start's CPU time by 0.69x (issue 46), but it changes what is
    learned: notebook 02's bases (4 epochs on levels 1-2) trained so answered level 2 right 0.16-1.00 over 10 seeds
    (median 0.35) where random batches gave a lowest of 0.87 (0.74 on another processor), and 02's primary went
    from reproduced to inconclusive (docs/results.md, 2026-12-07). So off by default: random batches, as before.
    Either way ``run_sft`` writes the padding share to ``<output_dir>/sft_tokens.json``."""
    packed: bool = True
    """Lay each batch out packed (``pack_batch``): the same samples in the same batches and order as padded, in
    fewer rows (each sequence's positions from 0, attention within each sequence only), so the loss and the
    gradients are the padded batch's to float rounding (``tests/test_sft_packing.py``). Only with transformers'
    sdpa or eager attention and without unsloth (``packs``); elsewhere padded. 03's SFT start (6,000 samples, 2
    epochs, 750 steps, one thread; issue 46, 2026-12-07): padding 29.6% -> 5.7% of the positions, CPU time 0.81x
    (107.8 and 108.4 -> 87.3 and 87.9 CPU-s). Its losses part from the padded run's only as float rounding grows
    over the steps: the mean over 750 steps 0.2730 padded, 0.2819 packed, and 0.2930 for a padded run with each
    batch's rows reversed (the same numbers but for rounding); the last logged 0.00428, 0.00470, 0.00496
    (``benchmarks/bench_sft_packing.py --control``)."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in the backward pass (TRL's default: on). ``None``: on where the model trains on a GPU,
    off with ``use_cpu``, where memory is not what limits a run and the recomputation costs a quarter of the step
    time for the same weights (``klear_lib.config.checkpointing``)."""

    def __post_init__(self) -> None:
        models.weights_dtype(self.weights_dtype, where="SFTStageConfig.weights_dtype")
        if not isinstance(self.use_unsloth, bool):
            raise TypeError(f"SFTStageConfig.use_unsloth must be true or false, got {self.use_unsloth!r}")
        if not isinstance(self.length_grouped, bool):
            raise TypeError(f"SFTStageConfig.length_grouped must be true or false, got {self.length_grouped!r}")
        if not isinstance(self.packed, bool):
            raise TypeError(f"SFTStageConfig.packed must be true or false, got {self.packed!r}")

    @classmethod
    def from_experiment(cls, cfg, **changes) -> "SFTStageConfig":
        """The SFT stage of an experiment config (``RLExperimentConfig`` or ``SFTExperimentConfig``): its
        ``sft_lr``, ``sft_epochs``, ``sft_batch_size``, ``seed``, ``use_cpu``, ``bf16`` (and ``max_length``,
        ``weights_dtype``, ``use_unsloth``, ``gradient_checkpointing`` where it has them), then ``changes``."""
        values = dict(learning_rate=cfg.sft_lr, epochs=cfg.sft_epochs, batch_size=cfg.sft_batch_size,
                      seed=cfg.seed, use_cpu=cfg.use_cpu, bf16=cfg.bf16, report_to=getattr(cfg, "report_to", "none"))
        for name in ("max_length", "weights_dtype", "use_unsloth", "gradient_checkpointing"):
            if hasattr(cfg, name):
                values[name] = getattr(cfg, name)
        return cls(**{**values, **changes})


def unsloth_available() -> bool:
    """unsloth is installed and a CUDA GPU is present (unsloth needs one; it refuses to import without). Only checked
    when unsloth was asked for: nothing switches it on by itself."""
    return torch.cuda.is_available() and importlib.util.find_spec("unsloth") is not None


def load_for_sft(name_or_path: str | Path, *, max_length: int = 4096, bf16: bool = True, use_unsloth: bool = False,
                 lora_rank: int = 0, weights_dtype: str = "float32"):
    """A model and tokenizer to fine-tune: ``klear_lib.models.load_model_and_tokenizer``, or, with
    ``use_unsloth=True`` (an error where ``unsloth_available()`` is false), unsloth's ``FastLanguageModel``: its
    fused kernels, full fine-tuning, or LoRA adapters of rank ``lora_rank`` on every attention and MLP projection
    when it is > 0. RL uses it too (``train.launch``, ``unsloth: full|lora``).

    The trained weights are in ``weights_dtype`` (float32: master weights; the trainer's ``bf16`` adds autocast):
    the whole model for full fine-tuning, the adapters for LoRA, whose frozen base is loaded in bf16 when ``bf16``
    is set (it is never updated)."""
    if not isinstance(use_unsloth, bool):
        raise TypeError(f"use_unsloth must be True or False (unsloth is opt-in, never chosen because it is "
                        f"installed), got {use_unsloth!r}")
    dtype = models.weights_dtype(weights_dtype)
    if not use_unsloth:
        return load_model_and_tokenizer(name_or_path, dtype=dtype)
    if not unsloth_available():
        raise RuntimeError("use_unsloth=True needs unsloth installed (its own environment, docs/scale.md) and a "
                           "CUDA GPU")
    from unsloth import FastLanguageModel  # imported late: it patches transformers on import

    load_dtype = torch.bfloat16 if lora_rank > 0 and bf16 else dtype
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(name_or_path), max_seq_length=max_length, dtype=load_dtype, load_in_4bit=False,
        full_finetuning=lora_rank == 0,
    )
    if lora_rank > 0:
        model = FastLanguageModel.get_peft_model(
            model, r=lora_rank, lora_alpha=2 * lora_rank, use_gradient_checkpointing="unsloth",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
    models.trainable_to(model, dtype)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def sft_samples(problems: list[Problem], *, error_rate: float = 0.0, seed: int = 0, fork_facts=(),
                fork_wrong_rate: float = 0.0) -> list[dict]:
    """Prompt-completion samples from the synthetic teacher (conversational format); see
    ``tasks.teacher_solution`` for its i.i.d. ``error_rate`` and its systematic errors on ``fork_facts``."""
    rng = random.Random(seed)
    return [
        {
            "prompt": prompt_messages(p),
            "completion": [{"role": "assistant", "content": teacher_solution(
                p, rng, error_rate=error_rate, fork_facts=fork_facts, fork_wrong_rate=fork_wrong_rate)}],
        }
        for p in problems
    ]


def run_sft(model, tokenizer, samples: list[dict], output_dir: str | Path, cfg: SFTStageConfig | None = None, *,
            tracking_dir: str | Path | None = None):
    """Fine-tune ``model`` on ``samples``; returns the trained model (also saved under ``output_dir/final``).
    With ``cfg.report_to`` set, the tracker writes to ``tracking_dir`` (a ``klear_lib.experiment.UnitTracking``: the
    unit is the run, the notebook the project; ``klear_lib.train.tracking``). Without a ``tracking_dir`` nothing is
    tracked: a base model trained once and cached for many runs belongs to no one run's tracking folder."""
    cfg = cfg or SFTStageConfig()
    output_dir = Path(output_dir)
    tracked = tracking_dir if cfg.report_to != "none" else None
    args = SFTConfig(
        output_dir=str(output_dir),
        learning_rate=cfg.learning_rate,
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,
        lr_scheduler_type="cosine",
        warmup_steps=cfg.warmup_ratio,  # transformers 5: a float < 1 is a fraction of all steps
        weight_decay=cfg.weight_decay,
        max_length=cfg.max_length,
        completion_only_loss=True,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=cfg.use_cpu,
        bf16=cfg.bf16,
        report_to=cfg.report_to if tracked is not None else "none",
        logging_steps=10,
        save_strategy="steps" if cfg.save_steps else "no",
        save_steps=cfg.save_steps or 500,
        disable_tqdm=True,
        dataloader_num_workers=0,
        gradient_checkpointing=checkpointing(cfg),
        train_sampling_strategy="group_by_length" if cfg.length_grouped else "random",
        **tracker_names(tracked),
    )

    with tracking_env(tracked):
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=Dataset.from_list(samples), processing_class=tokenizer
        )
        trainer.remove_callback(PrinterCallback)  # TRL prints a dict per log step when tqdm is off
        add_hparams(trainer, cfg, args.report_to)  # TensorBoard: the resolved config as hparams
        packed = cfg.packed and packs(trainer.model, cfg)
        counter = trainer.data_collator = TokenCounter(
            trainer.data_collator, pad_token_id=trainer.data_collator.pad_token_id if packed else None)
        last = get_last_checkpoint(str(output_dir)) if cfg.resume and output_dir.exists() else None
        trainer.train(resume_from_checkpoint=last)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / SFT_TOKENS_FILE).write_text(json.dumps(
        {**counter.stats(), "sampling": args.train_sampling_strategy, "resumed_from": last}, indent=2) + "\n")
    final = output_dir / "final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    return trainer.model


def packs(model, cfg: SFTStageConfig) -> bool:
    """Whether ``run_sft`` packs a batch for ``model`` where ``cfg.packed`` asks: only with transformers' own sdpa or
    eager attention, whose mask ``pack_batch``'s layout is checked against (``tests/test_sft_packing.py``), and
    never with unsloth (its kernels take the mask their own way). Elsewhere the batches stay padded, and
    ``sft_tokens.json`` says ``"packed": false``."""
    return not cfg.use_unsloth and getattr(model.config, "_attn_implementation", None) in ("sdpa", "eager")


SFT_TOKENS_FILE = "sft_tokens.json"  # beside an SFT run's checkpoints: its batches' tokens and padding share


class TokenCounter:
    """Wraps a data collator and counts, over the batches it makes, the samples, the tokens the model attends to and
    the positions of the batches the model is given (``attention_mask``; a batch without one is padding-free, all
    tokens real). With ``pad_token_id`` set, each batch is re-laid out by ``pack_batch`` after its real tokens are
    counted, and the positions are the packed rows'. ``stats()``: what ``run_sft`` writes to ``sft_tokens.json``
    (since a resume, only the batches after it), ``packed`` among it."""

    def __init__(self, collate, pad_token_id: int | None = None):
        self.collate, self.pad_token_id = collate, pad_token_id
        self.samples, self.tokens, self.positions = 0, 0, 0

    def __call__(self, examples):
        batch = self.collate(examples)
        mask = batch.get("attention_mask") if hasattr(batch, "get") else None
        self.samples += len(examples)
        self.tokens += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        if self.pad_token_id is not None:
            batch = pack_batch(batch, self.pad_token_id)
        self.positions += batch["input_ids"].numel()
        return batch

    def stats(self) -> dict:
        share = 1.0 - self.tokens / self.positions if self.positions else 0.0
        return {"samples": self.samples, "tokens": self.tokens, "positions": self.positions,
                "padding_share": round(share, 6), "packed": self.pad_token_id is not None}


PACK_WIDEST = 2.0
"""``pack_batch``'s widest row, in multiples of the batch's longest sequence. On 03's SFT start (batches of 16,
sequences of 39-83 tokens) rows only as wide as the longest sequence pad 21% of the positions (two sequences
seldom fit beside each other in the longest's room), up to 2x 5.7%, 3x 4.0%, 4x 2.3%; 60 training steps took
0.87x, 0.80x, 0.83x and 0.85x the padded batches' CPU time (wider rows cost attention)."""


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into rows whose lengths sum to at most ``capacity``: the longest first (ties in
    index order), each into the first row with room, a new row where none has. Within a row, in placement order."""
    if lengths and max(lengths) > capacity:
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit a row of {capacity}")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, left in enumerate(room):
            if lengths[i] <= left:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


def pack_rows(lengths: list[int], widest: float = PACK_WIDEST) -> tuple[list[list[int]], int]:
    """The packed layout of sequences of ``lengths``: ``first_fit_decreasing`` at each row capacity from the longest
    sequence to ``widest`` times it, the one with the fewest positions (rows × the longest row; ties: the narrower).
    Returns the rows (indices) and their width. ``widest=1``: rows as wide as the padded batch."""
    longest = max(lengths)
    best = None
    for capacity in range(longest, max(longest, int(widest * longest)) + 1):
        rows = first_fit_decreasing(lengths, capacity)
        width = max(sum(lengths[i] for i in row) for row in rows)
        if best is None or (len(rows) * width, width) < (len(best[0]) * best[1], best[1]):
            best = rows, width
        if len(rows) == 1:
            break
    return best


def pack_batch(batch, pad_token_id: int, widest: float = PACK_WIDEST) -> dict:
    """A right-padded batch (``input_ids``, ``attention_mask``, ``labels``: TRL's ``DataCollatorForLanguageModeling``
    without ``padding_free``) re-laid out with the same sequences in fewer rows (issue 46): placed by ``pack_rows``
    (rows up to ``widest`` times the longest sequence), each sequence's ``position_ids`` from 0, its first token's
    label -100, each row padded at its end (``pad_token_id``, label -100, positions 0, 1, ...) to the longest row.
    Returns ``input_ids``, ``labels`` and ``position_ids``; no ``attention_mask``.

    Why the numbers do not change: without a 2-D mask, transformers (5.17, ``masking_utils``:
    ``find_packed_sequence_indices``) reads the sequence boundaries off ``position_ids`` (a position that is not its
    left neighbour's plus one starts a sequence) and builds a block-diagonal causal mask, with sdpa and eager alike;
    so each sequence attends to itself only, causally, at the positions of its padded row, and a row's padding tail
    is a sequence of its own, seen by no real token. The loss is a sum over the tokens whose label is not -100,
    divided by their count: the fused LM head of TRL scores ``labels[:, 1:]`` and Trainer's ``num_items_in_batch``
    counts ``labels[..., 1:]``; in the padded batch the shift drops each sequence's first label, here it is set to
    -100, and a sequence's last token is scored against the next one's first: -100 too. Loss, per-sequence losses
    and gradients equal the padded batch's to float rounding (``tests/test_sft_packing.py``). Other keys are
    refused (nothing else of a batch is known to survive a re-layout); not for flash-attention kernels, which would
    need ``cu_seq_lens``."""
    extra = set(batch.keys()) - {"input_ids", "attention_mask", "labels"}
    if extra:
        raise ValueError(f"pack_batch knows input_ids, attention_mask and labels only, got also {sorted(extra)}")
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"].bool()
    lengths = mask.sum(1)
    if not bool((mask == (torch.arange(mask.shape[1])[None] < lengths[:, None])).all()):
        raise ValueError("pack_batch needs right-padded rows (the attention mask a run of ones, then zeros)")
    lengths = lengths.tolist()
    rows, width = pack_rows(lengths, widest)
    out_ids = torch.full((len(rows), width), pad_token_id, dtype=ids.dtype)
    out_labels = torch.full((len(rows), width), -100, dtype=labels.dtype)
    out_pos = torch.empty((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            n = lengths[i]
            out_ids[r, at:at + n] = ids[i, :n]
            out_labels[r, at + 1:at + n] = labels[i, 1:n]
            out_pos[r, at:at + n] = torch.arange(n)
            at += n
        out_pos[r, at:] = torch.arange(width - at)
    return {"input_ids": out_ids, "labels": out_labels, "position_ids": out_pos}


def sft_token_stats(output_dir: str | Path) -> dict | None:
    """What ``run_sft`` recorded of its batches in ``output_dir`` (``TokenCounter.stats``), or None."""
    path = Path(output_dir) / SFT_TOKENS_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def chat_rows(samples: list) -> list[dict]:
    """Chat rows for ``run_sft`` from samples that are chat rows already, ``SFTSample``s, or dicts with
    ``prompt``/``response`` (the synthetic sources' and the selection functions' samples)."""
    from klear_lib.data.rows import sft_sample_to_chat

    return [s if isinstance(s, dict) and "completion" in s else sft_sample_to_chat(s) for s in samples]


def sft_from(start: str | Path, samples: list, output_dir: str | Path, cfg: SFTStageConfig, *,
             tracking_dir: str | Path | None = None):
    """Load the model saved at ``start`` (a folder or hub name), fine-tune it on ``samples`` (see ``chat_rows``)
    and return ``(model, tokenizer)``; the result is also saved under ``output_dir/final``. ``tracking_dir``: where
    ``cfg.report_to``'s tracker writes (see ``run_sft``)."""
    if not samples:
        raise ValueError(f"no samples to fine-tune on (output {output_dir})")
    model, tokenizer = load_for_sft(start, max_length=cfg.max_length, bf16=cfg.bf16, use_unsloth=cfg.use_unsloth,
                                    weights_dtype=cfg.weights_dtype)
    return run_sft(model, tokenizer, chat_rows(samples), output_dir, cfg, tracking_dir=tracking_dir), tokenizer


@dataclass
class WarmStart:
    """The SFT start that every run of an RL notebook shares (``arithmetic_warm_start``). ``model`` and
    ``tokenizer`` are loaded from ``sft_dir``, whether it was trained by this call or found in the cache."""

    train: list
    heldout: list
    tokenizer: object
    model: object
    sft_dir: Path
    start: dict
    """Held-out evaluation of the SFT model (``evaluate_heldout``'s result)."""


# What the SFT warm start depends on: the config fields below, the code that builds it, the package versions.
WARM_START_FIELDS = ("model", "tiny_hidden", "tiny_layers", "vocab_size", "data_seed", "n_train", "n_heldout", "levels",
                     "sft_lr", "sft_epochs", "sft_batch_size", "sft_error_rate", "fork_facts", "fork_wrong_rate",
                     "seed", "use_cpu", "bf16")
_WARM_START_SOURCES = ("data/tasks.py", "train/sft.py", "models.py")


def warm_start_payload(cfg) -> dict:
    """Everything the SFT warm start of ``cfg`` depends on: ``WARM_START_FIELDS``, the sha256 of the source of the
    modules that build it, the versions of torch, transformers and trl (recorded in the cache's manifest)."""
    import hashlib

    from klear_lib import runs

    root = Path(__file__).resolve().parent.parent
    return {
        "fields": {f: getattr(cfg, f) for f in WARM_START_FIELDS},
        "source": {s: hashlib.sha256((root / s).read_bytes()).hexdigest() for s in _WARM_START_SOURCES},
        "versions": runs.package_versions(("torch", "transformers", "trl")),
    }


def warm_start_key(cfg) -> str:
    """A digest of ``warm_start_payload(cfg)``: equal keys, interchangeable models."""
    from klear_lib.cache import digest

    return digest(warm_start_payload(cfg))[:16]


def arithmetic_warm_start(cfg, out_dir: str | Path, *, cache_root: str | Path | None = None,
                          progress=print) -> WarmStart:
    """The RL notebooks' common first stage on the arithmetic task, from an ``RLExperimentConfig``: the fixed
    splits, the starting model (``models.model_for``), SFT on the synthetic teacher (its systematic errors on
    ``cfg.fork_facts``, its i.i.d. ``cfg.sft_error_rate``), and the held-out evaluation of the result at the
    evaluation protocol, with the fork / rest split.

    With ``cache_root``, the SFT model is trained once per ``warm_start_key(cfg)`` into ``cache_root/<key>`` and
    reused by every later call (03, 04 and 06 share one per seed, 07 seed 0's), after ``klear_lib.cache.verify``
    checked it against its manifest (a damaged or mismatched entry is trained again, with one line saying why);
    ``out_dir/sft_start.json`` records the key and the evaluation. Without it, the model is trained into
    ``out_dir``.

    Same experiment on a hit and a miss: the model is always loaded from the saved folder, and the evaluation (and
    every random stream after this call) starts from ``runs.set_seed(cfg.seed)``, not from what training left; a
    run that reuses the cache gives the numbers of the run that trained it (``tests/test_warm_start.py``).
    """
    import time

    from klear_lib import cache, models, runs
    from klear_lib.data import tasks
    from klear_lib.evaluation.heldout import evaluate_heldout, fork_probe

    clock = time.perf_counter()
    runs.set_seed(cfg.seed)
    facts = tasks.parse_fork_facts(cfg.fork_facts)
    train, heldout = tasks.make_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, cfg.level_list)
    out_dir = Path(out_dir)
    payload = warm_start_payload(cfg)
    key = cache.digest(payload)[:16]

    def build(work: Path) -> None:
        runs.set_seed(cfg.seed)
        model, tokenizer = models.model_for(cfg, tasks.corpus(train))
        progress(f"model: {cfg.model}, {models.count_parameters(model):,} parameters, vocabulary {len(tokenizer)}; "
                 f"SFT on {len(train)} teacher samples (fork facts {cfg.fork_facts or 'none'} written wrong "
                 f"{cfg.fork_wrong_rate:.0%} of the time)")
        samples = sft_samples(train, error_rate=cfg.sft_error_rate, seed=cfg.data_seed, fork_facts=facts,
                              fork_wrong_rate=cfg.fork_wrong_rate)
        run_sft(model, tokenizer, samples, work, SFTStageConfig.from_experiment(cfg))

    if cache_root is not None:
        final, _ = cache.ensure(cache_root, key, payload, build, label="SFT start", progress=progress)
    else:
        build(out_dir)
        final = out_dir / "final"
    try:
        model, tokenizer = models.load_model_and_tokenizer(final, dtype=torch.float32)
    except Exception as err:
        raise RuntimeError(f"SFT start: cannot load the model in {final}: {type(err).__name__}: {err}") from err
    runs.set_seed(cfg.seed)  # the start's sampled evaluation, and all that follows, from the config alone
    start = evaluate_heldout(model, tokenizer, heldout, n=cfg.eval_n, temperature=cfg.eval_temperature,
                             top_p=cfg.eval_top_p, max_new_tokens=cfg.max_completion_length, fork_facts=facts)
    if facts:
        start.update(fork_probe(model, tokenizer, facts))
    out_dir.mkdir(parents=True, exist_ok=True)
    runs.write_atomic(out_dir / "sft_start.json", runs.to_json_text(
        {"key": key, "model_dir": str(final), "start": start, "sft_tokens": sft_token_stats(Path(final).parent)},
        "sft_start", indent=2) + "\n")
    parts = "".join(f", {k.removeprefix('avg_at_n_')} {start[k]:.3f}" for k in ("avg_at_n_fork", "avg_at_n_rest")
                    if k in start)
    probe = f", p(right digit at the forks) {start['p_correct_fork']:.3f}" if "p_correct_fork" in start else ""
    progress(f"SFT start: held-out avg@{start['n']} at T {cfg.eval_temperature} = {start['avg_at_n']:.3f}{parts}{probe}"
             f" ({time.perf_counter() - clock:.0f}s)")
    return WarmStart(train, heldout, tokenizer, model, final, start)
