"""Values and gradients worked out by hand, for every CPU implementation (the Triton file repeats them)."""

from __future__ import annotations

import math

import pytest
import torch

from verl_kernels import linear_logprob_entropy

LN2 = math.log(2.0)

# weight [V=3, H=2] picks coordinates: logits = (h0, h1, 0) / T.
WEIGHT = [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]


def hand_case(temperature: float):
    """Row 0: logits (0, ln2, 0) after temperature, label 1.   Row 1: label -100 (ignored).

    softmax = (1, 2, 1) / 4, logsumexp = ln 4 = 2 ln2
    logprob(label 1) = ln2 - 2 ln2 = -ln2
    entropy = -(1/4 ln(1/4) * 2 + 1/2 ln(1/2)) = ln2 + ln2 / 2 = 1.5 ln2
    """
    h = torch.tensor([[0.0, LN2 * temperature], [3.0, -1.0]], dtype=torch.float64, requires_grad=True)
    w = torch.tensor(WEIGHT, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1, -100])
    return h, w, y


@pytest.mark.parametrize("impl", ["naive", "chunked", "torch"])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_values_by_hand(impl, temperature):
    h, w, y = hand_case(temperature)
    lp, ent = linear_logprob_entropy(h, w, y, temperature=temperature, impl=impl, chunk_tokens=1, chunk_vocab=2)
    torch.testing.assert_close(lp, torch.tensor([-LN2, 0.0], dtype=torch.float64))
    torch.testing.assert_close(ent, torch.tensor([1.5 * LN2, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("impl", ["naive", "chunked"])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_logprob_gradient_by_hand(impl, temperature):
    h, w, y = hand_case(temperature)
    lp, _ = linear_logprob_entropy(h, w, y, temperature=temperature, impl=impl, chunk_tokens=1, chunk_vocab=2)
    lp.sum().backward()
    # dlogprob/dz = onehot(1) - p = (-1/4, 1/2, -1/4); z = h W^T / T, so
    # dh = (dz @ W) / T = (-1/4, 1/2) / T   and   dW = dz^T h / T = outer(dz, h0) / T.
    dz = torch.tensor([-0.25, 0.5, -0.25], dtype=torch.float64)
    h0 = torch.tensor([0.0, LN2 * temperature], dtype=torch.float64)
    torch.testing.assert_close(h.grad, torch.tensor([[-0.25, 0.5], [0.0, 0.0]], dtype=torch.float64) / temperature)
    torch.testing.assert_close(w.grad, torch.outer(dz, h0) / temperature)


@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_entropy_gradient_by_hand(impl):
    h, w, y = hand_case(1.0)
    _, ent = linear_logprob_entropy(h, w, y, impl=impl, entropy_grad=True, chunk_tokens=1, chunk_vocab=2)
    ent.sum().backward()
    # dH/dz_j = -p_j (z_j - logsumexp + H); z - lse + H = (0, ln2, 0) - 2 ln2 + 1.5 ln2 = (-1/2, 1/2, -1/2) ln2
    # so dH/dz = -(1/4, 1/2, 1/4) * (-1/2, 1/2, -1/2) ln2 = (1/8, -1/4, 1/8) ln2, and dh = dH/dz @ W = (1/8, -1/4) ln2.
    torch.testing.assert_close(h.grad, torch.tensor([[0.125 * LN2, -0.25 * LN2], [0.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_entropy_is_detached_unless_asked(impl):
    h, w, y = hand_case(1.0)
    lp, ent = linear_logprob_entropy(h, w, y, impl=impl)
    assert lp.requires_grad and not ent.requires_grad
    _, ent = linear_logprob_entropy(h, w, y, impl=impl, entropy_grad=True)
    assert ent.requires_grad


def test_uniform_rows():
    # All-zero hidden: logits 0 over V = 5 classes, p = 1/5: logprob = -ln 5, entropy = ln 5, for any label.
    h = torch.zeros(4, 3)
    w = torch.randn(5, 3)
    y = torch.tensor([0, 4, 2, 2])
    lp, ent = linear_logprob_entropy(h, w, y, chunk_tokens=3, chunk_vocab=2)
    torch.testing.assert_close(lp, torch.full((4,), -math.log(5.0)))
    torch.testing.assert_close(ent, torch.full((4,), math.log(5.0)))
