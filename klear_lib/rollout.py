"""Generation backends. ``hf`` (transformers ``generate``) runs everywhere; vLLM is used on GPUs through TRL.

Sampling follows the evaluation protocol's knobs (reference section 7): temperature, top-p, top-k and the
number of samples per prompt.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[list[dict]],
    *,
    n: int = 1,
    temperature: float = 0.6,
    top_p: float = 0.95,
    top_k: int | None = None,
    max_new_tokens: int = 64,
    batch_size: int = 64,
) -> list[list[str]]:
    """Sample ``n`` completions for each chat prompt; returns one list of ``n`` strings per prompt.

    ``temperature == 0`` means greedy decoding (then ``n`` copies of the same completion). Batches are
    formed over the flattened (prompt, sample) list, so one call uses the CPU's cores fully.
    """
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    flat = [t for t in texts for _ in range(n)]
    was_training = model.training
    model.eval()
    out: list[str] = []
    greedy = temperature == 0
    for start in range(0, len(flat), batch_size):
        chunk = flat[start : start + batch_size]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        gen = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else temperature,
            top_p=None if greedy else top_p,
            top_k=top_k if not greedy else None,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        new = gen[:, enc["input_ids"].shape[1] :]  # (b, new_tokens)
        out.extend(tokenizer.batch_decode(new, skip_special_tokens=False))
    if was_training:
        model.train()
    clean = [_strip_after_eos(t, tokenizer) for t in out]
    return [clean[i * n : (i + 1) * n] for i in range(len(prompts))]


def _strip_after_eos(text: str, tokenizer) -> str:
    eos = tokenizer.eos_token
    text = text.split(eos, 1)[0] if eos and eos in text else text
    return text.replace(tokenizer.pad_token or "\0", "")
