"""Offload between phases on CUDA: the device memory a role gives back, and that it trains on unchanged.

Skipped without CUDA. For each engine (FSDP, megatron TP=1) on one GPU, bf16 weights, AdamW, a ~60M-parameter
Llama: after a step the optimizer state is in host memory (optimizer_offload), `release_memory()` sends the
parameters (and megatron's gradient buffer) there too (param_offload), and the next step brings them back. The
allocated bytes at each point are printed (and checked against the parameter bytes); the steps match those of an
engine that keeps everything on the device.
"""

from __future__ import annotations

import types

import pytest
import torch

from tests.support.engines import cuda_world_one, make_llama_dir, random_batch  # noqa: F401

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
GIB = 2**30


def _nll(out, mb):
    mask = mb.batch["response_mask"]
    loss = -(out["log_probs"] * mask).sum() / mask.sum()
    return loss, {"nll": float(loss)}


@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_offload_round_trip_frees_the_device_and_keeps_the_steps(backend, cuda_world_one, tmp_path):  # noqa: F811
    from verl.config.schema import OptimConfig
    from verl.engine_protocol import EngineConfig, load_engine

    path = make_llama_dir(
        str(tmp_path / "llama"), vocab=4096, hidden_size=512, intermediate_size=2048, num_hidden_layers=12
    )
    parallel = types.SimpleNamespace(tp=1, pp=1, vpp=None, cp=1, ep=1, dp=None) if backend == "megatron" else None
    common = dict(
        model_path=path, device="cuda", dtype="bfloat16", optim=OptimConfig(lr=1e-4), total_steps=4, parallel=parallel
    )
    cls = load_engine(backend, "train")
    batch = random_batch(8, 32, 32, vocab=4096)
    plain = cls(EngineConfig(**common))
    want = [plain.train_step(batch, _nll, micro_batch_size=4) for _ in range(2)]
    del plain
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()

    base = torch.cuda.memory_allocated()
    engine = cls(EngineConfig(**common, param_offload=True, optimizer_offload=True))
    resident = torch.cuda.memory_allocated() - base
    got = [engine.train_step(batch, _nll, micro_batch_size=4)]
    after_step = torch.cuda.memory_allocated() - base  # the optimizer state already in host memory
    engine.release_memory()
    released = torch.cuda.memory_allocated() - base
    got.append(engine.train_step(batch, _nll, micro_batch_size=4))
    peak = torch.cuda.max_memory_allocated() - base
    param_bytes = sum(t.numel() * t.element_size() for _, t in engine.weights())
    print(
        f"{backend} offload: model {param_bytes / GIB:.3f} GiB; allocated after build {resident / GIB:.3f}, after a "
        f"step (optimizer state away) {after_step / GIB:.3f}, after release_memory {released / GIB:.3f} GiB; "
        f"optimizer state moved {engine.optim_away.released_bytes / GIB:.3f} GiB, parameters "
        f"{engine.params_away.released_bytes / GIB:.3f} GiB; peak {peak / GIB:.3f} GiB"
    )
    assert engine.optim_away.released_bytes >= param_bytes  # two Adam moments per (fp32 master) parameter
    assert released <= after_step - 0.9 * engine.params_away.released_bytes
    for g, w in zip(got, want):  # (GPU kernels need not be bitwise deterministic: embedding backward adds atomically)
        assert g.keys() == w.keys() and all(g[k] == pytest.approx(w[k], rel=1e-3) for k in w)
