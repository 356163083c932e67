"""Triton kernels for the fused log-prob/entropy (CUDA; on CPU with TRITON_INTERPRET=1 set before first import).

Forward (`_partials_kernel`): one program per (token block, vocabulary split). It computes [BLOCK_N, BLOCK_V]
logits tiles with tl.dot over BLOCK_H slices of H, folds them into an online max / sum-exp / entropy partial /
label logit per row, and writes one partial state per split; no logits ever reach global memory. Splitting the
vocabulary across programs keeps the GPU full when N is small; the [splits, N] states merge in torch
(online_softmax.merge_stacked), exactly like tensor-parallel shards.

Backward (`_grad_logits_kernel`): recomputes a chunk of logits tile by tile from hidden and weight (tl.dot again),
applies the softmax/entropy gradient and writes dL/dlogits for that [chunk_tokens, chunk_vocab] chunk; cuBLAS
matmuls then fold the chunk into grad_hidden and grad_weight. Only the chunk buffer is ever held.
"""

from __future__ import annotations

import torch
import triton  # pants: no-infer-dep (an optional extra of the wheel: pip install 'verl-kernels[triton]')
import triton.language as tl  # pants: no-infer-dep

from verl_kernels.function import KernelOps
from verl_kernels.online_softmax import Partials, merge_stacked
from verl_kernels.precision import accum_dtype, mm_f32

INTERPRETED = triton.knobs.runtime.interpret


