"""The vocab-parallel form on 2 gloo ranks equals the single-rank result, values and gradients."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

WORLD = 2
V = 101
SHARDS = [(0, 40), (40, V)]  # uneven on purpose: 40 and 61 rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max|actual - expected| / max|expected| over the whole tensor."""
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def problem(n, h, dtype, seed=0):
    # Every rank draws the same full problem from the same seed, then keeps its shard of the weight.
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(dtype)
    weight = torch.randn(V, h, generator=g).to(dtype)
    labels = torch.randint(0, V, (n,), generator=g)
    labels[[1, n - 3]] = -100
    labels[0], labels[2] = 39, 40  # labels on both sides of the shard boundary
    g_lp, g_ent = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)
    return hidden, weight, labels, g_lp.float(), g_ent.float()


def grads(fn, hidden, weight, labels, g_lp, g_ent, entropy_grad, lead):
    hidden = hidden.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    lp, ent = fn(hidden.view(*lead, -1), weight, labels.view(lead))
    assert lp.shape == ent.shape == lead
    lp, ent = lp.reshape(-1), ent.reshape(-1)
    loss = (lp * g_lp).sum() + ((ent * g_ent).sum() if entropy_grad else 0.0)
    loss.backward()
    return lp.detach(), ent.detach(), hidden.grad, weight.grad


class CountAllReduce:
    """Wraps dist.all_reduce to record (op, shape) of every call."""

    def __init__(self):
        self.calls, self.inner = [], dist.all_reduce

    def __call__(self, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        self.calls.append((op, tuple(tensor.shape)))
        return self.inner(tensor, op=op, group=group, async_op=async_op)


def _check_rank(rank: int, impl: str) -> None:
    from verl_kernels import linear_logprob_entropy, vocab_parallel_linear_logprob_entropy

    start, end = SHARDS[rank]
    small = impl == "triton"  # the Triton interpreter is slow; keep its problem tiny
    cases = [
        # (N, H, dtype, temperature, entropy_grad, leading shape, value/grad bounds)
        (23, 12 if not small else 16, torch.float32, 0.8, True, (23,), (1e-5, 1e-5)),
        (23, 12 if not small else 16, torch.float32, 1.0, False, (1, 23), (1e-5, 1e-5)),
        (20, 8 if not small else 16, torch.bfloat16, 1.3, True, (4, 5), (1e-5, 1e-2)),
    ]
    for n, h, dtype, temperature, entropy_grad, lead, (value_tol, grad_tol) in cases:
        hidden, weight, labels, g_lp, g_ent = problem(n, h, dtype)
        kw = {
            "temperature": temperature,
            "entropy_grad": entropy_grad,
            "impl": impl,
            "chunk_tokens": 8,
            "chunk_vocab": 16,
        }

        def vp(hh, ww, yy, kw=kw):
            return vocab_parallel_linear_logprob_entropy(hh, ww, yy, vocab_start=start, group=None, **kw)

        def single(hh, ww, yy, kw=kw):
            return linear_logprob_entropy(hh, ww, yy, **kw)

        counter = CountAllReduce()
        dist.all_reduce = counter
        try:
            got = grads(vp, hidden, weight[start:end], labels, g_lp, g_ent, entropy_grad, lead)
        finally:
            dist.all_reduce = counter.inner
        want = grads(single, hidden, weight, labels, g_lp, g_ent, entropy_grad, lead)
        want = (*want[:3], want[3][start:end])  # this rank's rows of the full weight gradient
        case = (rank, impl, dtype, temperature, entropy_grad)
        for name, a, b, tol in zip(
            ("logprob", "entropy", "grad_hidden", "grad_weight"), got, want, (value_tol,) * 2 + (grad_tol,) * 2
        ):
            assert rel_err(a, b) <= tol, (case, name, rel_err(a, b))
        # Forward: MAX over [N], then one SUM over [4, N]; backward: one SUM over the hidden gradient.
        assert counter.calls == [(dist.ReduceOp.MAX, (n,)), (dist.ReduceOp.SUM, (4, n)), (dist.ReduceOp.SUM, (n, h))], (
            case,
            counter.calls,
        )

    # reduce_grad_hidden=False leaves this shard's part of the hidden gradient; the parts sum to the full one.
    hidden, weight, labels, g_lp, g_ent = problem(9, 16, torch.float32, seed=3)
    h_local = hidden.clone().requires_grad_()
    lp, _ = vocab_parallel_linear_logprob_entropy(
        h_local,
        weight[start:end],
        labels,
        vocab_start=start,
        group=dist.group.WORLD,
        impl=impl,
        reduce_grad_hidden=False,
    )
    (lp * g_lp).sum().backward()
    h_full = hidden.clone().requires_grad_()
    lp_full, _ = linear_logprob_entropy(h_full, weight, labels, impl=impl)
    (lp_full * g_lp).sum().backward()
    part = h_local.grad.clone()
    dist.all_reduce(part)
    assert rel_err(part, h_full.grad) <= 1e-5
    assert rel_err(h_local.grad, h_full.grad) > 1e-2  # one shard alone is not the whole gradient

    # A label no shard holds is an error on every rank (the hit count travels in the SUM all-reduce).
    labels[4] = V
    with pytest.raises(ValueError, match=r"labels: 1 label\(s\) outside the vocabulary covered by the shards"):
        vocab_parallel_linear_logprob_entropy(
            hidden, weight[start:end], labels, vocab_start=start, group=None, impl=impl
        )


def _worker(rank: int, port: int, impl: str) -> None:
    if impl == "triton" and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before verl_kernels.triton_kernels is imported in this process
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        _check_rank(rank, impl)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("impl", ["chunked", "triton"])
def test_two_gloo_ranks_match_a_single_rank(impl):
    if impl == "triton":
        pytest.importorskip("triton", reason="triton is not installed")
    # Each rank raises on a mismatch; spawn re-raises it here with the rank's traceback.
    mp.spawn(_worker, args=(free_port(), impl), nprocs=WORLD, join=True)
