"""klear_lib.logprobs: the chunked custom-autograd log-prob/entropy against the naive (B, T, V) computation."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from klear_lib.logprobs import (
    _ChunkedLogProbEntropy,
    default_chunk_size,
    logprobs_and_entropy_from_logits,
    naive_logprobs_and_entropy,
    token_logprobs_and_entropy,
)

VAL_TOL, GRAD_TOL = 1e-5, 1e-4


def make(B, T, H, V, dtype=torch.float64, seed=0, ignore_frac=0.25, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(B, T, H, generator=g, dtype=torch.float64) * scale).to(dtype)  # (B, T, H)
    weight = (torch.randn(V, H, generator=g, dtype=torch.float64) / math.sqrt(H) * scale).to(dtype)  # (V, H)
    labels = torch.randint(0, V, (B, T), generator=g)  # (B, T)
    labels[torch.rand(B, T, generator=g) < ignore_frac] = -100  # padding
    return hidden, weight, labels


def values_and_grads(fn, hidden, weight, labels, a, b, **kw):
    """Outputs of fn and d/d(hidden, weight) of (a·logp + b·H).sum(), a random mix of both outputs."""
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = fn(h, w, labels, **kw)
    (a * logp + b * ent).sum().backward()
    return logp.detach(), ent.detach(), h.grad, w.grad


def assert_matches_naive(hidden, weight, labels, temperature=1.0, chunk_size=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(labels.shape, generator=g, dtype=torch.float64)  # (B, T)
    b = torch.randn(labels.shape, generator=g, dtype=torch.float64)  # (B, T)
    out = values_and_grads(token_logprobs_and_entropy, hidden, weight, labels, a, b,
                           temperature=temperature, chunk_size=chunk_size)
    ref = values_and_grads(naive_logprobs_and_entropy, hidden, weight, labels, a, b, temperature=temperature)
    for got, want, tol in zip(out, ref, (VAL_TOL, VAL_TOL, GRAD_TOL, GRAD_TOL)):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    return out


# (B, T, H, V, chunk_size, temperature): chunks that do not divide N, chunk 1, chunk > N, B or T = 1.
CASES = [
    (2, 7, 5, 11, 3, 1.0),
    (3, 5, 4, 13, 1, 0.7),
    (1, 9, 6, 17, 4, 1.3),
    (4, 1, 3, 10, None, 1.0),
    (2, 6, 8, 50, 5, 2.0),
    (2, 3, 4, 9, 100, 0.5),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("B,T,H,V,chunk,temp", CASES)
def test_matches_naive_values_and_gradients(dtype, B, T, H, V, chunk, temp):
    hidden, weight, labels = make(B, T, H, V, dtype)
    assert_matches_naive(hidden, weight, labels, temperature=temp, chunk_size=chunk)


def test_chunk_size_does_not_change_the_result():
    hidden, weight, labels = make(3, 11, 6, 23)
    a, b = torch.randn(3, 11, dtype=torch.float64), torch.randn(3, 11, dtype=torch.float64)
    runs = [values_and_grads(token_logprobs_and_entropy, hidden, weight, labels, a, b, chunk_size=c, temperature=0.8)
            for c in (1, 4, 7, 33, None)]
    for run in runs[1:]:
        for x, y in zip(run, runs[0]):
            torch.testing.assert_close(x, y, atol=1e-12, rtol=1e-12)


def test_gradcheck_float64():
    hidden, weight, labels = make(2, 3, 3, 5)
    labels[0, 1] = -100
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda h, w: token_logprobs_and_entropy(h, w, labels, temperature=0.7, chunk_size=2), (h, w))


def test_gradcheck_from_logits_float64():
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[0, 4, -100], [2, 2, 1]])
    assert torch.autograd.gradcheck(
        lambda z: logprobs_and_entropy_from_logits(z, labels, temperature=1.3, chunk_size=4), (logits,))


@pytest.mark.parametrize("chunk", [1, 4, None])
def test_from_logits_matches_naive(chunk):
    hidden, weight, labels = make(2, 5, 4, 12)
    logits = (hidden @ weight.T).requires_grad_()  # (B, T, V)
    logp, ent = logprobs_and_entropy_from_logits(logits, labels, temperature=0.6, chunk_size=chunk)
    g = torch.autograd.grad((logp * 0.3 - ent).sum(), logits)[0]
    z = logits.detach().clone().requires_grad_()
    # naive with weight = identity: logits = z @ I.T
    rlogp, rent = naive_logprobs_and_entropy(z, torch.eye(12, dtype=torch.float64), labels, temperature=0.6)
    rg = torch.autograd.grad((rlogp * 0.3 - rent).sum(), z)[0]
    torch.testing.assert_close(logp, rlogp, atol=VAL_TOL, rtol=VAL_TOL)
    torch.testing.assert_close(ent, rent, atol=VAL_TOL, rtol=VAL_TOL)
    torch.testing.assert_close(g, rg, atol=GRAD_TOL, rtol=GRAD_TOL)
    with torch.no_grad():  # the no-grad path (no checkpoint) gives the same values
        nlogp, nent = logprobs_and_entropy_from_logits(logits, labels, temperature=0.6, chunk_size=chunk)
    torch.testing.assert_close(nlogp, logp.detach(), atol=0, rtol=0)


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 6), H=st.integers(1, 5), V=st.integers(2, 15),
       chunk=st.one_of(st.none(), st.integers(1, 8)), temp=st.floats(0.3, 3.0), seed=st.integers(0, 10**6),
       dtype=st.sampled_from([torch.float64, torch.float32]))
def test_hypothesis_shapes(B, T, H, V, chunk, temp, seed, dtype):
    hidden, weight, labels = make(B, T, H, V, dtype, seed=seed)
    assert_matches_naive(hidden, weight, labels, temperature=temp, chunk_size=chunk, seed=seed + 1)


def test_invariants_and_padding():
    hidden, weight, labels = make(3, 8, 5, 20, torch.float32, scale=4.0, ignore_frac=0.3)
    labels[0, 0] = -7  # any negative label is padding too
    logp, ent, gh, _ = values_and_grads(token_logprobs_and_entropy, hidden, weight, labels,
                                        torch.ones(3, 8), torch.ones(3, 8), chunk_size=3)
    valid = labels >= 0
    assert (logp <= 0).all() and (ent >= -1e-6).all() and (ent <= math.log(20) + 1e-5).all()
    assert (logp[~valid] == 0).all() and (ent[~valid] == 0).all()
    assert (gh[~valid] == 0).all() and (gh[valid].abs().sum(-1) > 0).all()  # padding gets no gradient


def test_custom_ignore_index_and_uniform_entropy():
    hidden = torch.zeros(1, 3, 4)  # zero hidden -> uniform distribution: H = log V, logp = -log V
    weight = torch.randn(7, 4)
    labels = torch.tensor([[3, 5, 6]])
    logp, ent = token_logprobs_and_entropy(hidden, weight, labels, ignore_index=5)
    torch.testing.assert_close(ent, torch.tensor([[math.log(7), 0.0, math.log(7)]]))
    torch.testing.assert_close(logp, torch.tensor([[-math.log(7), 0.0, -math.log(7)]]))


def test_one_output_only_and_no_weight_grad():
    hidden, weight, labels = make(2, 4, 3, 9)
    h = hidden.clone().requires_grad_()
    _, ent = token_logprobs_and_entropy(h, weight, labels, chunk_size=3)  # weight needs no grad
    ent.sum().backward()
    rh = hidden.clone().requires_grad_()
    naive_logprobs_and_entropy(rh, weight, labels)[1].sum().backward()
    torch.testing.assert_close(h.grad, rh.grad, atol=GRAD_TOL, rtol=GRAD_TOL)


def test_bf16_inputs_compute_in_float32():
    hidden, weight, labels = make(2, 5, 8, 30, torch.bfloat16)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = token_logprobs_and_entropy(h, w, labels, chunk_size=4)
    assert logp.dtype == ent.dtype == torch.float32
    rlogp, rent = naive_logprobs_and_entropy(hidden.float(), weight.float(), labels)
    torch.testing.assert_close(logp, rlogp, atol=VAL_TOL, rtol=VAL_TOL)
    torch.testing.assert_close(ent, rent, atol=VAL_TOL, rtol=VAL_TOL)
    (logp + ent).sum().backward()
    assert h.grad.dtype == w.grad.dtype == torch.bfloat16


def test_errors():
    hidden, weight, labels = make(1, 3, 2, 5)
    with pytest.raises(ValueError, match="vocabulary"):
        token_logprobs_and_entropy(hidden, weight, torch.tensor([[0, 5, 1]]))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_and_entropy(hidden, weight, labels, temperature=0.0)
    with pytest.raises(ValueError, match="shapes"):
        token_logprobs_and_entropy(hidden, weight[:, :1], labels)


def test_default_chunk_size_is_64_mib_of_logits():
    assert default_chunk_size(151_936) == 110  # 64 MiB / (151,936 × 4 B)
    assert default_chunk_size(151_936, torch.float64) == 55
    assert default_chunk_size(10**9) == 1


def saved_numels(fn):
    """Run fn() under saved-tensor hooks; return the element count of every tensor autograd saved."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sizes


def test_forward_saves_no_n_by_v_tensor():
    B, T, H, V = 2, 32, 8, 50_000  # N = 64 tokens
    hidden, weight, labels = make(B, T, H, V, torch.float32)
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    (logp, ent), sizes = saved_numels(lambda: token_logprobs_and_entropy(h, w, labels))
    node = logp.grad_fn.next_functions[0][0]  # under the (B, T) view
    assert type(node).__name__ == _ChunkedLogProbEntropy.__name__ + "Backward"
    assert sizes and max(sizes) < B * T * V  # hidden, weight, labels, mask, lse, entropy: O(N) + inputs
    assert sum(s for s in sizes if s != V * H) <= 4 * B * T * H  # nothing but O(N·H) besides the weight
    # The check can fail: the naive version saves (N, V) tensors under the same hooks.
    _, naive_sizes = saved_numels(lambda: naive_logprobs_and_entropy(h, w, labels))
    assert max(naive_sizes) >= B * T * V
