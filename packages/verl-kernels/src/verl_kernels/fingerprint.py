"""The weight-sync check's fingerprint (verl.workers.weight_check) in one read of a tensor on a GPU.

Each program widens BLOCK elements' bit patterns to 64 bits and writes their sum and sum of squares; the programs'
partial sums then add up in torch. All of it is int64 arithmetic, which wraps, so the result is the same modulo
2**64 as the check's torch path (which widens the tensor piece by piece: several passes over memory where this
takes one). On CPU it runs under the Triton interpreter (TRITON_INTERPRET=1 before the first import), for tests.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton  # pants: no-infer-dep (an optional extra of the wheel: pip install 'verl-kernels[triton]')
import triton.language as tl  # pants: no-infer-dep

BLOCK = 8192
MOD = 1 << 64
_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@triton.jit
def _partials_kernel(bits_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(bits_ptr + offsets, mask=offsets < n, other=0).to(tl.int64)
    tl.store(out_ptr + 2 * pid, tl.sum(values, axis=0))
    tl.store(out_ptr + 2 * pid + 1, tl.sum(values * values, axis=0))


def fingerprint(tensor: torch.Tensor) -> Tuple[int, int]:
    """(sum, sum of squares) of the elements' bit patterns, modulo 2**64 (verl.workers.weight_check.fingerprint)."""
    bits = tensor.detach().reshape(-1).view(_INT[tensor.element_size()])
    n = bits.numel()
    if n == 0:
        return 0, 0
    blocks = triton.cdiv(n, BLOCK)
    partials = torch.empty(2 * blocks, dtype=torch.int64, device=bits.device)
    _partials_kernel[(blocks,)](bits, partials, n, BLOCK=BLOCK)
    s, q = partials.view(blocks, 2).sum(0).tolist()
    return s % MOD, q % MOD
