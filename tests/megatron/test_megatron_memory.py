"""The megatron memory model (verl_megatron.memory_model) against what the engine holds, counted from its tensors'
storages: a world of one here (fp32 as on CPU and bf16 with its fp32 main copies, a mixture of experts, the value
head, the reference without an optimizer); split layouts over two Ray workers in test_step_parity_ray.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoConfig

from tests.support.engines import gloo_world_one, policy_batch  # noqa: F401
from tests.support.fixtures import decoders, embedded_cache  # noqa: F401
from verl.config.schema import OptimConfig
from verl.engine_protocol import EngineConfig
from verl_megatron.memory_model import Param, buckets, chunk_state, state_bytes

ONE = {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 1}


def test_buckets_pad_as_megatron_does():
    # Reverse order; each parameter starts at a multiple of 64; the bucket ends at a multiple of lcm(dp, 128).
    params = [Param(100, 4), Param(10, 4)]
    assert buckets(params, dp=1) == [(0, 256, [(0, 10), (64, 164)])]
    assert buckets(params, dp=3) == [(0, 384, [(0, 10), (64, 164)])]
    # A pipeline-shared embedding closes the bucket before it and has one of its own.
    tied = [Param(50, 4, shared_embedding=True), Param(10, 4)]
    assert buckets(tied, dp=2) == [(0, 128, [(0, 10)]), (128, 256, [(128, 178)])]


def test_the_distributed_optimizer_keeps_each_ranks_slice():
    # 256 values over 2 ranks: rank 0 holds [0, 128) (10 values of the first parameter, 64 of the second),
    # rank 1 [128, 256) (the second's last 36). bf16: fp32 main copies, two fp32 moments, a 4-byte step per piece.
    params = [Param(100, 2), Param(10, 2)]
    r0, r1 = (chunk_state(params, dp=2, expert_dp=1, rank=r) for r in (0, 1))
    assert (r0.params, r0.grads) == (r1.params, r1.grads) == (256 * 2, 256 * 4)
    assert r0.optimizer == (10 + 64) * 12 + 2 * 4 and r1.optimizer == 36 * 12 + 4
    # fp32: the main params are views of the parameters; only the moments and steps are new.
    assert chunk_state([Param(100, 4)], dp=1, expert_dp=1).optimizer == 100 * 8 + 4


def _nll(out, mb):
    mask = mb.batch["response_mask"]
    loss = -(out["log_probs"] * mask).sum() / mask.sum()
    return loss, {"nll": float(loss)}


@dataclasses.dataclass
class _Bf16Config(EngineConfig):
    def compute_dtype(self) -> torch.dtype:  # (the GPU dtype, here on CPU: the fp32 main copies appear)
        return torch.bfloat16


CASES = {
    "fp32": ("tiny-llama", torch.float32, "causal_lm"),
    "bf16": ("tiny-llama", torch.bfloat16, "causal_lm"),
    "value-head": ("tiny-llama", torch.float32, "value"),
    "moe": ("tiny-qwen3-moe", torch.float32, "causal_lm"),
}


@pytest.fixture(scope="module")
def estimates(embedded_cache):  # noqa: F811
    """Each case's estimate, trained and not: worked out before the engines start (megatron's model-parallel state
    is one per process, and the estimate builds its own)."""
    from verl.embedded.models import materialize_embedded_model

    out = {}
    for name, (model, dtype, kind) in CASES.items():
        hf = AutoConfig.from_pretrained(materialize_embedded_model(model, embedded_cache))
        (trained,) = state_bytes(hf, ONE, kind=kind, dtype=dtype)
        (frozen,) = state_bytes(hf, ONE, kind=kind, trains=False, dtype=torch.float32)
        out[name] = trained, frozen
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_estimate_equals_the_engines_storages(estimates, gloo_world_one, embedded_cache, case):  # noqa: F811
    from verl.embedded.models import materialize_embedded_model
    from verl_megatron.engine import MegatronEngine

    model, dtype, kind = CASES[case]
    estimate, frozen = estimates[case]
    path = materialize_embedded_model(model, embedded_cache)
    hf = AutoConfig.from_pretrained(path)
    config = _Bf16Config if dtype == torch.bfloat16 else EngineConfig
    engine = MegatronEngine(
        config(model_path=path, kind=kind, optim=OptimConfig(lr=1e-3), total_steps=2, parallel=dict(ONE))
    )
    if kind == "causal_lm":  # (the optimizer's moments appear at its first step)
        engine.train_step(policy_batch(4, 5, 3, hf.vocab_size, old_log_prob=-2.0), _nll, micro_batch_size=2)
        assert engine.held_bytes() == estimate.as_dict()
        assert estimate.optimizer > 0 and estimate.grads == estimate.params * (4 // dtype.itemsize)
    else:
        assert engine.held_bytes()["params"] == estimate.params and engine.held_bytes()["grads"] == estimate.grads
    reference = MegatronEngine(EngineConfig(model_path=path, kind=kind, total_steps=1, parallel=dict(ONE)))
    assert reference.held_bytes() == frozen.as_dict() and frozen.grads == frozen.optimizer == 0


@pytest.mark.parametrize("recompute", [False, True], ids=["stored", "recompute"])
@pytest.mark.parametrize("model", ["llama", "qwen3", "qwen3_moe"])
def test_activation_estimate_equals_the_bytes_saved_for_backward(gloo_world_one, decoders, model, recompute):  # noqa: F811
    """Padded rows, one micro-batch, megatron's local layers (unfused attention keeps the softmax): what autograd
    holds at the step's peak, measured by saved-tensor hooks (megatron's recompute saves each layer's input where
    they see it). Split layouts are measured in benchmarks/memory_model.py."""
    from verl.memory_model import MicroBatch, PassSettings
    from verl.utils.saved_activations import SavedActivations
    from verl_megatron.engine import MegatronEngine
    from verl_megatron.memory_model import activation_bytes

    path = decoders[model]
    engine = MegatronEngine(
        EngineConfig(
            model_path=path,
            optim=OptimConfig(lr=1e-3),
            total_steps=2,
            gradient_checkpointing=recompute,
            parallel=dict(ONE),
        )
    )
    rows, prompt, response = 4, 11, 17  # (row 3 unpadded: no column is padding in every row, none is cut)
    with SavedActivations(engine._parameters()) as saved:
        engine.train_step(policy_batch(rows, prompt, response, 300, old_log_prob=-2.0), _nll, micro_batch_size=rows)
    settings = PassSettings(dtype_bytes=4, recompute=recompute)
    mb = MicroBatch(rows, prompt + response, response)
    estimate = activation_bytes(AutoConfig.from_pretrained(path), ONE, mb, settings)
    print(f"{model} recompute={recompute}: {estimate} vs {saved.peak_bytes} measured")
    assert estimate == pytest.approx(saved.peak_bytes, rel=1e-3)


@pytest.mark.parametrize("rows", [8, 4], ids=["two-packs", "one-pack"])
def test_packed_rows_activations_are_the_packs_estimate(gloo_world_one, decoders, rows):  # noqa: F811
    """Shared-prefix packing (a pack a prompt: the prompt once, its responses after it) through megatron's local
    layers: the estimate of the packs' shape is within 10% of the bytes saved (measured 1.06x-1.07x)."""
    from tests.support.engines import full_groups
    from verl.memory_model import MicroBatch, PassSettings
    from verl.utils.saved_activations import SavedActivations
    from verl_megatron.engine import MegatronEngine
    from verl_megatron.memory_model import activation_bytes

    path = decoders["llama"]
    engine = MegatronEngine(
        EngineConfig(model_path=path, optim=OptimConfig(lr=1e-3), total_steps=2, shared_prefix=True, parallel=dict(ONE))
    )
    n, prompt, response = 4, 12, 20
    with SavedActivations(engine._parameters()) as saved:
        metrics = engine.train_step(full_groups(2, n, prompt, response, 300), _nll, micro_batch_size=rows)
    assert metrics["computed_tokens_ratio"] < 1
    mb = MicroBatch.packed(rows, n, prompt, response)
    estimate = activation_bytes(AutoConfig.from_pretrained(path), ONE, mb, PassSettings(4, entropy=False))
    print(f"packed rows={rows}: {estimate} vs {saved.peak_bytes} measured")
    assert estimate == pytest.approx(saved.peak_bytes, rel=0.10)
