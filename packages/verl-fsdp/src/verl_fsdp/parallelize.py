"""Apply FSDP2 (`fully_shard`) to a Hugging Face model: one unit per decoder layer, then the root."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from verl_fsdp.model import decoder_layers


def mixed_precision(device: str, dtype: torch.dtype) -> MixedPrecisionPolicy:
    """fp32 everywhere on CPU; on GPU compute in `dtype` (bf16) and reduce gradients in fp32."""
    if device == "cpu":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def apply_fsdp(model: torch.nn.Module, mesh: DeviceMesh, *, device: str, dtype: torch.dtype) -> None:
    """Shard `model` in place over `mesh`."""
    mp = mixed_precision(device, dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    # The root keeps embeddings, final norm and the output head; it stays gathered after forward, since
    # backward needs it right away.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
