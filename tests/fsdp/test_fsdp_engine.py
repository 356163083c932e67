"""FSDPEngine on one gloo rank, what only FSDP has: fused kernels, gradient checkpointing. The train engine
contract (outputs against transformers, training, skip policy, LR schedule, checkpoints, export) is in
tests/engines/."""

from __future__ import annotations

import pytest
import torch

from tests.support.engines import gloo_world_one, llama_dir, random_batch  # noqa: F401
from verl.config.schema import OptimConfig
from verl.engine_protocol import EngineConfig
from verl_fsdp.engine import FSDPEngine

P, R = 5, 4


def _engine(path: str, **kw) -> FSDPEngine:
    return FSDPEngine(EngineConfig(model_path=path, optim=OptimConfig(lr=1e-2, weight_decay=0.0), total_steps=10, **kw))


def _nll(out, mb):
    loss = -out["log_probs"].mean()
    return loss, {"loss": float(loss.detach())}


@pytest.mark.parametrize("impl", ["torch"])
def test_fused_kernels_match_the_unfused_path(gloo_world_one, llama_dir, impl):  # noqa: F811
    """actor.use_fused_kernels: same log-probs, entropy and training step as the logits path."""
    batch = random_batch(4, P, R, seed=4, left_pad=2)
    # eps=1 makes Adam's first update ~ lr * g, so comparing weights compares gradients; with the default eps
    # Adam maps tiny gradients to +-lr and rounding-level gradient differences flip them.
    optim = OptimConfig(lr=1e-2, eps=1.0, weight_decay=0.0)
    plain = FSDPEngine(EngineConfig(model_path=llama_dir, optim=optim, total_steps=10))
    fused = FSDPEngine(
        EngineConfig(model_path=llama_dir, optim=optim, total_steps=10, use_fused_kernels=True, fused_kernel_impl=impl)
    )
    a = plain.infer(batch, micro_batch_size=4, temperature=0.8, entropy=True)
    b = fused.infer(batch, micro_batch_size=4, temperature=0.8, entropy=True)
    torch.testing.assert_close(b.batch["log_probs"], a.batch["log_probs"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.batch["entropy"], a.batch["entropy"], rtol=1e-5, atol=1e-5)

    def loss(out, mb):  # log-prob and entropy terms, so both gradients are exercised
        value = -out["log_probs"].mean() - 0.1 * out["entropy"].mean()
        return value, {"loss": float(value.detach())}

    m_plain = plain.train_step(batch, loss, micro_batch_size=2, temperature=0.8, entropy=True)
    m_fused = fused.train_step(batch, loss, micro_batch_size=2, temperature=0.8, entropy=True, entropy_grad=True)
    assert m_fused["loss"] == pytest.approx(m_plain["loss"], rel=1e-5)
    assert m_fused["grad_norm"] == pytest.approx(m_plain["grad_norm"], rel=1e-4)
    for (name, x), (_, y) in zip(plain.weights(), fused.weights()):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6, msg=name)


def test_gradient_checkpointing_gives_the_same_step(gloo_world_one, llama_dir):  # noqa: F811
    """model.gradient_checkpointing recomputes activations in backward: same loss and weights, less memory."""
    batch = random_batch(4, P, R, seed=6)
    plain, ckpt = _engine(llama_dir), _engine(llama_dir, gradient_checkpointing=True)
    assert ckpt.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    m1 = plain.train_step(batch, _nll, micro_batch_size=2)
    m2 = ckpt.train_step(batch, _nll, micro_batch_size=2)
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-6)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    for (name, x), (_, y) in zip(plain.weights(), ckpt.weights()):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6, msg=name)


def test_offload_moves_fsdp_shards_and_keeps_the_step(gloo_world_one, llama_dir, monkeypatch):  # noqa: F811
    """The sharded path (FSDP2 units, DTensor shards, as at world > 1 or in bf16) offloads its shards and the
    optimizer's DTensor moments in place; the contract test covers the plain module. On CPU a world of one is
    sharded by asking for bf16, whose mixed precision FSDP leaves off on CPU (compute stays float32)."""
    from torch.distributed.tensor import DTensor

    monkeypatch.setattr(EngineConfig, "compute_dtype", lambda self: torch.bfloat16)
    batch = random_batch(4, P, R, seed=7)
    plain, away = _engine(llama_dir), _engine(llama_dir, param_offload=True, optimizer_offload=True)
    assert away.sharded and all(isinstance(p, DTensor) for p in away.model.parameters())
    for _ in range(2):
        want = plain.train_step(batch, _nll, micro_batch_size=2)
        assert away.train_step(batch, _nll, micro_batch_size=2) == want
        away.infer(batch, micro_batch_size=4)  # leaves the root unsharded: release reshards it first
        away.release_memory()
        assert all(p.to_local().untyped_storage().nbytes() == 0 for p in away.model.parameters())
        assert away.optim_away.away.nbytes > 0
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(away.weights(), plain.weights()))
