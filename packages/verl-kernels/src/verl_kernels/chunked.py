"""Chunked torch kernels: blocks of [chunk_tokens, chunk_vocab] logits, never more, on any device.

Both passes walk the vocabulary in the outer loop and the tokens in the inner one, so each weight chunk is read
(and, for half-precision weights, upcast) once per pass, and the weight gradient of a chunk is finished before the
next chunk starts: no float32 [V, H] accumulator. Peak extra memory is two logits blocks plus [N, H] (scaled
hidden, hidden gradient) plus a [chunk_vocab, H] upcast weight chunk.

The backward recomputes each logits block with one matmul and turns it into gradients in place, so a full
forward+backward costs four [N, H] x [H, V] matmuls against the three of the unfused path, and touches no
[N, V] tensor.
"""

from __future__ import annotations

import torch

from verl_kernels.function import KernelOps
from verl_kernels.online_softmax import Partials, block_partials_, grad_logits_, merge
from verl_kernels.precision import accum_dtype

# Measured on 2 CPU cores at H=1024 (benchmarks/logprob_kernels.py): [1024..2048, 4096] blocks run the matmul at
# full speed and stay small (16-32 MiB in float32); GPUs want larger blocks to fill the device.
_DEFAULT_CHUNKS = {"cpu": (1024, 4096), "cuda": (8192, 8192)}


def default_chunks(device: torch.device) -> tuple[int, int]:
    return _DEFAULT_CHUNKS.get(device.type, _DEFAULT_CHUNKS["cuda"])


def _block(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A contiguous [rows, cols] view at the start of a flat buffer (matmul out= needs contiguity)."""
    return buf[: rows * cols].view(rows, cols)


def _scaled_hidden(hidden: torch.Tensor, inv_temp: float) -> torch.Tensor:
    # z = (h / T) W^T: one [N, H] scaling instead of one per logits block.
    h = hidden.to(accum_dtype(hidden.dtype))
    return h * inv_temp if inv_temp != 1.0 else h


def partials(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab_start: int,
    inv_temp: float,
    chunk_tokens: int,
    chunk_vocab: int,
) -> Partials:
    """Per-row partial state over the vocabulary rows of `weight` (global ids vocab_start + row)."""
    n, v = hidden.shape[0], weight.shape[0]
    acc = accum_dtype(hidden.dtype)
    out = Partials(*(torch.zeros(n, dtype=acc, device=hidden.device) for _ in range(4)))
    if n == 0:
        return out
    h = _scaled_hidden(hidden, inv_temp)
    local = labels - vocab_start
    ct, cv = min(chunk_tokens, n), min(chunk_vocab, v)
    z_buf = torch.empty(ct * cv, dtype=acc, device=hidden.device)
    e_buf = torch.empty_like(z_buf)
    for v0 in range(0, v, cv):
        w = weight[v0 : v0 + cv].to(acc)
        for n0 in range(0, n, ct):
            rows = slice(n0, n0 + ct)
            h_c = h[rows]
            z = torch.mm(h_c, w.T, out=_block(z_buf, h_c.shape[0], w.shape[0]))
            state = block_partials_(z, local[rows] - v0, _block(e_buf, *z.shape))
            if v0 > 0:
                state = merge(Partials(*(x[rows] for x in out)), state)
            for dst, src in zip(out, state):
                dst[rows] = src
    return out


def grads(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab_start: int,
    inv_temp: float,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    g_logprob: torch.Tensor,
    g_entropy: torch.Tensor | None,
    need_hidden: bool,
    need_weight: bool,
    chunk_tokens: int,
    chunk_vocab: int,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients for hidden (accumulation dtype) and weight (weight's dtype), recomputing logits block by block."""
    n, v = hidden.shape[0], weight.shape[0]
    acc = accum_dtype(hidden.dtype)
    grad_hidden = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_hidden else None
    grad_weight = torch.zeros_like(weight) if need_weight else None
    if n == 0 or not (need_hidden or need_weight):
        return grad_hidden, grad_weight
    h = _scaled_hidden(hidden, inv_temp)
    local = labels - vocab_start
    ct, cv = min(chunk_tokens, n), min(chunk_vocab, v)
    z_buf = torch.empty(ct * cv, dtype=acc, device=hidden.device)
    p_buf = torch.empty_like(z_buf)
    # A half-precision weight gradient is accumulated per chunk in float32, then rounded once.
    gw_buf = None
    if need_weight and weight.dtype != acc:
        gw_buf = torch.empty(cv * weight.shape[1], dtype=acc, device=weight.device)
    for v0 in range(0, v, cv):
        w = weight[v0 : v0 + cv].to(acc)
        if need_weight:
            gw = grad_weight[v0 : v0 + cv] if gw_buf is None else _block(gw_buf, *w.shape).zero_()
        for n0 in range(0, n, ct):
            rows = slice(n0, n0 + ct)
            h_c = h[rows]
            z = torch.mm(h_c, w.T, out=_block(z_buf, h_c.shape[0], w.shape[0]))
            g_ent = None if g_entropy is None else g_entropy[rows]
            dz = grad_logits_(
                z, local[rows] - v0, lse[rows], entropy[rows], g_logprob[rows], g_ent, _block(p_buf, *z.shape)
            )
            if need_hidden:
                grad_hidden[rows].addmm_(dz, w)
            if need_weight:
                gw.addmm_(dz.T, h_c)  # h_c is already h / T: dL/dW = dz^T (h / T)
        if gw_buf is not None:
            grad_weight[v0 : v0 + cv].copy_(gw)
    if need_hidden and inv_temp != 1.0:
        grad_hidden.mul_(inv_temp)  # dL/dh = dz W / T
    return grad_hidden, grad_weight


OPS = KernelOps(partials=partials, grads=grads, default_chunks=default_chunks)
