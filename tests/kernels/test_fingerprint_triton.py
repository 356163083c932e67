"""verl-kernels' fingerprint kernel (the weight-sync check on a GPU) against the check's torch path, bit for bit;
on CPU through the Triton interpreter (this file's own process, as for tests/kernels/test_triton.py)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip(
            "triton was imported before TRITON_INTERPRET=1 could be set: run this file in its own process",
            allow_module_level=True,
        )
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is first imported

pytest.importorskip("triton", reason="triton is not installed")

from verl.workers.weight_check import torch_fingerprint  # noqa: E402
from verl_kernels.fingerprint import BLOCK, fingerprint  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.float64])
@pytest.mark.parametrize("n", [1, 777, 3 * BLOCK + 5])
def test_the_kernel_equals_the_torch_path(dtype, n):
    g = torch.Generator().manual_seed(n)
    t = (torch.randn(n, generator=g) * 1000).to(dtype).to(DEVICE)
    assert fingerprint(t) == torch_fingerprint(t)


def test_an_empty_tensor_and_a_two_dimensional_one():
    assert fingerprint(torch.empty(0, device=DEVICE)) == (0, 0)
    w = torch.randn(37, 19).to(DEVICE).t()  # not contiguous
    assert fingerprint(w) == torch_fingerprint(w.contiguous())
