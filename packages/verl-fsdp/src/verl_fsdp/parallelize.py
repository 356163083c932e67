"""Parallelize a Hugging Face model: tensor parallel on its decoder layers (the plan the model declares), then FSDP2
(`fully_shard`) over the data-parallel ranks, one unit per decoder layer, then the root."""

from __future__ import annotations

import fnmatch
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from verl_fsdp.model import decoder_layers

# transformers' tensor-parallel styles (a config's `base_model_tp_plan`) -> torch's. Inputs and outputs of the
# decoder layer stay whole tensors: a colwise projection's output is this rank's heads (or MLP columns), a rowwise
# one's input is those and its output is summed over the tp ranks.
TP_STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
# Replicated parameters that see only this rank's heads (Qwen3's per-head q/k norms): their gradients are summed over
# the tp ranks after backward (`tp_partial_grads`).
GRAD_ALLREDUCE = "replicated_with_grad_allreduce"


def split_world(parallel: Any, world: int) -> Tuple[int, int, int]:
    """(tp, cp, dp) of a role's `parallel` (the plan's Layout or a ParallelConfig; None: data parallel only) over
    `world` ranks; dp derived. Tensor and sequence parallelism take one axis each, not both at once."""
    tp, cp, pp = (int(getattr(parallel, axis, None) or 1) for axis in ("tp", "cp", "pp"))
    if pp > 1:
        raise ValueError(f"parallel.pp={pp}: the fsdp engine has no pipeline stages; set pp=1, or backend=megatron")
    if tp > 1 and cp > 1:
        raise ValueError(f"parallel.tp={tp} with cp={cp}: the fsdp engine splits one of them; set tp=1 or cp=1")
    if world % (tp * cp):
        raise ValueError(f"parallel.tp={tp} x cp={cp} does not divide the role's {world} ranks")
    return tp, cp, world // (tp * cp)


def mixed_precision(device: str, dtype: torch.dtype) -> MixedPrecisionPolicy:
    """fp32 everywhere on CPU; on GPU compute in `dtype` (bf16) and reduce gradients in fp32."""
    if device == "cpu":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def tp_plan(model: torch.nn.Module) -> Dict[str, str]:
    """The model's declared tensor-parallel plan ({module pattern under the base model: style}), refused by name
    where it holds a style this engine does not apply (a mixture of experts' experts)."""
    config: Any = model.config
    plan = dict(getattr(config, "base_model_tp_plan", None) or {})
    if not plan:
        raise ValueError(
            f"{type(model).__name__} declares no tensor-parallel plan (config.base_model_tp_plan): the fsdp engine "
            "cannot split it; set the role's parallel.tp=1, or backend=megatron"
        )
    unknown = {k: v for k, v in plan.items() if v not in TP_STYLES and v != GRAD_ALLREDUCE}
    if unknown:
        raise ValueError(
            f"fsdp tensor parallel splits dense attention and MLP projections; {type(model).__name__}'s plan also has "
            f"{unknown} (a mixture of experts): set the role's parallel.tp=1, or backend=megatron (ep/etp)"
        )
    return plan


def tp_style(plan: Dict[str, str], module: str) -> Optional[str]:
    """The plan's style for `module` (its name under the base model), or None."""
    return next((style for pattern, style in plan.items() if fnmatch.fnmatchcase(module, pattern)), None)


def check_tp_shapes(model: torch.nn.Module, tp: int) -> None:
    """Heads and MLP width must split evenly over `tp` ranks; say which does not."""
    c: Any = model.config
    sizes = {
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
        "intermediate_size": c.intermediate_size,
    }
    bad = {k: v for k, v in sizes.items() if v % tp}
    if bad:
        raise ValueError(f"parallel.tp={tp} must divide the model's {bad}: choose a tp that divides them")


def apply_tp(model: torch.nn.Module, mesh: DeviceMesh) -> List[str]:
    """Split each decoder layer's projections over `mesh` (1-D, the tp ranks) by the model's plan, in place;
    returns the names of the replicated parameters whose gradients must be summed over the tp ranks (names: FSDP
    replaces the parameter objects when it shards them)."""
    plan = tp_plan(model)
    check_tp_shapes(model, mesh.size())
    get_decoder = getattr(model, "get_decoder", None)  # the base model the plan's names start from
    base = get_decoder() if callable(get_decoder) else model
    names = {m: n for n, m in base.named_modules()}
    module_names = {m: n for n, m in model.named_modules()}
    partial: List[str] = []
    for layer in decoder_layers(model):
        prefix = names[layer] + "."
        styles: Dict[str, ParallelStyle] = {}
        for sub, module in layer.named_modules():
            style = tp_style(plan, prefix + sub)
            if style in TP_STYLES:
                styles[sub] = TP_STYLES[style]()
            elif style == GRAD_ALLREDUCE:
                partial.extend(f"{module_names[module]}.{n}" for n, _ in module.named_parameters())
        parallelize_module(layer, mesh, styles)
    return partial


def apply_fsdp(model: torch.nn.Module, mesh: DeviceMesh, *, device: str, dtype: torch.dtype) -> None:
    """Shard `model` in place over `mesh` (the data-parallel ranks; tensor-parallel parameters shard on)."""
    mp = mixed_precision(device, dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    # The root keeps embeddings, final norm and the output head; it stays gathered after forward, since
    # backward needs it right away.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
