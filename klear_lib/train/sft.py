"""The long-CoT SFT stage on TRL's ``SFTTrainer``: loss on the assistant's tokens only.

Samples are in TRL's conversational prompt-completion format (``prompt``: the user turn, ``completion``: the
assistant turn), so ``completion_only_loss`` masks the prompt tokens out of the loss. Resumable: when the
output directory holds a checkpoint and ``resume`` is set, training continues from the last one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset
from transformers import PrinterCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTConfig, SFTTrainer

from klear_lib.data.tasks import Problem, prompt_messages, teacher_solution


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
    bf16: bool = False
    """bf16 autocast. TRL 1.16 turns it on by default, also on a CPU, where it is slower than fp32 and rounds
    log-probs by ~1e-3; the project's CPU presets train in fp32, GPU presets in bf16."""


def sft_samples(problems: list[Problem], *, error_rate: float = 0.0, seed: int = 0) -> list[dict]:
    """Prompt-completion samples from the synthetic teacher (conversational format)."""
    rng = random.Random(seed)
    return [
        {
            "prompt": prompt_messages(p),
            "completion": [{"role": "assistant", "content": teacher_solution(p, rng, error_rate=error_rate)}],
        }
        for p in problems
    ]


def run_sft(model, tokenizer, samples: list[dict], output_dir: str | Path, cfg: SFTStageConfig | None = None):
    """Fine-tune ``model`` on ``samples``; returns the trained model (also saved under ``output_dir/final``)."""
    cfg = cfg or SFTStageConfig()
    output_dir = Path(output_dir)
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
        report_to="none",
        logging_steps=10,
        save_strategy="steps" if cfg.save_steps else "no",
        save_steps=cfg.save_steps or 500,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(samples), processing_class=tokenizer
    )
    trainer.remove_callback(PrinterCallback)  # TRL prints a dict per log step when tqdm is off
    last = get_last_checkpoint(str(output_dir)) if cfg.resume and output_dir.exists() else None
    trainer.train(resume_from_checkpoint=last)
    final = output_dir / "final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    return trainer.model
