"""A KV-cache sampler for the Qwen3 stand-ins: the same tokens as transformers ``generate``, in less CPU time.

``generate`` takes what ``model.generate`` takes for greedy decoding and sampling (left-padded ``input_ids`` and
``attention_mask``, a ``GenerationConfig`` and/or its keywords) and returns what it returns: the prompt and the
completion, every row padded with ``pad_token_id`` after its EOS, as long as the longest row. The decision of what
to sample is HF's own: the generation config is resolved by ``model._prepare_generation_config``, the logits
processors and warpers (temperature, top-k, top-p, repetition penalty, ...) and the stopping criteria are the
ones ``model._get_logits_processor`` and ``model._get_stopping_criteria`` build, and a token is drawn by
``torch.multinomial`` over the softmax of the processed scores on the global generator, once per step for the
whole batch, finished rows included, exactly as ``GenerationMixin._sample`` does. With identical logits the draws
are therefore identical. What differs is the forward pass (``_Forward``): Qwen3's decoder written for decoding,
with the weights read from the HF module at each call (fused q/k/v and gate/up matrices built per call, so no copy
can go stale), static key/value buffers ``(batch, kv_heads, prompt + max_new, head_dim)`` filled in place, the
RoPE table computed once per call by the model's own rotary module, q/k RMSNorm over both in one pass, GQA by
grouping query heads on their KV head (no repeated keys), and the left padding as one additive row of -inf that
each decoding step slices (no mask is rebuilt). Two things HF does not do: a prompt repeated in the batch (GRPO's
group, ``n`` samples in an evaluation) is run through the prompt pass once, and rows that have finished leave the
forward (``COMPACT_AT``) while their logits stay in the batch's, so that every row is still drawn for and the
generator advances as in HF. Logits match HF's to float rounding (fused matmuls, other row counts): teacher-forced
next-token logits within 1e-5 in float32 (measured 5e-7) and one bf16 step with bf16 weights; greedy and sampled
tokens from the same seed were identical on every row tested (tests/test_sampler.py; bf16 weights: 88% of rows
greedy, 97% sampled, 64 rows × 32 tokens).

``supports(model)`` says whether the fast path applies: a stand-in-sized ``Qwen3ForCausalLM`` (at most
``MAX_PARAMETERS``: real models keep HF generate) with default RoPE (no scaling: YaRN keeps HF), no sliding
window, no attention bias, SiLU, eager or sdpa attention, float32 or bfloat16 weights, on the CPU. Anything else,
any generation mode other than greedy or sampling (beams, assisted, constraints), any extra output (scores,
dicts), or bf16 autocast switched on around the call falls back to ``model.generate`` itself.

Switch: the environment variable ``KLEAR_SAMPLER`` (``off``, ``0``, ``hf`` or ``false``: HF generate everywhere;
unset or anything else: this sampler wherever ``supports`` says so). It is read at each call, so a notebook or
test can flip it. ``setting()`` is what a run records in ``versions.json`` (``klear_lib.runs.write_run_metadata``,
key ``sampler``); ``PATHS_USED`` counts the calls that took each path in this process.

``generate`` passes each filter keyword on as given, None included: to HF generate, ``top_k=None`` switches top-k
off, while leaving it out means HF's default, 50 (``HFEngine`` passes every one).

Measured (benchmarks/bench_sampler.py, 2026-12-07, the project's 2-core machine: the stand-in at hidden 128,
4 layers, 256 rows = 32 prompts × 8, 56 new tokens, one thread, CPU time, HF and this in one process, fastest of
two alternated runs, outputs identical): per decoding step 29.4 → 15.1 ms (1.95×; the issue's bar 1.5×), the
whole call per token 34.6 → 15.4 ms (2.24×), the evaluation protocol's setting 32.5 → 18.4 ms per step (1.77×);
one rollout of notebook 03's tiny unit 4.03 → 3.14 CPU-s (0.78). A second run, with finished rows dropped (none
finish there): 1.85×, 2.16×, 1.73×, 0.72. At tests/ scale (hidden 64, 2 layers, 4 steps of 8 completions × 12
tokens) a whole training run took 0.92 of the CPU time. Where a step's time goes (torch profiler, 256
rows, 60 keys): the linear layers ≈ 5 ms, attention's two batched matmuls ≈ 5 ms (reading the fp32 cache: memory
bound), HF's processors and the draw ≈ 2 ms (the same in both), the rest elementwise.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter

import torch
import torch.nn.functional as F

ENV = "KLEAR_SAMPLER"
OFF_VALUES = ("off", "0", "hf", "false", "no")

COMPACT_AT = 0.75
"""The forward drops the rows that have finished once at most this share of the rows it computes is unfinished."""

MAX_PARAMETERS = 50_000_000
"""``supports`` takes only models up to this size: the stand-ins (0.83M parameters at hidden 128, 4 layers; 6.4M at
hidden 256, 8 layers; 25M at hidden 512, 8 layers), not a real Qwen3 (the smallest, 0.6B), which keeps HF
generate."""

PATHS_USED: Counter = Counter()
"""Calls per path in this process: ``klear`` (this sampler) and ``hf`` (``model.generate``, a fallback)."""


def enabled() -> bool:
    """False when ``KLEAR_SAMPLER`` switches the sampler off (read at each call)."""
    return os.environ.get(ENV, "").strip().lower() not in OFF_VALUES


def setting() -> str:
    """What ``versions.json`` records: which generation path this process's runs take for a stand-in model."""
    if not enabled():
        return f"hf generate ({ENV}={os.environ.get(ENV)})"
    return "klear_lib.sampler for supported Qwen3 stand-ins, hf generate otherwise"


