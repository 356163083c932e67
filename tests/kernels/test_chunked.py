"""The chunked torch kernels against the naive reference: values, gradients, properties, memory structure."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from verl_kernels import linear_logprob_entropy

# Relative error is max|actual - expected| / max|expected| over the whole tensor.
FP32_RTOL = 1e-5
BF16_VALUE_RTOL = 1e-5  # values are computed exactly in float32 from the bf16 inputs
BF16_GRAD_RTOL = 1e-2  # gradients are returned in bf16: 2^-8 = 3.9e-3 relative rounding per element


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.double()
    return float((actual.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def problem(n, h, v, dtype=torch.float32, masked=(), seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g) * scale).to(dtype)
    weight = (torch.randn(v, h, generator=g) * scale).to(dtype)
    labels = torch.randint(0, v, (n,), generator=g)
    labels[list(masked)] = -100
    return hidden, weight, labels


def run(hidden, weight, labels, impl, entropy_grad, temperature=1.0, seed=1, **kw):
    """(logprob, entropy, grad_hidden, grad_weight) of a random linear loss on logprob (and entropy)."""
    hidden = hidden.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    lp, ent = linear_logprob_entropy(
        hidden, weight, labels, impl=impl, temperature=temperature, entropy_grad=entropy_grad, **kw
    )
    g = torch.Generator().manual_seed(seed)
    g_lp = torch.randn(lp.shape, generator=g, dtype=torch.float64).to(lp.dtype)
    g_ent = torch.randn(ent.shape, generator=g, dtype=torch.float64).to(ent.dtype)
    loss = (lp * g_lp).sum() + ((ent * g_ent).sum() if entropy_grad else 0.0)
    grad_h, grad_w = torch.autograd.grad(loss, (hidden, weight))
    return lp.detach(), ent.detach(), grad_h, grad_w


def expected(hidden, weight, labels, entropy_grad, temperature=1.0):
    """The reference in float64 from the same (possibly bf16-rounded) inputs: the exact answer to compare with."""
    return run(hidden.double(), weight.double(), labels, "naive", entropy_grad, temperature)


# Odd sizes: neither N nor V is a multiple of the chunks, and the last chunks are 1 wide.
SHAPES = [(37, 24, 203, 12, 67), (1, 5, 7, 4, 3), (50, 17, 129, 7, 32), (8, 3, 1000, 8, 999)]


@pytest.mark.parametrize("n,h,v,ct,cv", SHAPES)
@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_fp32_matches_reference(n, h, v, ct, cv, temperature, entropy_grad):
    hidden, weight, labels = problem(n, h, v, masked=[0, n // 2] if n > 2 else [])
    got = run(hidden, weight, labels, "chunked", entropy_grad, temperature, chunk_tokens=ct, chunk_vocab=cv)
    want = expected(hidden, weight, labels, entropy_grad, temperature)
    for name, a, b in zip(("logprob", "entropy", "grad_hidden", "grad_weight"), got, want):
        assert a.dtype == torch.float32, name
        assert rel_err(a, b) <= FP32_RTOL, (name, rel_err(a, b))


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_bf16_within_stated_bounds(entropy_grad):
    hidden, weight, labels = problem(45, 32, 301, torch.bfloat16, masked=[3])
    lp, ent, gh, gw = run(hidden, weight, labels, "chunked", entropy_grad, 0.8, chunk_tokens=16, chunk_vocab=64)
    want = expected(hidden, weight, labels, entropy_grad, 0.8)
    assert lp.dtype == ent.dtype == torch.float32
    assert gh.dtype == gw.dtype == torch.bfloat16
    assert rel_err(lp, want[0]) <= BF16_VALUE_RTOL
    assert rel_err(ent, want[1]) <= BF16_VALUE_RTOL
    assert rel_err(gh, want[2]) <= BF16_GRAD_RTOL
    assert rel_err(gw, want[3]) <= BF16_GRAD_RTOL


def test_masked_rows_give_zero_and_no_gradient():
    hidden, weight, labels = problem(20, 8, 50, masked=[2, 7, 19])
    lp, ent, gh, gw = run(hidden, weight, labels, "chunked", True, chunk_tokens=6, chunk_vocab=16)
    assert lp[[2, 7, 19]].eq(0).all() and ent[[2, 7, 19]].eq(0).all()
    assert gh[[2, 7, 19]].eq(0).all()
    # The masked rows contribute nothing to the weight gradient: dropping them changes nothing.
    keep = torch.ones(20, dtype=torch.bool)
    keep[[2, 7, 19]] = False
    hidden_k = hidden[keep].detach().requires_grad_()
    weight_k = weight.detach().requires_grad_()
    lp_k, ent_k = linear_logprob_entropy(hidden_k, weight_k, labels[keep], entropy_grad=True)
    g = torch.Generator().manual_seed(1)
    g_lp, g_ent = (torch.randn(20, generator=g, dtype=torch.float64).float() for _ in range(2))  # as run() draws
    ((lp_k * g_lp[keep]).sum() + (ent_k * g_ent[keep]).sum()).backward()
    torch.testing.assert_close(gw, weight_k.grad, rtol=1e-5, atol=1e-6)


def test_leading_dims_and_int32_labels():
    hidden, weight, labels = problem(12, 6, 31, masked=[5])
    lp, ent = linear_logprob_entropy(hidden.view(3, 4, 6), weight, labels.view(3, 4).int(), chunk_vocab=8)
    assert lp.shape == ent.shape == (3, 4)
    flat_lp, flat_ent = linear_logprob_entropy(hidden, weight, labels, chunk_vocab=8)
    torch.testing.assert_close(lp.reshape(-1), flat_lp)
    torch.testing.assert_close(ent.reshape(-1), flat_ent)


def test_non_contiguous_inputs():
    hidden, weight, labels = problem(19, 10, 41)
    hidden_t = hidden.T.contiguous().T  # column-major
    weight_t = weight.T.contiguous().T
    got = run(hidden_t, weight_t, labels, "chunked", True, chunk_tokens=5, chunk_vocab=9)
    want = expected(hidden, weight, labels, True)
    for a, b in zip(got, want):
        assert rel_err(a, b) <= FP32_RTOL


def test_only_the_needed_gradients():
    hidden, weight, labels = problem(9, 4, 13)
    h = hidden.clone().requires_grad_()
    lp, _ = linear_logprob_entropy(h, weight, labels, chunk_vocab=5)  # weight frozen
    lp.sum().backward()
    h64 = hidden.double().requires_grad_()
    lp64, _ = linear_logprob_entropy(h64, weight.double(), labels, impl="naive")
    lp64.sum().backward()
    assert weight.grad is None
    assert rel_err(h.grad, h64.grad) <= FP32_RTOL


def test_no_tokens():
    hidden, weight, labels = problem(0, 4, 13)
    lp, ent, gh, gw = run(hidden, weight, labels, "chunked", True)
    assert lp.shape == ent.shape == (0,) and gh.shape == (0, 4)
    assert gw.eq(0).all()


def test_gradcheck_float64():
    hidden, weight, labels = problem(7, 3, 11, torch.float64, masked=[4])

    def f(h, w):
        return linear_logprob_entropy(h, w, labels, temperature=0.7, entropy_grad=True, chunk_tokens=3, chunk_vocab=4)

    assert torch.autograd.gradcheck(f, (hidden.requires_grad_(), weight.requires_grad_()))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 24),
    h=st.integers(1, 9),
    v=st.integers(1, 40),
    ct=st.integers(1, 30),
    cv=st.integers(1, 50),
    temperature=st.floats(0.25, 4.0),
    scale=st.floats(0.1, 8.0),
    entropy_grad=st.booleans(),
    seed=st.integers(0, 2**16),
    mask_every=st.integers(2, 6),
)
def test_matches_reference_in_float64(n, h, v, ct, cv, temperature, scale, entropy_grad, seed, mask_every):
    hidden, weight, labels = problem(n, h, v, torch.float64, masked=range(0, n, mask_every), seed=seed, scale=scale)
    got = run(hidden, weight, labels, "chunked", entropy_grad, temperature, chunk_tokens=ct, chunk_vocab=cv)
    want = run(hidden, weight, labels, "naive", entropy_grad, temperature)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(h=st.integers(1, 6), v=st.integers(1, 30), scale=st.floats(0.1, 10.0), seed=st.integers(0, 2**16))
def test_logprobs_form_a_distribution_whose_entropy_is_returned(h, v, scale, seed):
    # One row asked about every label: exp(logprob) sums to 1 over the vocabulary, and -sum p log p over those
    # log-probs equals the entropy the kernel returns for that row (independent of the reference).
    hidden, weight, _ = problem(1, h, v, torch.float64, seed=seed, scale=scale)
    lp, ent = linear_logprob_entropy(hidden.expand(v, h), weight, torch.arange(v), chunk_tokens=7, chunk_vocab=3)
    assert torch.logsumexp(lp, 0).abs() < 1e-12
    assert torch.allclose(ent, -(lp.exp() * lp).sum().expand(v), rtol=1e-10, atol=1e-12)
    assert (lp <= 0).all() and 0 <= ent[0] <= math.log(v) + 1e-12


@settings(max_examples=20, deadline=None)
@given(temperature=st.floats(0.1, 10.0), seed=st.integers(0, 2**16))
def test_temperature_is_scaling_the_hidden_states(temperature, seed):
    hidden, weight, labels = problem(6, 4, 17, torch.float64, seed=seed)
    a = linear_logprob_entropy(hidden, weight, labels, temperature=temperature, chunk_vocab=5)
    b = linear_logprob_entropy(hidden / temperature, weight, labels, chunk_vocab=5)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_never_holds_full_logits(entropy_grad):
    n, h, v, ct, cv = 128, 8, 2000, 16, 128  # N*V = 256000; N*H = 1024, V*H = 16000, block = 2048
    hidden, weight, labels = problem(n, h, v)
    with LargestTensor() as mode:
        run(hidden, weight, labels, "chunked", entropy_grad, 0.9, chunk_tokens=ct, chunk_vocab=cv)
    assert mode.largest <= max(ct * cv, n * h, v * h) < n * v // 8
    # The same probe sees the naive path's [N, V] logits, so the bound above is a real check.
    with LargestTensor() as mode:
        run(hidden, weight, labels, "naive", entropy_grad, 0.9)
    assert mode.largest >= n * v
