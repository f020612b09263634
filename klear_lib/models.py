"""Models and tokenizers: a tiny offline Qwen3 for the CPU stand-in, or a real one from the hub by name.

Weights are fp32 wherever the package trains (``load_model_and_tokenizer``'s default, ``WEIGHTS_DTYPES``): a bf16
checkpoint such as Qwen3's is upcast on load. AdamW moves a weight by about the learning rate per step (1e-6 at
Klear's), which in bf16 rounds away for every weight of magnitude above 2^-11 ≈ 4.9e-4 (bf16 keeps 8 significant
bits); in fp32 it stays. The trainers add bf16 autocast (``bf16``) for speed. bf16 weights are used only
where a config asks for them by name (``weights_dtype: bfloat16``).

``build_tokenizer`` trains a byte-level BPE on the task's own text, with digits as single tokens (as Qwen's
tokenizer splits them, so arithmetic stays learnable), ChatML special tokens, ``<think>``/``</think>`` as
tokens, and a ChatML chat template. ``build_tiny_model`` makes a Qwen3-architecture model from a config
(≈1M parameters by default). ``load_model_and_tokenizer`` takes a local folder or a hub name: the same
``Auto*`` code path either way, so the tiny model exercises the loading code a real one uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from klear_lib import real_models

PAD, IM_START, IM_END, THINK, THINK_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END, THINK, THINK_END]

# ChatML, as Qwen's: each message is <|im_start|>role\ncontent<|im_end|>\n; the generation prompt opens the
# assistant turn. The assistant writes its own <think> (Klear's format reward checks for it).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(texts: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` (well under a second for the tiny task) and wrap it for transformers.

    Digits are split one per token before BPE runs, so no merge ever joins two digits.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The chat template's role names are text too: let BPE see them often enough to merge them.
    roles = [f"{IM_START}{r}\n" for r in ("system", "user", "assistant")] * 100
    tok.train_from_iterator(list(texts) + roles, trainer=trainer)
    # <think>/</think> are added tokens but not special ones, as in Qwen3's tokenizer: decoding with
    # skip_special_tokens=True (TRL does) must keep them, or every format check fails.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK, THINK_END)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        padding_side="left",  # decoder-only generation pads on the left
        model_max_length=4096,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


@dataclass
class TinyModelSpec:
    """Size of the tiny Qwen3 stand-in (architecture.md: hidden 128, 4 layers, 4 heads, 2 KV heads, tied)."""

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 512


def build_tiny_model(tokenizer: PreTrainedTokenizerFast, spec: TinyModelSpec | None = None, *, seed: int = 0):
    """A randomly initialised Qwen3ForCausalLM sized for a CPU (≈1M parameters with a 1k vocabulary)."""
    spec = spec or TinyModelSpec()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.hidden_size // spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    real_models.align_special_tokens(model, tokenizer)  # the same rule as a loaded model's: EOS <|im_end|>
    return model


WEIGHTS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""The values of the ``weights_dtype`` config keys: the dtype of the trained weights and so of AdamW's state."""


def weights_dtype(name: str, *, where: str = "weights_dtype") -> torch.dtype:
    """The torch dtype named by a ``weights_dtype`` config value (``float32``, the default everywhere: fp32 master
    weights; ``bfloat16``: pure bf16 weights and optimizer state, where updates below bf16's resolution are lost)."""
    if name not in WEIGHTS_DTYPES:
        raise ValueError(f"{where} must be one of {sorted(WEIGHTS_DTYPES)}, got {name!r}")
    return WEIGHTS_DTYPES[name]


def trainable_to(model, dtype: torch.dtype):
    """Cast every parameter that requires grad to ``dtype`` (in place) and return the model: the adapters of a LoRA
    model on a frozen bf16 base become fp32 master weights; frozen parameters keep their dtype."""
    for p in model.parameters():
        if p.requires_grad and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model


def save_model_and_tokenizer(model, tokenizer, path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_model_and_tokenizer(name_or_path: str | Path, *, dtype: torch.dtype | str = torch.float32, progress=print,
                             **kwargs):
    """Load a causal LM and its tokenizer: a local folder, a hub name, a ``.gguf`` file or a packaged real model
    (``klear_lib.real_models.resolve``: a GGUF is dequantized once into the model cache), through the ``Auto*``
    classes.

    ``dtype``: float32 by default, whatever the checkpoint holds (fp32 master weights for training; see the module
    docstring); ``"auto"`` keeps the checkpoint's dtype (inference). A hub name needs network access (never used by
    tests or the tiny preset). EOS and padding come from the chat template and the model's config, never from a
    tokenizer's guess (``real_models.align_special_tokens``); the tokenizer pads on the left, as generation needs.
    The model's ``klear_source`` attribute says where it came from (name, kind, sha256).
    """
    source = real_models.resolve(name_or_path, progress=progress)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.load_from)
        model = AutoModelForCausalLM.from_pretrained(source.load_from, dtype=dtype, **kwargs)
    except (OSError, ValueError) as err:
        if source.kind == "hub":
            raise
        raise real_models.ModelLoadError(f"{source.load_from}: could not be loaded as a causal LM with its tokenizer "
                                         f"({type(err).__name__}: {err})") from err
    real_models.align_special_tokens(model, tokenizer)
    model.klear_source = source.record()
    return model, tokenizer


def count_parameters(model) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def model_for(cfg, corpus_texts: list[str]):
    """The starting model of an experiment config: ``cfg.model == "tiny"`` builds the tiny Qwen3 and a tokenizer
    trained on ``corpus_texts`` (the task's own text); anything else is a hub name or local folder, loaded with fp32
    weights (the trainers add bf16 autocast where ``bf16`` is set)."""
    if cfg.model == "tiny":
        tokenizer = build_tokenizer(corpus_texts, vocab_size=cfg.vocab_size)
        spec = TinyModelSpec(hidden_size=cfg.tiny_hidden, num_hidden_layers=cfg.tiny_layers)
        return build_tiny_model(tokenizer, spec, seed=cfg.seed), tokenizer
    return load_model_and_tokenizer(cfg.model, dtype=torch.float32)
