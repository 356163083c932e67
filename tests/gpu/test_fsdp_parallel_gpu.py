"""The fsdp engine at tp=2 and cp=2 over two GPUs (NCCL) against one GPU, float32: the CPU parity test
(tests/fsdp/test_fsdp_model_parallel.py) on devices. Needs 2 CUDA devices."""

from __future__ import annotations

import pytest
import torch

from tests.support.fsdp_ranks import VOCAB, run_ranks
from tests.support.megatron_workers import random_model_dir

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason=f"needs 2 CUDA devices, found {torch.cuda.device_count()}"
)


@pytest.mark.parametrize("parallel", [dict(tp=2), dict(cp=2)], ids=["tp2", "cp2"])
def test_two_gpus_equal_one(tmp_path, parallel):
    path = random_model_dir(str(tmp_path / "qwen3"), "qwen3", tie=False, layers=2, vocab=VOCAB)
    want = run_ranks(1, path, {}, True, device="cuda")[0]
    got = run_ranks(2, path, parallel, True, device="cuda")
    for rank in (0, 1):
        for key in ("log_probs", "entropy", "values"):
            torch.testing.assert_close(got[rank][key], want[key], rtol=0, atol=1e-4, msg=f"{key} on rank {rank}")
        assert got[rank]["metrics"]["grad_norm"] == pytest.approx(want["metrics"]["grad_norm"], rel=1e-4)
        for name, expected in want["weights"].items():
            torch.testing.assert_close(got[rank]["weights"][name].cpu(), expected.cpu(), rtol=0, atol=1e-5, msg=name)
