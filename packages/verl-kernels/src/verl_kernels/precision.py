"""Accumulation precision: which dtype each input dtype is computed in, and matmuls that return it."""

from __future__ import annotations

import functools

import torch

# Every path computes logits, softmax statistics and gradient accumulators in float32 (float64 stays float64 so
# that gradcheck can run); half-precision inputs are only ever read, never accumulated in.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@functools.cache
def _cuda_mm_has_out_dtype() -> bool:
    # torch.mm(..., out_dtype=float32) runs a half-precision GEMM with a float32 result (recent torch, CUDA only).
    try:
        a = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with products summed in the accumulation dtype and returned in it (never rounded to half precision)."""
    acc = accum_dtype(a.dtype)
    if a.dtype == acc:
        return a @ b
    if a.is_cuda and _cuda_mm_has_out_dtype():
        return torch.mm(a, b, out_dtype=acc)
    return a.to(acc) @ b.to(acc)