def supports(model) -> bool:
    """True for a ``Qwen3ForCausalLM`` whose config ``_Forward`` implements (see the module docstring)."""
    from transformers import Qwen3ForCausalLM

    if type(model) is not Qwen3ForCausalLM:  # subclasses (and PEFT wrappers) may change the forward
        return False
    c = model.config
    rope = getattr(c, "rope_parameters", None) or {}
    layer_types = getattr(c, "layer_types", None) or ["full_attention"]
    dtypes = {p.dtype for p in model.parameters()}
    return (
        sum(p.numel() for p in model.parameters()) <= MAX_PARAMETERS
        and rope.get("rope_type", "default") == "default"
        and set(rope) <= {"rope_type", "rope_theta"}
        and not getattr(c, "use_sliding_window", False)
        and set(layer_types) == {"full_attention"}
        and not getattr(c, "attention_bias", False)
        and getattr(c, "hidden_act", None) == "silu"
        and getattr(c, "_attn_implementation", None) in (None, "eager", "sdpa")
        and len(dtypes) == 1 and dtypes <= {torch.float32, torch.bfloat16}
        and model.device.type == "cpu"
        and not (model.training and getattr(c, "attention_dropout", 0.0))
    )


# ----------------------------------------------------------------------------------------------------------
# The forward pass


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm's arithmetic: in float32, then back to the input dtype, then times the weight."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Forward:
    """Qwen3's decoder over static key/value buffers, for one ``generate`` call (weights read at construction)."""

    def __init__(self, model, batch: int, max_len: int):
        c = model.config
        inner = model.model
        self.H, self.KV = c.num_attention_heads, c.num_key_value_heads
        self.D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.G = self.H // self.KV
        self.scale = self.D ** -0.5
        self.embed = inner.embed_tokens.weight
        self.dtype = self.embed.dtype
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((
                layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0),
                torch.cat([a.q_norm.weight.expand(self.H, -1), a.k_norm.weight.expand(self.KV, -1)], 0),
                a.q_norm.variance_epsilon,
                a.o_proj.weight,
                layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                torch.cat([m.gate_proj.weight, m.up_proj.weight], 0),
                m.down_proj.weight,
            ))
        self.norm, self.norm_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.head = model.lm_head.weight
        self.inter = c.intermediate_size
        # RoPE table for every position this call can reach, by the model's own rotary module (its arithmetic).
        positions = torch.arange(max_len, device=self.embed.device)[None]
        cos, sin = inner.rotary_emb(self.embed[:1][None], positions)
        self.cos, self.sin = cos[0], sin[0]  # (max_len, D)
        shape = (batch, self.KV, max_len, self.D)
        self.k = [torch.empty(shape, dtype=self.dtype) for _ in self.layers]
        self.v = [torch.empty(shape, dtype=self.dtype) for _ in self.layers]

    def _qkv(self, x, lw, cos, sin):
        """Normed, rotated q and k, and v, for hidden states ``x`` (..., hidden): q (..., H, D), k, v (..., KV, D)."""
        ln, ln_eps, wqkv, qk_norm, qk_eps = lw[:5]
        h = _rms(x, ln, ln_eps)
        qkv = F.linear(h, wqkv)
        nqk = (self.H + self.KV) * self.D
        qk = qkv[..., :nqk].unflatten(-1, (self.H + self.KV, self.D))
        v = qkv[..., nqk:].unflatten(-1, (self.KV, self.D))
        qk = _rms(qk, qk_norm, qk_eps)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        qk = qk * cos + _rotate_half(qk) * sin
        return qk[..., : self.H, :], qk[..., self.H :, :], v

    def _mlp_out(self, x, attn, lw):
        """The layer's output: ``x`` plus the attention output's projection, plus the MLP of that."""
        wo, ln2, ln2_eps, wgu, wdown = lw[5:]
        x = x + F.linear(attn, wo)
        gu = F.linear(_rms(x, ln2, ln2_eps), wgu)
        return x + F.linear(F.silu(gu[..., : self.inter]) * gu[..., self.inter :], wdown)

    def _logits(self, x):
        return F.linear(_rms(x, self.norm, self.norm_eps), self.head)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Fill the buffers with the prompt's keys and values; return the last position's logits (B, V).

        Rows that repeat another row (GRPO's group of completions per prompt, ``n`` samples per prompt in an
        evaluation) are computed once and copied. A key is seen by a query when it is at or before it and not
        padding; a padding query sees itself only (its output is never read, but must stay finite: it becomes the
        next layer's keys, which are masked)."""
        unique, inverse = torch.unique(torch.cat([ids, mask], 1), dim=0, return_inverse=True)
        if unique.shape[0] < ids.shape[0]:
            first = torch.empty(unique.shape[0], dtype=torch.long).scatter_(
                0, inverse.flip(0), torch.arange(ids.shape[0] - 1, -1, -1))  # a row of each kind
            ids, mask, positions = ids[first], mask[first], positions[first]
        else:
            inverse = None
        B, L = ids.shape
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[positions], self.sin[positions]  # (B, L, D)
        idx = torch.arange(L, device=ids.device)
        causal = idx[:, None] >= idx[None, :]
        allowed = (causal & mask.bool()[:, None, :]) | torch.eye(L, dtype=torch.bool, device=ids.device)
        allowed = allowed[:, None]  # (B, 1, L, L)
        for i, lw in enumerate(self.layers):
            q, k, v = self._qkv(x, lw, cos, sin)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, L, D)
            self.k[i][:, :, :L] = k if inverse is None else k[inverse]
            self.v[i][:, :, :L] = v if inverse is None else v[inverse]
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.scale, enable_gqa=True)
            x = self._mlp_out(x, attn.transpose(1, 2).flatten(2), lw)
        logits = self._logits(x[:, -1])
        return logits if inverse is None else logits[inverse]

    def keep(self, rows: torch.Tensor, used: int) -> None:
        """Keep only the buffer rows ``rows`` (the first ``used`` slots of each: what has been written)."""
        for bufs in (self.k, self.v):
            for i, buf in enumerate(bufs):
                kept = buf.new_empty((rows.shape[0], *buf.shape[1:]))
                kept[:, :, :used] = buf[rows, :, :used]
                bufs[i] = kept

    def step(self, tokens: torch.Tensor, t: int, positions: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """One decoding step: ``tokens`` (B,) at buffer slot ``t``, rotary ``positions`` (B,); ``bias`` (B, 1, 1,
        t + 1) is 0 where a key is seen and -inf at left padding. Returns the logits (B, V)."""
        B = tokens.shape[0]
        x = F.embedding(tokens, self.embed)  # (B, hidden)
        cos, sin = self.cos[positions], self.sin[positions]  # (B, D)
        for i, lw in enumerate(self.layers):
            q, k, v = self._qkv(x, lw, cos, sin)  # (B, H, D), (B, KV, D), (B, KV, D)
            self.k[i][:, :, t] = k
            self.v[i][:, :, t] = v
            keys, values = self.k[i][:, :, : t + 1], self.v[i][:, :, : t + 1]  # (B, KV, t + 1, D)
            scores = torch.matmul(q.view(B, self.KV, self.G, self.D), keys.transpose(-1, -2))
            scores = torch.softmax(scores.mul_(self.scale).add_(bias), dim=-1, dtype=torch.float32).to(self.dtype)
            attn = torch.matmul(scores, values)  # (B, KV, G, D)
            x = self._mlp_out(x, attn.view(B, self.H * self.D), lw)
        return self._logits(x)


# ----------------------------------------------------------------------------------------------------------
# Generation


def _plan(model, input_ids, attention_mask, generation_config, kwargs):
    """HF's own preparation of a ``generate`` call (config, special tokens, lengths, processors, stopping
    criteria), or None where this sampler does not cover the call."""
    from transformers import LogitsProcessorList, StoppingCriteriaList
    from transformers.generation.configuration_utils import GenerationMode

    if not (enabled() and supports(model)) or torch.is_autocast_enabled("cpu"):
        return None
    if input_ids is None or input_ids.dim() != 2 or input_ids.device.type != "cpu":
        return None
    has_default_max_length = (kwargs.get("max_length") is None
                              and (generation_config is None or generation_config.max_length is None)
                              and model.generation_config.max_length is None)
    has_default_min_length = (kwargs.get("min_length") is None
                              and (generation_config is None or generation_config.min_length is None)
                              and model.generation_config.min_length is None)
    config, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    if model_kwargs:  # inputs for the forward other than the ids and mask
        return None
    mode = config.get_generation_mode(None)
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE) or (config.num_return_sequences or 1) != 1:
        return None
    if config.return_dict_in_generate or config.token_healing or config.use_cache is False:
        return None
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape or bool((attention_mask[:, -1] == 0).any()):
        return None  # right padding: leave it to HF (which warns about it)
    batch, length = input_ids.shape
    model._prepare_special_tokens(config, True, device=input_ids.device, batch_size=batch)
    config = model._prepare_generated_length(
        generation_config=config, has_default_max_length=has_default_max_length,
        has_default_min_length=has_default_min_length, model_input_name="input_ids",
        inputs_tensor=input_ids, input_ids_length=length,
    )
    if config.max_length is None or config.max_length <= length:
        return None
    processors = model._get_logits_processor(
        generation_config=config, input_ids_seq_length=length, encoder_input_ids=input_ids,
        prefix_allowed_tokens_fn=None, logits_processor=LogitsProcessorList(), device=input_ids.device,
        model_kwargs={"attention_mask": attention_mask},
    )
    stopping = model._get_stopping_criteria(generation_config=config, stopping_criteria=StoppingCriteriaList())
    return config, attention_mask, processors, stopping


