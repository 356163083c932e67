"""The optimizer's view of a model whose parameters live on several device meshes (tensor-parallel DTensors, FSDP
shards, plain tensors): torch's foreach/fused kernels take one kind at a time, so parameters go in one group per
mesh, and the gradient norm adds up each group's local shards over the ranks that split them."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate

from verl import engine_skeleton as parts


def _mesh_of(p: torch.Tensor) -> Any:
    return p.device_mesh if isinstance(p, DTensor) else None


def by_mesh(params: Iterable[torch.nn.Parameter]) -> List[List[torch.nn.Parameter]]:
    """Parameters grouped by the mesh they are DTensors on (plain tensors together), in first-seen order."""
    groups: Dict[Any, List[torch.nn.Parameter]] = {}
    for p in params:
        groups.setdefault(_mesh_of(p), []).append(p)
    return list(groups.values())


def adamw(params: Iterable[torch.nn.Parameter], optim: Any) -> torch.optim.AdamW:
    """engine_skeleton.adamw with one param group per mesh (a single group when all share one)."""
    groups = by_mesh(params)
    if len(groups) == 1:
        return parts.adamw(groups[0], optim)
    return parts.adamw([{"params": g} for g in groups], optim)  # type: ignore[misc]


def _squares(grads: List[torch.Tensor]) -> torch.Tensor:
    """Sum of squares of these gradients over every rank that holds a piece of them (one mesh and placement)."""
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    total = torch.stack(torch._foreach_norm(local, 2.0)).double().pow(2).sum()
    g = grads[0]
    if isinstance(g, DTensor):
        for dim, placement in enumerate(g.placements):
            if not isinstance(placement, Replicate) and g.device_mesh.size(dim) > 1:
                dist.all_reduce(total, group=g.device_mesh.get_group(dim))
    return total


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: Optional[float]) -> float:
    """The global L2 norm of the gradients (each element counted once), and the gradients scaled to `max_norm`
    when it is exceeded (None: only measured), as torch.nn.utils.clip_grad_norm_ does for one kind of tensor."""
    with_grad = [p for p in params if p.grad is not None]
    kinds: Dict[Any, List[torch.Tensor]] = {}
    for p in with_grad:
        grad = p.grad
        key = (_mesh_of(grad), tuple(grad.placements) if isinstance(grad, DTensor) else None)
        kinds.setdefault(key, []).append(grad)
    total = sum((_squares(g) for g in kinds.values()), torch.zeros((), dtype=torch.float64))
    norm = float(total.sqrt())
    if max_norm is not None and norm > 0:
        for group in by_mesh(with_grad):
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, torch.tensor(norm))
    return norm
