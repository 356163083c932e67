"""actor.fused_kernel_impl=triton in the FSDP engine equals the logits path (on CPU via the Triton interpreter)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # triton.jit chose compiled mode when it was first imported; the interpreter cannot be switched on now.
        pytest.skip(
            "triton was imported before TRITON_INTERPRET=1 could be set: run this file in its own process "
            "(as `pants test` does)",
            allow_module_level=True,
        )
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported: triton.jit reads it then

pytest.importorskip("triton", reason="triton is not installed")

from tests.support.engines import gloo_world_one, llama_dir, random_batch  # noqa: E402,F401
from verl.config.schema import OptimConfig  # noqa: E402
from verl.engine_protocol import EngineConfig  # noqa: E402
from verl_fsdp.engine import FSDPEngine  # noqa: E402
from verl_kernels import triton_kernels  # noqa: E402

if not torch.cuda.is_available() and not triton_kernels.INTERPRETED:
    pytest.skip("no CUDA, and triton was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)


def test_triton_fused_path_matches_logits_path(gloo_world_one, llama_dir):  # noqa: F811
    batch = random_batch(2, 4, 3, seed=5, left_pad=1)
    optim = OptimConfig(lr=1e-2, eps=1.0, weight_decay=0.0)  # see test_fused_kernels_match_the_unfused_path
    plain = FSDPEngine(EngineConfig(model_path=llama_dir, optim=optim, total_steps=3))
    fused = FSDPEngine(
        EngineConfig(
            model_path=llama_dir, optim=optim, total_steps=3, use_fused_kernels=True, fused_kernel_impl="triton"
        )
    )
    a = plain.infer(batch, micro_batch_size=2, temperature=0.9, entropy=True)
    b = fused.infer(batch, micro_batch_size=2, temperature=0.9, entropy=True)
    torch.testing.assert_close(b.batch["log_probs"], a.batch["log_probs"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.batch["entropy"], a.batch["entropy"], rtol=1e-5, atol=1e-5)

    def loss(out, mb):
        value = -out["log_probs"].mean()
        return value, {"loss": float(value.detach())}

    plain.train_step(batch, loss, micro_batch_size=2, temperature=0.9)
    fused.train_step(batch, loss, micro_batch_size=2, temperature=0.9, entropy_grad=False)
    for (name, x), (_, y) in zip(plain.weights(), fused.weights()):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6, msg=name)
