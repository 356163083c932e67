"""What an FSDP role's state holds on one rank, before anything starts: parameters, gradients and optimizer state
in bytes, from the model's parameter shapes and the role's layout as the engine stores them.

The engine keeps fp32 master weights (mixed precision casts a compute copy per layer while it runs), sharded by
FSDP2 over the role's data-parallel ranks: each parameter's dim 0 cut into `dp` chunks (torch.chunk's sizes, so
rank 0 holds the largest); gradients are sharded alike in fp32; torch's AdamW keeps two fp32 moments per trained
parameter and a 4-byte step counter per trained tensor. `FSDPEngine.held_bytes()` counts the same from the tensors
(tested equal).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from verl.memory_model import ADAM_STEP_BYTES, FP32, StateBytes


def shard_rows(rows: int, parts: int, rank: int = 0) -> int:
    """Rows of dim 0 that rank `rank` of `parts` holds when FSDP2 cuts it (torch.chunk: ceil-sized pieces)."""
    size = -(-rows // parts)
    return max(0, min(size, rows - rank * size))


def fsdp_state_bytes(shapes: Iterable[Tuple[Tuple[int, ...], bool]], dp: int, rank: int = 0) -> StateBytes:
    """The FSDP engine's state on data-parallel rank `rank` of `dp`, from (shape, trained) per parameter tensor;
    no optimizer (trained=False everywhere): the reference."""
    params = grads = optimizer = 0
    for shape, trained in shapes:
        local = (shard_rows(shape[0], dp, rank) if shape else 1) * math.prod(shape[1:])
        params += local * FP32
        if trained:
            grads += local * FP32
            optimizer += 2 * local * FP32 + ADAM_STEP_BYTES
    return StateBytes(params, grads, optimizer)


def hf_parameter_shapes(
    hf_config: Any, kind: str = "causal_lm", lora: Optional[Any] = None
) -> List[Tuple[str, Tuple[int, ...], bool]]:
    """(name, shape, trains) of every parameter of the Hugging Face model `hf_config` describes, built on the meta
    device (no memory): what the FSDP engine loads, with `lora`'s adapters when given (then only they, and a value
    head, train). A tied output head is one tensor."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    cls = AutoModelForCausalLM if kind == "causal_lm" else AutoModelForTokenClassification
    if kind == "value":  # (the critic: the trunk with a one-number head, as the FSDP engine builds it)
        hf_config = copy.deepcopy(hf_config)
        hf_config.num_labels = 1
    with torch.device("meta"):
        model = cls.from_config(hf_config)
        if lora is not None:
            from verl_fsdp.lora import apply_lora

            model = apply_lora(model, lora, kind)
    return [(name, tuple(p.shape), p.requires_grad) for name, p in model.named_parameters()]


def trained_shapes(
    shapes: Sequence[Tuple[str, Tuple[int, ...], bool]], trained: bool
) -> List[Tuple[Tuple[int, ...], bool]]:
    """(shape, trained) per tensor: those that train in the model (LoRA: the adapters), or none."""
    return [(shape, trained and trains) for _, shape, trains in shapes]


def state_bytes(
    hf_config: Any,
    sizes: Dict[str, Any],
    *,
    kind: str = "causal_lm",
    trains: bool = True,
    dtype: Optional[Any] = None,
    lora: Optional[Any] = None,
) -> List[StateBytes]:
    """verl.memory_model's backend entry: the state on data-parallel rank 0 (the largest), one stage. `dtype` does
    not matter: the master weights are fp32 whatever the compute dtype."""
    shapes = trained_shapes(hf_parameter_shapes(hf_config, kind, lora), trains)
    return [fsdp_state_bytes(shapes, int(sizes.get("dp") or 1))]