@torch.no_grad()
def _sample(model, input_ids, attention_mask, config, processors, stopping) -> torch.Tensor:
    """``GenerationMixin._sample``'s loop over ``_Forward``: the same processors, draws and stopping rule."""
    batch, length = input_ids.shape
    max_len = config.max_length
    fwd = _Forward(model, batch, max_len)
    pad = config._pad_token_tensor
    has_eos = any(hasattr(c, "eos_token_id") for c in stopping)
    seq = torch.empty(batch, max_len, dtype=input_ids.dtype)
    seq[:, :length] = input_ids
    mask = attention_mask.to(torch.long)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    # One additive row per sequence over every buffer slot: -inf at the prompt's padding, 0 elsewhere (a generated
    # token is always seen, as HF's mask grows by a 1 each step, after EOS too).
    bias = torch.zeros(batch, 1, 1, max_len, dtype=torch.float32)
    bias[:, 0, 0, :length].masked_fill_(mask == 0, float("-inf"))
    next_pos = positions[:, -1]
    unfinished = torch.ones(batch, dtype=torch.long)
    logits = fwd.prefill(input_ids, mask, positions).to(torch.float32)
    held = None  # the batch rows the forward still computes (sorted), None while it is all of them
    cur = length
    while True:
        scores = processors(seq[:, :cur], logits)
        if config.do_sample:
            next_tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            next_tokens = torch.argmax(scores, dim=-1)
        if has_eos:
            next_tokens = next_tokens * unfinished + pad * (1 - unfinished)
        seq[:, cur] = next_tokens
        cur += 1
        unfinished = unfinished & ~stopping(seq[:, :cur], None)
        if unfinished.max() == 0:
            break
        next_pos = next_pos + 1
        alive = int(unfinished.sum())
        if alive <= COMPACT_AT * (batch if held is None else held.shape[0]):
            # Finished rows are dropped from the forward: their logits stay as they were (a finished row's draw
            # is replaced by pad, but is still drawn, so that the generator advances exactly as in HF).
            rows = unfinished.nonzero().squeeze(1)
            local = rows if held is None else torch.searchsorted(held, rows)
            fwd.keep(local, cur - 1)
            bias, held = bias[local], rows
        if held is None:
            logits = fwd.step(next_tokens, cur - 1, next_pos, bias[..., :cur]).to(torch.float32)
        else:
            logits[held] = fwd.step(next_tokens[held], cur - 1, next_pos[held], bias[..., :cur]).to(torch.float32)
    return seq[:, :cur].clone()


