"""Per-token log-probs and entropies of an LM head without materialising (B, T, V) logits.

ERC (docs/reference.md §3) needs, for every response token, the entropy H_t of the full next-token
distribution under the rollout policy and under the current one, next to the usual log π(y_t). At paper
scale (V = 151,936, responses of 16K-32K tokens) the (B, T, V) logits, their log-softmax and its gradient do
not fit on a GPU. `token_logprobs_and_entropy` takes the last hidden states and the LM-head weight instead
of the logits, processes `chunk_size` tokens at a time, and keeps only O(N) per-token statistics between
forward and backward; backward recomputes each chunk's logits and applies the analytic gradient.

Conventions shared by every function here:
- logits z = hidden @ weight.T / temperature (no bias: the LM heads of Qwen/Llama have none).
- Positions whose label equals `ignore_index` (default -100) or is negative are padding: both outputs are 0
  there and they receive no gradient. A label >= V is an error.
- Computation runs in float32 even for bf16/fp16 inputs (a softmax over 150K entries in bf16 loses the
  small probabilities the entropy is made of); float64 inputs stay float64 (for gradcheck). Outputs are in
  that compute dtype; gradients come back in the inputs' dtypes.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100
CHUNK_BYTES = 64 * 2**20  # a chunk's (C, V) logits occupy ~64 MiB in the compute dtype


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def default_chunk_size(vocab_size: int, dtype: torch.dtype = torch.float32) -> int:
    """Tokens per chunk such that one chunk's logits take ~CHUNK_BYTES (110 tokens at V=151,936 in fp32)."""
    return max(1, CHUNK_BYTES // (vocab_size * torch.empty((), dtype=dtype).element_size()))


def _check(labels: Tensor, vocab_size: int, temperature: float, ignore_index: int) -> Tensor:
    """Validate and return the valid-token mask (N,)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise TypeError(f"labels must be an integer tensor, got {labels.dtype}")
    valid = (labels != ignore_index) & (labels >= 0)  # (N,)
    if bool((labels[valid] >= vocab_size).any()):
        raise ValueError(f"a label is >= the vocabulary size {vocab_size}")
    return valid


def _chunk_stats(z: Tensor, y: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One chunk's logits z (C, V) -> (log p_y, H, logsumexp), each (C,), masked; z is overwritten unless it
    requires grad. Used by the from-logits path, where autograd (under checkpoint) does the backward."""
    lse = torch.logsumexp(z, dim=-1)  # (C,)
    # In place (no second (C, V) buffer) unless autograd needs z intact for logsumexp's backward.
    logp = z - lse[:, None] if z.requires_grad else z.sub_(lse[:, None])  # (C, V) log-softmax
    # H = -Σ_k p_k log p_k; p_k = 0 (underflow) contributes 0 since log p_k stays finite.
    entropy = -(logp.exp() * logp).sum(-1)  # (C,)
    logp_y = logp.gather(1, y[:, None]).squeeze(1)  # (C,)
    zero = torch.zeros((), dtype=z.dtype)
    return torch.where(valid, logp_y, zero), torch.where(valid, entropy, zero), lse


class _ChunkedLogProbEntropy(torch.autograd.Function):
    """(hidden (N, H), weight (V, H), labels (N,)) -> (log p_y (N,), H (N,)), chunked over N.

    Saves hidden, weight (both already alive as inputs: no extra memory), labels, and the per-token
    logsumexp and entropy (N,) each: O(N) extra, never (N, V).
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk_size, ignore_index):
        N, V = hidden.shape[0], weight.shape[0]
        dtype = _compute_dtype(hidden, weight)
        valid = _check(labels, V, temperature, ignore_index)  # (N,)
        y = torch.where(valid, labels, torch.zeros_like(labels))  # (N,) ignored rows gather index 0
        w = weight.to(dtype)  # (V, H) a copy only for bf16/fp16 weights
        logp_y = torch.empty(N, dtype=dtype, device=hidden.device)  # (N,)
        entropy = torch.empty_like(logp_y)  # (N,)
        lse = torch.empty_like(logp_y)  # (N,)
        # Two (C, V) buffers reused by every chunk: fresh 64 MiB allocations per chunk cost page faults
        # (on CPU, mmap/munmap each time) that were ~30% of the runtime.
        zbuf = torch.empty(min(chunk_size, N), V, dtype=dtype, device=hidden.device)  # (C, V)
        pbuf = torch.empty_like(zbuf)  # (C, V)
        for s in range(0, N, chunk_size):
            e = min(s + chunk_size, N)
            z, p = zbuf[: e - s], pbuf[: e - s]  # (C, V) each
            # Scale the (C, H) hidden by 1/T rather than the (C, V) logits: V/H times fewer multiplies.
            torch.mm(hidden[s:e].to(dtype) / temperature, w.T, out=z)  # (C, V) logits
            m = z.amax(-1, keepdim=True)  # (C, 1) shift for a stable exp
            torch.exp(z.sub_(m), out=p)  # (C, V) unnormalised probabilities
            tot = p.sum(-1, keepdim=True)  # (C, 1)
            logp = z.sub_(tot.log())  # (C, V) log-softmax
            lse[s:e] = (m + tot.log()).squeeze(1)
            # H = -Σ_k p_k log p_k; p_k = 0 (underflow) contributes 0 since log p_k stays finite.
            entropy[s:e] = -p.div_(tot).mul_(logp).sum(-1)  # (C,)
            logp_y[s:e] = logp.gather(1, y[s:e, None]).squeeze(1)  # (C,)
        zero = torch.zeros((), dtype=dtype)
        logp_y, entropy = torch.where(valid, logp_y, zero), torch.where(valid, entropy, zero)  # (N,) each
        ctx.save_for_backward(hidden, weight, y, valid, lse, entropy)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return logp_y, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, grad_entropy):
        # Per token, with z = h W^T / T, p = softmax(z), logp_y = z_y - lse(z), H = -Σ_k p_k log p_k:
        #   d logp_y / d z_k = δ_{k,y} - p_k
        #   d H / d z_k = -Σ_j (log p_j + 1) p_j (δ_{jk} - p_k) = -p_k (log p_k + 1) + p_k (1 - H)
        #              = -p_k (log p_k + H)
        # so with upstream gradients a = dL/d logp_y and b = dL/dH (zeroed on ignored rows):
        #   G_k = dL/dz_k = a (δ_{k,y} - p_k) - b p_k (log p_k + H) = a δ_{k,y} - p_k (a + b (log p_k + H))
        # and through z = h W^T / T:  dL/dh = G W / T  (C, H),   dL/dW = G^T h / T = G^T (h / T)  (V, H).
        hidden, weight, y, valid, lse, entropy = ctx.saved_tensors
        T, C = ctx.temperature, ctx.chunk_size
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dtype = lse.dtype
        zero = torch.zeros((), dtype=dtype)
        a = torch.where(valid, grad_logp.to(dtype), zero)  # (N,)
        b = torch.where(valid, grad_entropy.to(dtype), zero)  # (N,)
        w = weight.to(dtype)  # (V, H)
        d_hidden = torch.zeros(hidden.shape, dtype=dtype, device=hidden.device) if need_h else None  # (N, H)
        d_weight = torch.zeros(w.shape, dtype=dtype, device=w.device) if need_w else None  # (V, H)
        rows = torch.arange(min(C, hidden.shape[0]), device=hidden.device)  # (C,)
        zbuf = torch.empty(rows.shape[0], w.shape[0], dtype=dtype, device=w.device)  # (C, V) reused
        pbuf = torch.empty_like(zbuf)  # (C, V)
        for s in range(0, hidden.shape[0], C):
            e = min(s + C, hidden.shape[0])
            h = hidden[s:e].to(dtype) / T  # (C, H) the same rounding as forward
            logp = torch.mm(h, w.T, out=zbuf[: e - s]).sub_(lse[s:e, None])  # (C, V) recomputed log-softmax
            p = torch.exp(logp, out=pbuf[: e - s])  # (C, V)
            # G = -p (a + b (log p + H)) + a onehot(y), built in logp's buffer to keep two (C, V) tensors.
            g = logp.add_(entropy[s:e, None]).mul_(b[s:e, None]).add_(a[s:e, None]).mul_(p).neg_()  # (C, V)
            g[rows[: e - s], y[s:e]] += a[s:e]
            if need_h:
                torch.mm(g, w, out=d_hidden[s:e]).div_(T)  # (C, H)
            if need_w:
                d_weight.addmm_(g.T, h)  # (V, H) h already carries the 1/T
        return (d_hidden.to(hidden.dtype) if need_h else None, d_weight.to(weight.dtype) if need_w else None,
                None, None, None, None)


def token_logprobs_and_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, temperature: float = 1.0,
                               chunk_size: Optional[int] = None,
                               ignore_index: int = IGNORE_INDEX) -> tuple[Tensor, Tensor]:
    """Log π(labels) and the entropy of π at every position, from hidden states and the LM-head weight.

    hidden (B, T, H), weight (V, H), labels (B, T) int -> (log_probs (B, T), entropy (B, T)), in float32
    (float64 for float64 inputs), with logits = hidden @ weight.T / temperature. Ignored positions (label ==
    ignore_index or < 0) give 0 for both and no gradient. Differentiable w.r.t. hidden and weight; memory is
    O(chunk_size · V + N) beyond the inputs and their gradients. chunk_size=None: ~64 MiB of logits a chunk.
    """
    B, T, H = hidden.shape
    if weight.dim() != 2 or weight.shape[1] != H or labels.shape != (B, T):
        raise ValueError(f"shapes: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}, "
                         f"labels {tuple(labels.shape)}; want (B, T, H), (V, H), (B, T)")
    chunk = chunk_size or default_chunk_size(weight.shape[0], _compute_dtype(hidden, weight))
    logp, ent = _ChunkedLogProbEntropy.apply(hidden.reshape(B * T, H), weight, labels.reshape(B * T),
                                             float(temperature), int(chunk), ignore_index)
    return logp.view(B, T), ent.view(B, T)


def _logits_chunk(z: Tensor, y: Tensor, valid: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    logp_y, entropy, _ = _chunk_stats(z.to(_compute_dtype(z)) / temperature, y, valid)  # (C,) each
    return logp_y, entropy


def logprobs_and_entropy_from_logits(logits: Tensor, labels: Tensor, *, temperature: float = 1.0,
                                     chunk_size: Optional[int] = None,
                                     ignore_index: int = IGNORE_INDEX) -> tuple[Tensor, Tensor]:
    """As `token_logprobs_and_entropy`, for callers that already hold logits (B, T, V).

    Chunked over tokens so that the float32 log-softmax exists one chunk at a time. With autograd on, each
    chunk is checkpointed: backward recomputes its softmax instead of keeping (N, V) intermediates, so the
    extra memory beyond the logits and their gradient stays O(chunk_size · V).
    """
    B, T, V = logits.shape
    z, labels = logits.reshape(B * T, V), labels.reshape(B * T)  # (N, V), (N,)
    valid = _check(labels, V, temperature, ignore_index)  # (N,)
    y = torch.where(valid, labels, torch.zeros_like(labels))  # (N,)
    chunk = chunk_size or default_chunk_size(V, _compute_dtype(logits))
    grad = torch.is_grad_enabled() and logits.requires_grad
    outs = []
    for s in range(0, B * T, chunk):
        args = (z[s:s + chunk], y[s:s + chunk], valid[s:s + chunk], float(temperature))
        outs.append(checkpoint(_logits_chunk, *args, use_reentrant=False) if grad else _logits_chunk(*args))
    logp = torch.cat([o[0] for o in outs])  # (N,)
    ent = torch.cat([o[1] for o in outs])  # (N,)
    return logp.view(B, T), ent.view(B, T)


def naive_logprobs_and_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, temperature: float = 1.0,
                               ignore_index: int = IGNORE_INDEX) -> tuple[Tensor, Tensor]:
    """Reference: full (B, T, V) logits, log_softmax, gather; plain autograd. For tests and the benchmark."""
    dtype = _compute_dtype(hidden, weight)
    logits = hidden.to(dtype) @ weight.to(dtype).T / temperature  # (B, T, V)
    logp_all = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    valid = (labels != ignore_index) & (labels >= 0)  # (B, T)
    y = torch.where(valid, labels, torch.zeros_like(labels))  # (B, T)
    logp = logp_all.gather(-1, y[..., None]).squeeze(-1)  # (B, T)
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, T)
    zero = torch.zeros((), dtype=dtype)
    return torch.where(valid, logp, zero), torch.where(valid, entropy, zero)
