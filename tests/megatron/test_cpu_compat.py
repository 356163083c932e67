"""verl_megatron.cpu_compat: one test per behaviour it changes in megatron-core on a machine without CUDA."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from tests.support.engines import free_port

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU compatibility layer is for CUDA-less hosts")


@pytest.fixture(scope="module")
def megatron_world_one():
    """A one-process gloo group with megatron's parallel state (TP=PP=1) and the compatibility layer on."""
    from verl_megatron import cpu_compat

    assert cpu_compat.apply() is True
    from megatron.core import parallel_state as mpu

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    mpu.initialize_model_parallel(1, 1)
    yield
    mpu.destroy_model_parallel()
    dist.destroy_process_group()


def test_applied_only_without_cuda(monkeypatch):
    import importlib

    from verl_megatron import cpu_compat

    with monkeypatch.context() as m:  # a host with CUDA: the layer stays out, megatron keeps the real torch
        m.setattr(torch.cuda, "is_available", lambda: True)
        m.setattr(cpu_compat, "_applied", False)
        assert cpu_compat.apply() is False and not cpu_compat.applied()
        assert all(getattr(importlib.import_module(name), "torch", torch) is torch for name in cpu_compat.CUDA_MODULES)
    assert cpu_compat.needed()  # this host has no CUDA (the module is skipped where it does)
    assert cpu_compat.apply() is True and cpu_compat.applied()
    assert cpu_compat.apply() is True  # idempotent


def test_megatron_sees_cpu_as_its_cuda_device_and_torch_is_untouched(megatron_world_one):
    import megatron.core.models.common.embeddings.rotary_pos_embedding as rope
    import megatron.core.tensor_parallel.layers as layers

    assert layers.torch.cuda.current_device() == torch.device("cpu")
    assert rope.torch.cuda.current_device() == torch.device("cpu")
    layers.torch.cuda.synchronize()  # a no-op, not an error
    # Everyone else's torch is the real one: CUDA calls still fail loudly outside megatron.
    assert torch.cuda.current_device is not layers.torch.cuda.current_device
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.current_device()
    # The stand-in is torch otherwise: the same classes and functions.
    assert layers.torch.Tensor is torch.Tensor and layers.torch.matmul is torch.matmul


def test_rotary_embedding_runs_on_cpu(megatron_world_one):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, use_cpu_initialization=True)
    emb = rope(5)  # [seq, 1, 1, dim]: positions 0..4 times inv_freq 1 / 10000^(2i/8), i = 0..3
    assert emb.device.type == "cpu" and emb.shape == (5, 1, 1, 8)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)
    torch.testing.assert_close(emb[3, 0, 0, :4], 3 * inv_freq)


def test_context_parallel_rope_slice_runs_on_cpu(megatron_world_one):
    from megatron.core.models.common.embeddings.rope_utils import get_pos_emb_on_this_cp_rank

    from verl_megatron.context_parallel import chunk_positions

    class Rank1Of2:  # the function asks its group only for size and rank
        def size(self):
            return 2

        def rank(self):
            return 1

    # megatron builds the chunk index with pin_memory=True and moves it with .cuda(): both need CUDA as shipped.
    emb = torch.arange(8.0)[:, None, None, None]
    mine = get_pos_emb_on_this_cp_rank(emb, 0, Rank1Of2())
    assert mine.device.type == "cpu"
    assert mine.flatten().tolist() == chunk_positions(8, 2, 1).float().tolist() == [2.0, 3.0, 4.0, 5.0]


def test_cuda_device_factories_build_cpu_tensors(megatron_world_one):
    from megatron.core.transformer.utils import get_default_causal_mask

    mask = get_default_causal_mask(4)  # megatron builds it with device="cuda"
    assert mask.device.type == "cpu"
    # True above the diagonal: query i may not see key j > i.
    assert mask.tolist() == [[j > i for j in range(4)] for i in range(4)]


def test_rng_tracker_forks_the_cpu_generator(megatron_world_one):
    from megatron.core.tensor_parallel import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(123)
    torch.manual_seed(0)
    expected_default = torch.rand(3)
    torch.manual_seed(0)
    with get_cuda_rng_tracker().fork():
        first = torch.rand(3)
    outside = torch.rand(3)  # the default stream continues as if the fork had not happened
    with get_cuda_rng_tracker().fork():
        second = torch.rand(3)  # the tracked stream continues where it left off
    torch.testing.assert_close(outside, expected_default)
    assert not torch.equal(first, second)
    # Re-seeding reproduces the tracked stream: 123 + 2718 is megatron's model-parallel seed offset at tp rank 0.
    model_parallel_cuda_manual_seed(123)
    with get_cuda_rng_tracker().fork():
        torch.testing.assert_close(torch.rand(3), first)


def test_tensor_type_and_cuda_inside_shimmed_functions_only():
    from verl_megatron.cpu_compat import cpu_tensors_as_cuda

    t = torch.zeros(2)
    assert t.type() == "torch.FloatTensor"
    with cpu_tensors_as_cuda():
        assert t.type() == "torch.cuda.FloatTensor"
        assert torch.zeros(2, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
        assert t.cuda() is t
        assert t.type(torch.float64).dtype == torch.float64  # a conversion still converts
    assert t.type() == "torch.FloatTensor"


def test_grad_clipping_accepts_cpu_gradients(megatron_world_one):
    from megatron.core.optimizer import clip_grads, optimizer

    assert optimizer.clip_grad_by_total_norm_fp32 is clip_grads.clip_grad_by_total_norm_fp32  # rebound by name
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([3.0, 4.0])  # norm 5
    clip_grads.clip_grad_by_total_norm_fp32([p], max_norm=1.0, total_norm=5.0)
    # Scaled by max_norm / (total_norm + 1e-6) = 1 / 5.000001.
    torch.testing.assert_close(p.grad, torch.tensor([3.0, 4.0]) / 5.000001)


def test_moe_split_sizes_become_numpy_on_the_cpu_as_on_cuda(megatron_world_one):
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    splits = torch.tensor([3, 1])
    for module in (moe_utils, token_dispatcher):  # the dispatcher imported the function by name
        assert module.maybe_move_tensor_to_cpu(splits, as_numpy=True).tolist() == [3, 1]
        assert module.maybe_move_tensor_to_cpu(splits) is splits
    stream = token_dispatcher.torch.cuda.Stream()  # the dispatcher's side stream: a no-op on the CPU
    with token_dispatcher.torch.cuda.stream(stream):
        stream.wait_stream(token_dispatcher.torch.cuda.current_stream())
    assert stream.record_event() is not None
