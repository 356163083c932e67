"""The FSDP engine on CUDA with flash-attention: packed rows go through its variable-length kernels.

Skipped without CUDA or without the flash-attn package (the reason is shown). flash_attention_2 takes no 4D
mask, so the engine runs the padding-free stream (verl.utils.padding_free): its log-probs must be the padded
SDPA rows' (bf16 on both sides), it must compute only the real tokens, and a training step must run.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.support.engines import P, R, cuda_world_one, grouped_batch, make_llama_dir  # noqa: F401

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs the flash-attn package"),
]
BF16_LOGPROB_ATOL = 0.05  # two bf16 attention kernels on the same bf16 weights


def test_flash_attention_runs_packed_rows_padding_free(cuda_world_one, tmp_path):  # noqa: F811
    from verl.config.schema import OptimConfig
    from verl.engine_protocol import EngineConfig
    from verl_fsdp.engine import FSDPEngine

    path = make_llama_dir(str(tmp_path / "llama"))
    common = dict(model_path=path, device="cuda", dtype="bfloat16", optim=OptimConfig(lr=1e-3), total_steps=3)
    padded = FSDPEngine(EngineConfig(**common, shared_prefix=False))
    flash = FSDPEngine(EngineConfig(**common, attn_implementation="flash_attention_2"))
    batch = grouped_batch(prompts=3, n=4)
    valid = batch.batch["response_mask"].bool()
    a = padded.infer(batch, micro_batch_size=12).batch["log_probs"].float()
    b = flash.infer(batch, micro_batch_size=12).batch["log_probs"].float()
    worst = (a - b)[valid].abs().max().item()
    print(f"flash_attention_2 padding-free vs sdpa padded: max |log-prob difference| = {worst:.3e}")
    assert worst < BF16_LOGPROB_ATOL

    def nll(out, mb):
        m = mb.batch["response_mask"].to(out["log_probs"].dtype)
        loss = -(out["log_probs"] * m).sum() / m.sum()
        return loss, {"nll": float(loss.detach())}

    metrics = flash.train_step(batch, nll, micro_batch_size=12)
    real = int(batch.batch["attention_mask"].sum())
    assert metrics["computed_tokens_ratio"] == pytest.approx(real / (12 * (P + R)))
    assert torch.isfinite(torch.tensor(metrics["nll"])) and metrics["grad_norm"] > 0
