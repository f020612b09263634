"""Per-token log-probs and entropies of a policy's completions without the (B, T, V) logits: the trainer's default
source (``KlearLossConfig.logprob_backend="klear"``), through ``klear_lib.logprobs`` on the backbone's hidden states
(chunked, in forward and backward), whatever wraps the model (DDP, DeepSpeed, PEFT)."""

from __future__ import annotations

import contextlib

import torch

from klear_lib.logprobs import IGNORE_INDEX, token_logprobs_and_entropy


def causal_lm(model):
    """The transformers ``PreTrainedModel`` inside ``model``'s wrappers: DDP and DeepSpeed (``.module``), PEFT
    (``get_base_model()``). The wrappers themselves are what gets called; this is for reading the config and the
    LM head."""
    from transformers import PreTrainedModel

    m = model
    for _ in range(8):
        if isinstance(m, PreTrainedModel):
            return m
        if callable(getattr(m, "get_base_model", None)):  # PEFT
            m = m.get_base_model()
        elif isinstance(getattr(m, "module", None), torch.nn.Module):  # DDP, DeepSpeedEngine, FSDP1
            m = m.module
        else:
            break
    raise TypeError(f"logprob_backend='klear': found no transformers model inside {type(model).__name__}; use "
                    "logprob_backend='trl'")


@contextlib.contextmanager
def _head_returns_token_stats(head, labels, logits_to_keep: int, temperature: float, calls: list):
    """For the duration of the block, ``head(hidden)`` (the LM head module, called by the CausalLM's own forward)
    returns ``stack([log p(label), entropy], -1)`` (b, logits_to_keep, 2) from ``klear_lib.logprobs`` instead of
    logits. The head module is kept, only its ``forward`` is swapped: the hooks that DDP, DeepSpeed ZeRO-3 and FSDP
    put on the wrapped model and on the head (gather before the call, reduce after backward) still run."""

    def forward(hidden):  # (b, T, H): every position, since the CausalLM is called with logits_to_keep=0
        # the hidden state at position t predicts token t + 1: keep the logits_to_keep positions before each
        # scored token
        h = hidden[:, -logits_to_keep - 1:-1]
        weight = head.weight
        if type(weight).__name__ == "DTensor":  # an FSDP2 head wrapped on its own and resharded: gather it
            weight = weight.full_tensor()
        with torch.autocast(h.device.type, enabled=False):  # the chunked head computes in fp32 itself
            logps, ent = token_logprobs_and_entropy(h, weight, labels, temperature=temperature)
        stats = torch.stack([logps, ent], dim=-1)
        calls.append(stats.detach())  # to check that the CausalLM hands back exactly this
        return stats

    saved = head.__dict__.get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if saved is None:
            del head.forward
        else:
            head.forward = saved


def klear_token_stats(model, input_ids, attention_mask, logits_to_keep, *, temperature=1.0, batch_size=None,
                      autocast=contextlib.nullcontext):
    """Per-token log-probs and entropies of the last ``logits_to_keep`` tokens, as TRL's pass returns them
    ``(logps, entropies, None)``, each (B, logits_to_keep), from the last hidden states and the LM-head weight
    through ``klear_lib.logprobs.token_logprobs_and_entropy`` (chunked; no (B, T, V) logits, in forward or
    backward). Positions with ``attention_mask == 0`` get 0.

    ``model`` is called as it is, wrappers included (DDP, DeepSpeed, FSDP, PEFT): the chunked head runs inside the
    LM head module's call during the CausalLM's forward (``_head_returns_token_stats``), so a data-parallel wrapper
    prepares its gradient reduction and a sharded one gathers every parameter, the head's included. Models whose
    logits are scaled or soft-capped after the LM head, or whose head has a bias, are refused (their logits are not
    ``hidden @ W.T``)."""
    inner = causal_lm(model)
    cfg = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier",
                 "lm_head_multiplier"):
        if getattr(cfg, attr, None) not in (None, 1, 1.0):
            raise ValueError(f"logprob_backend='klear' needs logits = hidden @ W.T; {type(inner).__name__} sets "
                             f"{attr}={getattr(cfg, attr)!r}: use logprob_backend='trl'")
    head = inner.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("logprob_backend='klear' needs an LM head without bias: use logprob_backend='trl'")
    batch_size = batch_size or input_ids.size(0)
    all_logps, all_ent = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
        labels = ids[:, -logits_to_keep:].masked_fill(mask[:, -logits_to_keep:] == 0, IGNORE_INDEX)
        calls = []
        with _head_returns_token_stats(head, labels, logits_to_keep, temperature, calls), autocast():
            stats = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (b, logits_to_keep, 2)
        if len(calls) != 1 or stats is None or not torch.equal(stats.detach(), calls[0]):
            # a forward that computes its logits without calling the head module, or that changes what the head
            # returned (a cast to bf16, a scale: a patched forward such as unsloth's can), would hand back something
            # else than these statistics: never read that as log-probs
            raise RuntimeError(f"logprob_backend='klear': {type(inner).__name__}'s forward called its LM head module "
                               f"{len(calls)} time(s) and must return what it returned unchanged; use "
                               "logprob_backend='trl'")
        all_logps.append(stats[..., 0])
        all_ent.append(stats[..., 1])
    return torch.cat(all_logps), torch.cat(all_ent), None
