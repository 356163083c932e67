"""take_positions: advanced indexing's values, with a backward that repeats bit for bit at several threads (a prompt's
last position, taken once per sample, gets its gradients added in a fixed order)."""

from __future__ import annotations

import torch

from verl.utils.shared_prefix import take_positions


def _case():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(15, 38, 128, generator=g, requires_grad=True)
    rows, cols = torch.randint(0, 15, (128, 8), generator=g), torch.randint(0, 38, (128, 8), generator=g)
    rows[:, 0], cols[:, 0] = torch.arange(128) // 9, 5  # each group's 9 samples share the position of their first
    return x, rows, cols, torch.randn(128, 8, 128, generator=g)


def test_the_values_and_gradients_of_advanced_indexing():
    x, rows, cols, grad = _case()
    assert torch.equal(take_positions(x, rows, cols), x[rows, cols])
    (a,) = torch.autograd.grad(take_positions(x, rows, cols), x, grad)
    (b,) = torch.autograd.grad(x[rows, cols], x, grad)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)  # the same sums, maybe in another order


def test_the_backward_repeats_bit_for_bit_at_two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x, rows, cols, grad = _case()
        first = torch.autograd.grad(take_positions(x, rows, cols), x, grad)[0]
        for _ in range(20):  # advanced indexing's backward differed in 50 of 50 repeats here
            assert torch.equal(torch.autograd.grad(take_positions(x, rows, cols), x, grad)[0], first)
    finally:
        torch.set_num_threads(threads)