@triton.jit
def _logits_tile(
    h_ptr,
    w_ptr,
    rows,
    cols,
    row_ok,
    col_ok,
    H,
    stride_hn,
    stride_hh,
    stride_wv,
    stride_wh,
    inv_temp,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """[BLOCK_N, BLOCK_V] float32 tile of (h @ w.T) / T; rows and columns outside the tensors read as zeros."""
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        k_ok = ks < H
        a = tl.load(
            h_ptr + rows[:, None] * stride_hn + ks[None, :] * stride_hh, mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        b = tl.load(
            w_ptr + cols[None, :] * stride_wv + ks[:, None] * stride_wh, mask=col_ok[None, :] & k_ok[:, None], other=0.0
        )
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return acc * inv_temp


@triton.jit
def _partials_kernel(
    h_ptr,
    w_ptr,
    labels_ptr,
    m_ptr,
    s_ptr,
    t_ptr,
    y_ptr,
    N,
    V,
    H,
    vocab_start,
    v_per_split,
    inv_temp,
    stride_hn,
    stride_hh,
    stride_wv,
    stride_wh,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < N
    labels = tl.load(labels_ptr + rows, mask=row_ok, other=-1) - vocab_start
    v_lo = split * v_per_split
    v_hi = tl.minimum(v_lo + v_per_split, V)

    m = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
    s = tl.zeros((BLOCK_N,), dtype=tl.float32)
    t = tl.zeros((BLOCK_N,), dtype=tl.float32)
    y = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = (v0 + tl.arange(0, BLOCK_V)).to(tl.int64)
        col_ok = cols < v_hi
        z = _logits_tile(
            h_ptr,
            w_ptr,
            rows,
            cols,
            row_ok,
            col_ok,
            H,
            stride_hn,
            stride_hh,
            stride_wv,
            stride_wh,
            inv_temp,
            BLOCK_N,
            BLOCK_V,
            BLOCK_H,
            INPUT_PRECISION,
            UPCAST,
        )
        z = tl.where(col_ok[None, :], z, float("-inf"))
        y += tl.sum(tl.where((cols[None, :] == labels[:, None]) & col_ok[None, :], z, 0.0), axis=1)
        m_new = tl.maximum(m, tl.max(z, axis=1))
        alpha = tl.exp(m - m_new)  # 0 on the first tile (m = -inf)
        d = z - m_new[:, None]
        e = tl.exp(d)  # 0 in masked columns
        # Rebase t to the new max (online_softmax.merge). Before the first tile s == 0 and m - m_new == -inf, and
        # masked columns have e == 0, d == -inf: select before multiplying so no 0 * inf appears.
        shift = tl.where(s > 0.0, m - m_new, 0.0)
        t = alpha * (t + s * shift) + tl.sum(e * tl.where(col_ok[None, :], d, 0.0), axis=1)
        s = alpha * s + tl.sum(e, axis=1)
        m = m_new
    out = split * N + rows
    tl.store(m_ptr + out, m, mask=row_ok)
    tl.store(s_ptr + out, s, mask=row_ok)
    tl.store(t_ptr + out, t, mask=row_ok)
    tl.store(y_ptr + out, y, mask=row_ok)


@triton.jit
def _grad_logits_kernel(
    h_ptr,
    w_ptr,
    labels_ptr,
    lse_ptr,
    ent_ptr,
    glp_ptr,
    gent_ptr,
    dz_ptr,
    N,
    V,
    H,
    vocab_start,
    inv_temp,
    stride_hn,
    stride_hh,
    stride_wv,
    stride_wh,
    stride_dzn,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    ENTROPY_GRAD: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    cols = (tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
    row_ok = rows < N
    col_ok = cols < V
    z = _logits_tile(
        h_ptr,
        w_ptr,
        rows,
        cols,
        row_ok,
        col_ok,
        H,
        stride_hn,
        stride_hh,
        stride_wv,
        stride_wh,
        inv_temp,
        BLOCK_N,
        BLOCK_V,
        BLOCK_H,
        INPUT_PRECISION,
        UPCAST,
    )
    labels = tl.load(labels_ptr + rows, mask=row_ok, other=-1) - vocab_start
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    g = tl.load(glp_ptr + rows, mask=row_ok, other=0.0)
    log_p = z - lse[:, None]
    p = tl.exp(log_p)
    if ENTROPY_GRAD:
        ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
        g_ent = tl.load(gent_ptr + rows, mask=row_ok, other=0.0)
        dz = -p * (g[:, None] + g_ent[:, None] * (log_p + ent[:, None]))
    else:
        dz = -p * g[:, None]
    dz += tl.where(cols[None, :] == labels[:, None], g[:, None], 0.0)
    tl.store(
        dz_ptr + rows[:, None] * stride_dzn + cols[None, :],
        dz.to(dz_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


def _configs(*shapes: tuple[int, int, int, int, int]) -> list:
    return [
        triton.Config({"BLOCK_N": n, "BLOCK_V": v, "BLOCK_H": h}, num_warps=w, num_stages=st)
        for n, v, h, w, st in shapes
    ]


# GPU: autotuned over a few tile shapes (the tuner keys on H and the input dtypes). The interpreter runs every
# program in Python, so it gets the smallest tiles tl.dot accepts and no tuning.
_GPU_CONFIGS = _configs(
    (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 64, 32, 4, 3)
)
_INTERPRETER_BLOCKS = {"BLOCK_N": 16, "BLOCK_V": 32, "BLOCK_H": 16}
if INTERPRETED:
    _fwd, _bwd = _partials_kernel, _grad_logits_kernel
else:
    _fwd = triton.autotune(_GPU_CONFIGS, key=["H"])(_partials_kernel)
    _bwd = triton.autotune(_GPU_CONFIGS, key=["H", "ENTROPY_GRAD"])(_grad_logits_kernel)


def _launch(kernel, grid, *args, **kwargs) -> None:
    if INTERPRETED:
        kernel[grid(_INTERPRETER_BLOCKS)](*args, **kwargs, **_INTERPRETER_BLOCKS)
    else:
        kernel[grid](*args, **kwargs)


def _check_device(t: torch.Tensor) -> None:
    if not t.is_cuda and not INTERPRETED:
        raise ValueError(
            f"impl='triton' needs CUDA tensors (got {t.device}); on CPU set TRITON_INTERPRET=1 before "
            "verl_kernels.triton_kernels is first imported, or use impl='chunked'"
        )
    if t.dtype == torch.float64:
        raise ValueError("impl='triton' takes float32, bfloat16 or float16 inputs; use impl='chunked' for float64")


def _dot_args(dtype: torch.dtype) -> dict:
    """How tiles enter tl.dot: float32 products for float32 inputs, native half-precision products otherwise."""
    # Without "ieee" a float32 tl.dot rounds its inputs to tf32 (~1e-3 relative).
    precision = "ieee" if dtype == torch.float32 else "tf32"
    # The interpreter multiplies bfloat16 tiles as their raw uint16 bits (triton 3.9 interpreter.py create_dot), so
    # there they are upcast first; a bfloat16 product is exact in float32, so the numbers do not change.
    return {"INPUT_PRECISION": precision, "UPCAST": bool(INTERPRETED and dtype == torch.bfloat16)}


def _num_splits(n: int, v: int, device: torch.device) -> int:
    if INTERPRETED:
        return min(2, triton.cdiv(v, 256))  # exercise the merge of split states at test sizes
    programs_wanted = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(triton.cdiv(v, 1024), triton.cdiv(programs_wanted, triton.cdiv(n, 128))))


def default_chunks(device: torch.device) -> tuple[int, int]:
    # Backward holds one [chunk_tokens, chunk_vocab] dL/dlogits buffer in the input dtype (256 MiB in bf16).
    return (16384, 8192) if device.type == "cuda" else (64, 128)


def partials(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab_start: int,
    inv_temp: float,
    chunk_tokens: int,
    chunk_vocab: int,
) -> Partials:
    """Per-row partial state over the rows of `weight` (chunk sizes unused: tiles never leave the chip)."""
    _check_device(hidden)
    n, v = hidden.shape[0], weight.shape[0]
    if n == 0:
        return Partials(*(torch.zeros(0, dtype=torch.float32, device=hidden.device) for _ in range(4)))
    splits = _num_splits(n, v, hidden.device)
    v_per_split = triton.cdiv(triton.cdiv(v, splits), 256) * 256  # a multiple of every BLOCK_V
    splits = triton.cdiv(v, v_per_split)  # no empty split
    states = torch.empty(4, splits, n, dtype=torch.float32, device=hidden.device)
    labels = labels.contiguous()
    _launch(
        _fwd,
        lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), splits),
        hidden,
        weight,
        labels,
        states[0],
        states[1],
        states[2],
        states[3],
        n,
        v,
        hidden.shape[1],
        vocab_start,
        v_per_split,
        inv_temp,
        hidden.stride(0),
        hidden.stride(1),
        weight.stride(0),
        weight.stride(1),
        **_dot_args(hidden.dtype),
    )
    return merge_stacked(Partials(*states.unbind(0)))


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
    """Gradients for hidden (float32) and weight (weight's dtype) from recomputed dL/dlogits chunks."""
    _check_device(hidden)
    n, v = hidden.shape[0], weight.shape[0]
    acc = accum_dtype(hidden.dtype)
    grad_hidden = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_hidden else None
    grad_weight = torch.zeros_like(weight) if need_weight else None
    if n == 0 or not (need_hidden or need_weight):
        return grad_hidden, grad_weight
    ct, cv = min(chunk_tokens, n), min(chunk_vocab, v)
    # dL/dlogits in the input dtype, so the grad matmuls run at the input precision with float32 accumulation.
    dz_buf = torch.empty(ct * cv, dtype=hidden.dtype, device=hidden.device)
    labels = labels.contiguous()
    entropy_grad = g_entropy is not None
    for v0 in range(0, v, cv):
        w = weight[v0 : v0 + cv]
        grad_w = None
        for n0 in range(0, n, ct):
            rows = slice(n0, n0 + ct)
            h_c = hidden[rows]
            dz = dz_buf[: h_c.shape[0] * w.shape[0]].view(h_c.shape[0], w.shape[0])
            _launch(
                _bwd,
                lambda meta, nc=h_c.shape[0], vc=w.shape[0]: (
                    triton.cdiv(nc, meta["BLOCK_N"]),
                    triton.cdiv(vc, meta["BLOCK_V"]),
                ),
                h_c,
                w,
                labels[rows],
                lse[rows],
                entropy[rows],
                g_logprob[rows],
                g_entropy[rows] if entropy_grad else g_logprob[rows],  # unread when ENTROPY_GRAD is off
                dz,
                h_c.shape[0],
                w.shape[0],
                hidden.shape[1],
                vocab_start + v0,
                inv_temp,
                h_c.stride(0),
                h_c.stride(1),
                w.stride(0),
                w.stride(1),
                dz.stride(0),
                ENTROPY_GRAD=entropy_grad,
                **_dot_args(hidden.dtype),
            )
            if need_hidden:
                grad_hidden[rows] += mm_f32(dz, w)
            if need_weight:
                part = mm_f32(dz.T, h_c)
                grad_w = part if grad_w is None else grad_w.add_(part)
        if need_weight:
            grad_weight[v0 : v0 + cv].copy_(grad_w.mul_(inv_temp))  # dL/dW = dz^T h / T
    if need_hidden and inv_temp != 1.0:
        grad_hidden.mul_(inv_temp)  # dL/dh = dz W / T
    return grad_hidden, grad_weight


OPS = KernelOps(partials=partials, grads=grads, default_chunks=default_chunks)
