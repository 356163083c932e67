"""Checkpoint-format tensors into a transformers model's parameters.

Weights arrive under the names `save_pretrained` writes. For most models those are the module's parameter names;
a mixture of experts is the exception: transformers (5.x) holds a layer's experts fused (`mlp.experts.gate_up_proj`
[E, 2I, H], gate rows first, and `mlp.experts.down_proj` [E, H, I]) while checkpoints name each expert
(Qwen3-MoE `mlp.experts.{e}.gate_proj.weight`; Mixtral `block_sparse_moe.experts.{e}.w1.weight`, w3 up, w2 down,
and its router `block_sparse_moe.gate.weight`). A vision-language model renames whole prefixes: its checkpoint's
`model.layers.*` and `visual.*` are the module's `model.language_model.layers.*` and `model.visual.*` (`renames`).
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Optional, Tuple

import torch

from verl.utils.hf_files import checkpoint_tensors

_EXPERT = re.compile(
    r"^(.*)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$"
)
_GATE, _UP = ("gate_proj", "w1"), ("up_proj", "w3")


def renames(model: torch.nn.Module) -> Dict[str, str]:
    """Checkpoint name -> parameter name, for the parameters saved under another name as they are (transformers'
    own reverse conversion, run on meta tensors)."""
    out = {}
    for param, p in model.named_parameters():
        names = [c for c, _ in checkpoint_tensors(model, param, torch.empty(p.shape, dtype=p.dtype, device="meta"))]
        if len(names) == 1 and names[0] != param:
            out[names[0]] = param
    return out


def target(
    name: str, params: Dict[str, torch.Tensor], renamed: Optional[Callable[[], Dict[str, str]]] = None
) -> Tuple[str, torch.Tensor]:
    """(parameter name, the view of it that checkpoint tensor `name` fills); KeyError when the model has none.
    `renamed`: the model's `renames`, asked for only when `name` is no parameter's own."""
    if name in params:
        return name, params[name]
    renames_of = renamed() if renamed is not None else {}
    if name in renames_of:
        return renames_of[name], params[renames_of[name]]
    moe_name = name.replace(".block_sparse_moe.", ".mlp.")
    if moe_name in params:  # Mixtral's router
        return moe_name, params[moe_name]
    match = _EXPERT.match(name)
    if match:
        layer, expert, proj = match.group(1), int(match.group(2)), match.group(3)
        if proj in _GATE or proj in _UP:
            fused = params.get(f"{layer}.mlp.experts.gate_up_proj")
            if fused is not None:
                half = fused.shape[1] // 2
                rows = slice(0, half) if proj in _GATE else slice(half, 2 * half)
                return f"{layer}.mlp.experts.gate_up_proj", fused[expert, rows]
        else:
            fused = params.get(f"{layer}.mlp.experts.down_proj")
            if fused is not None:
                return f"{layer}.mlp.experts.down_proj", fused[expert]
    raise KeyError(f"rollout model has no parameter '{name}' (the actor and rollout models differ)")