def generate_like_hf(model, input_ids=None, attention_mask=None, generation_config=None, **kwargs) -> torch.Tensor:
    """``model.generate(input_ids, attention_mask=..., generation_config=..., **kwargs)``: this sampler where it
    covers the call (``_plan``), ``model.generate`` itself otherwise. Records the path in ``PATHS_USED``."""
    if input_ids is None:
        input_ids = kwargs.pop("inputs", None)
    plan = _plan(model, input_ids, attention_mask, generation_config, dict(kwargs))
    if plan is None:
        PATHS_USED["hf"] += 1
        hf_generate = type(model).generate  # the class's, not an instance override (swap_generate's)
        return hf_generate(model, input_ids=input_ids, attention_mask=attention_mask,
                           generation_config=generation_config, **kwargs)
    PATHS_USED["klear"] += 1
    config, attention_mask, processors, stopping = plan
    return _sample(model, input_ids, attention_mask, config, processors, stopping)


def generate(model, input_ids, attention_mask, *, max_new_tokens: int, do_sample: bool,
             temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
             repetition_penalty: float | None = None, eos_token_id=None, pad_token_id=None) -> torch.Tensor:
    """What ``model.generate`` returns for these settings (prompt + completion ids, pad after EOS), by this
    sampler where ``supports(model)`` and the switch allow, by ``model.generate`` otherwise."""
    return generate_like_hf(model, input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=do_sample,
                            temperature=temperature, top_p=top_p, top_k=top_k,
                            repetition_penalty=repetition_penalty, eos_token_id=eos_token_id,
                            pad_token_id=pad_token_id)


@contextlib.contextmanager
def swap_generate(model):
    """Within the block, ``model.generate(...)`` is ``generate_like_hf(model, ...)`` (an attribute on the
    instance, removed on exit). For callers that call ``generate`` themselves (TRL's trainer)."""
    had = "generate" in vars(model)
    previous = vars(model).get("generate")
    model.generate = lambda *a, **kw: generate_like_hf(model, *a, **kw)
    try:
        yield model
    finally:
        if had:
            model.generate = previous
        else:
            del model.generate
