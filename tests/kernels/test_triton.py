"""Triton kernels against the reference; on CPU through the Triton interpreter at small shapes."""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # triton chose compiled mode when it was first imported; the interpreter cannot be switched on now.
        pytest.skip(
            "triton was imported before TRITON_INTERPRET=1 could be set: run this file in its own process "
            "(as `pants test` does)",
            allow_module_level=True,
        )
    # Must precede the first import of the kernels: triton.jit picks interpreter or compiler when it decorates.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="triton is not installed")

from verl_kernels import chunked, linear_logprob_entropy, triton_kernels

if not torch.cuda.is_available() and not triton_kernels.INTERPRETED:
    pytest.skip(
        "no CUDA, and verl_kernels.triton_kernels was imported before TRITON_INTERPRET=1 was set",
        allow_module_level=True,
    )

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (interpreter is too slow)")
LN2 = math.log(2.0)
FP32_RTOL = 1e-5
BF16_VALUE_RTOL = 1e-5  # tiles are multiplied exactly (bf16 products fit float32) and summed in float32
BF16_GRAD_RTOL = 1e-2  # dL/dlogits and the returned gradients are bf16: 2^-8 = 3.9e-3 relative per element


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max|actual - expected| / max|expected| over the whole tensor."""
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def problem(n, h, v, dtype=torch.float32, masked=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(dtype)
    weight = torch.randn(v, h, generator=g).to(dtype)
    labels = torch.randint(0, v, (n,), generator=g)
    labels[list(masked)] = -100
    return hidden.to(DEVICE), weight.to(DEVICE), labels.to(DEVICE)


def run(hidden, weight, labels, impl, entropy_grad, temperature=1.0, **kw):
    """(logprob, entropy, grad_hidden, grad_weight) of a fixed random linear loss."""
    hidden = hidden.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    lp, ent = linear_logprob_entropy(
        hidden, weight, labels, impl=impl, temperature=temperature, entropy_grad=entropy_grad, **kw
    )
    g = torch.Generator().manual_seed(1)
    g_lp = torch.randn(lp.shape, generator=g, dtype=torch.float64).to(lp)
    g_ent = torch.randn(ent.shape, generator=g, dtype=torch.float64).to(ent)
    loss = (lp * g_lp).sum() + ((ent * g_ent).sum() if entropy_grad else 0.0)
    grad_h, grad_w = torch.autograd.grad(loss, (hidden, weight))
    return lp.detach(), ent.detach(), grad_h, grad_w


def expected(hidden, weight, labels, entropy_grad, temperature=1.0):
    return run(hidden.double().cpu(), weight.double().cpu(), labels.cpu(), "naive", entropy_grad, temperature)


def test_values_and_gradient_by_hand():
    # logits (0, ln2, 0) after T = 2: p = (1, 2, 1)/4, logprob(1) = -ln2, entropy = 1.5 ln2 (see test_reference.py);
    # dlogprob/dh = (onehot(1) - p) @ W / T = (-1/4, 1/2) / 2. Row 1 is ignored: 0, 0, no gradient.
    h = torch.tensor([[0.0, 2 * LN2], [3.0, -1.0]], device=DEVICE, requires_grad=True)
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], device=DEVICE)
    y = torch.tensor([1, -100], device=DEVICE)
    lp, ent = linear_logprob_entropy(h, w, y, temperature=2.0, impl="triton")
    torch.testing.assert_close(lp.cpu(), torch.tensor([-LN2, 0.0]))
    torch.testing.assert_close(ent.cpu(), torch.tensor([1.5 * LN2, 0.0]))
    lp.sum().backward()
    torch.testing.assert_close(h.grad.cpu(), torch.tensor([[-0.125, 0.25], [0.0, 0.0]]))


# N and V not multiples of the 16 x 32 interpreter tiles; chunk sizes that leave partial chunks in backward.
@pytest.mark.parametrize("n,h,v,ct,cv", [(19, 20, 77, 8, 40), (33, 40, 603, 16, 250), (1, 16, 5, 64, 128)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_fp32_matches_reference(n, h, v, ct, cv, temperature, entropy_grad):
    hidden, weight, labels = problem(n, h, v, masked=[0] if n > 1 else [])
    got = run(hidden, weight, labels, "triton", entropy_grad, temperature, chunk_tokens=ct, chunk_vocab=cv)
    want = expected(hidden, weight, labels, entropy_grad, temperature)
    for name, a, b in zip(("logprob", "entropy", "grad_hidden", "grad_weight"), got, want):
        assert a.dtype == torch.float32, name
        assert rel_err(a, b) <= FP32_RTOL, (name, rel_err(a, b))


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_bf16_within_stated_bounds(entropy_grad):
    hidden, weight, labels = problem(21, 24, 300, torch.bfloat16, masked=[4])
    lp, ent, gh, gw = run(hidden, weight, labels, "triton", entropy_grad, 0.8, chunk_tokens=16, chunk_vocab=96)
    want = expected(hidden, weight, labels, entropy_grad, 0.8)
    assert lp.dtype == ent.dtype == torch.float32 and gh.dtype == gw.dtype == torch.bfloat16
    assert rel_err(lp, want[0]) <= BF16_VALUE_RTOL
    assert rel_err(ent, want[1]) <= BF16_VALUE_RTOL
    assert rel_err(gh, want[2]) <= BF16_GRAD_RTOL
    assert rel_err(gw, want[3]) <= BF16_GRAD_RTOL


def test_masked_rows_and_leading_dims():
    hidden, weight, labels = problem(12, 16, 70, masked=[1, 6])
    h3 = hidden.view(3, 4, 16).requires_grad_()
    lp, ent = linear_logprob_entropy(h3, weight, labels.view(3, 4), impl="triton", entropy_grad=True)
    assert lp.shape == ent.shape == (3, 4)
    assert lp.reshape(-1)[[1, 6]].eq(0).all() and ent.reshape(-1)[[1, 6]].eq(0).all()
    (lp.sum() + ent.sum()).backward()
    assert h3.grad.reshape(12, 16)[[1, 6]].eq(0).all()
    want = expected(hidden, weight, labels, False)
    assert rel_err(lp.reshape(-1), want[0]) <= FP32_RTOL


def test_partials_of_a_vocabulary_shard_match_the_chunked_kernels():
    # The vocab-parallel form feeds each rank's shard with global labels and its vocab_start.
    hidden, weight, labels = problem(17, 16, 90)
    shard, start = weight[37:81], 37
    got = triton_kernels.partials(hidden, shard, labels, start, 1 / 0.9, 0, 0)
    want = chunked.partials(hidden, shard, labels, start, 1 / 0.9, 5, 13)
    for name, a, b in zip(got._fields, got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
    # Rows whose label is outside the shard carry no label logit.
    outside = (labels < 37) | (labels >= 81)
    assert got.label_logit[outside].eq(0).all() and outside.any()


def test_no_tokens():
    hidden, weight, labels = problem(0, 16, 40)
    lp, _ent, gh, gw = run(hidden, weight, labels, "triton", True)
    assert lp.shape == (0,) and gh.shape == (0, 16) and gw.eq(0).all()


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["triton", "chunked"])
def test_cuda_at_model_like_sizes(dtype, impl):
    hidden, weight, labels = problem(2000, 512, 50257, dtype, masked=range(0, 2000, 7))
    got = run(hidden, weight, labels, impl, True, 0.9, chunk_tokens=1024, chunk_vocab=8192)
    want = expected(hidden, weight, labels, True, 0.9)
    bounds = (FP32_RTOL,) * 4 if dtype == torch.float32 else (BF16_VALUE_RTOL,) * 2 + (BF16_GRAD_RTOL,) * 2
    for name, a, b, bound in zip(("logprob", "entropy", "grad_hidden", "grad_weight"), got, want, bounds):
        assert rel_err(a, b) <= bound, (name, rel_err(a, b))
