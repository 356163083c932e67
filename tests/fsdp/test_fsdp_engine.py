"""FSDPEngine on one gloo rank: outputs against plain transformers, training, checkpoints, export."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.support.engines import gloo_world_one, llama_dir, random_batch  # noqa: F401
from verl.config.schema import OptimConfig
from verl.engine import EngineConfig
from verl_fsdp.engine import FSDPEngine

P, R = 5, 4


def _engine(path: str, **kw) -> FSDPEngine:
    return FSDPEngine(EngineConfig(model_path=path, optim=OptimConfig(lr=1e-2, weight_decay=0.0), total_steps=10, **kw))


def _nll(out, mb):
    loss = -out["log_probs"].mean()
    return loss, {"loss": float(loss.detach())}


def _hf_logprobs(path, batch, temperature=1.0):
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    b = batch.batch
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    logits = logits[:, P - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1), logits


# Runs first, before any test asks for the module-scoped process group.
def test_engine_needs_a_process_group(llama_dir):  # noqa: F811
    import torch.distributed as dist

    assert not dist.is_initialized()  # first in this file: the module's gloo fixture has not run yet
    with pytest.raises(RuntimeError, match="torch.distributed"):
        _engine(llama_dir)


def test_log_probs_and_entropy_match_transformers(gloo_world_one, llama_dir):  # noqa: F811
    batch = random_batch(4, P, R, left_pad=2)
    engine = _engine(llama_dir)
    out = engine.infer(
        batch, micro_batch_size=3, temperature=0.7, entropy=True
    )  # 3 does not divide 4: uneven micro-batches
    ref, logits = _hf_logprobs(llama_dir, batch, temperature=0.7)
    ref_entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(out.batch["log_probs"], ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.batch["entropy"], ref_entropy, rtol=1e-5, atol=1e-5)


def test_micro_batching_does_not_change_the_step(gloo_world_one, llama_dir):  # noqa: F811
    """One step with 4 micro-batches of 1 equals one step with the whole batch (gradient accumulation)."""
    batch = random_batch(4, P, R, seed=1)
    whole, micro = _engine(llama_dir), _engine(llama_dir)
    m1 = whole.train_step(batch, _nll, micro_batch_size=4)
    m2 = micro.train_step(batch, _nll, micro_batch_size=1)
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-6)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    for (n, a), (_, b) in zip(whole.weights(), micro.weights()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


def test_training_lowers_the_loss(gloo_world_one, llama_dir):  # noqa: F811
    batch = random_batch(4, P, R, seed=2)
    engine = _engine(llama_dir)
    losses = [engine.train_step(batch, _nll, micro_batch_size=2)["loss"] for _ in range(5)]
    assert losses[-1] < losses[0] - 0.1, losses


def test_value_model_outputs_one_value_per_response_token(gloo_world_one, llama_dir):  # noqa: F811
    batch = random_batch(3, P, R)
    engine = _engine(llama_dir, kind="value")
    values = engine.infer(batch, micro_batch_size=2).batch["values"]
    assert values.shape == (3, R) and values.dtype == torch.float32
    # Deterministic: no dropout in the value head.
    torch.testing.assert_close(values, engine.infer(batch, micro_batch_size=3).batch["values"])


def test_checkpoint_round_trip_restores_weights_optimizer_and_schedule(gloo_world_one, llama_dir, tmp_path):  # noqa: F811
    batch = random_batch(4, P, R, seed=3)
    a = _engine(llama_dir)
    a.train_step(batch, _nll, micro_batch_size=4)
    a.save_checkpoint(str(tmp_path / "ckpt"))
    after_a = a.train_step(batch, _nll, micro_batch_size=4)
    b = _engine(llama_dir)
    b.load_checkpoint(str(tmp_path / "ckpt"))
    after_b = b.train_step(batch, _nll, micro_batch_size=4)
    # The step after loading is the same step: same loss, LR and resulting weights (Adam moments restored).
    assert after_a == pytest.approx(after_b, rel=1e-6)
    for (n, x), (_, y) in zip(a.weights(), b.weights()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=n)


def test_export_hf_loads_in_transformers(gloo_world_one, llama_dir, tmp_path):  # noqa: F811
    engine = _engine(llama_dir)
    engine.train_step(random_batch(2, P, R), _nll, micro_batch_size=2)
    out = str(tmp_path / "hf")
    engine.export_hf(out)
    assert os.path.exists(os.path.join(out, "model.safetensors"))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    exported = dict(loaded.named_parameters())
    for name, w in engine.weights():
        torch.testing.assert_close(exported[name], w, rtol=0, atol=0, msg=name)


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
