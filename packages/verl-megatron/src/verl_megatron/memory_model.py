"""What a megatron role's state holds on one rank, before anything starts: parameters, gradients and optimizer
state in bytes, laid out as megatron-core lays them out (verl.memory_model has the FSDP engine's).

The engine wraps each model chunk in megatron's DistributedDataParallel with the distributed optimizer and fp32
gradient reduction. DDP puts the trained parameters of a chunk into contiguous buffers, one per parameter dtype,
dense and expert parameters apart, in reverse order (backprop's): every parameter starts at a multiple of 64
values, and a bucket (the whole buffer: no overlapped reduction, so no size cap; a pipeline-shared embedding has a
bucket of its own) ends padded to a multiple of lcm(data-parallel size, 128). Parameters are views of the param
buffer (the model's dtype); gradients live in a grad buffer of as many fp32 values. The distributed optimizer gives
data-parallel rank r the r-th equal slice of each bucket (dense buckets split over data x context parallel ranks,
expert buckets over the expert data-parallel ranks) and keeps, for the parameter pieces in it, fp32 main copies
(bf16 models; an fp32 model's pieces are views of its parameters), AdamW's two fp32 moments and a 4-byte step per
piece. `MegatronEngine.held_bytes()` counts the same from the tensors (tested equal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

from verl.memory_model import ADAM_STEP_BYTES, FP32, StateBytes


@dataclass(frozen=True)
class Param:
    """One parameter of a model chunk as DDP sees it."""

    numel: int
    element_size: int
    trains: bool = True
    expert: bool = False  # megatron's `allreduce=False`: reduced over the expert data-parallel group
    shared_embedding: bool = False  # the pipeline-tied embedding / output weight: a bucket of its own


def _pad(n: int, divisor: int) -> int:
    return -(-n // divisor) * divisor


def buckets(params: Sequence[Param], dp: int) -> List[Tuple[int, int, List[Tuple[int, int]]]]:
    """(start, end, [(param start, param end), ...]) of each bucket of one DDP buffer over `dp` ranks, as
    megatron's _ParamAndGradBuffer places `params` (given in the module's order)."""
    out: List[Tuple[int, int, List[Tuple[int, int]]]] = []
    bucket_start, at = 0, 0
    held: List[Tuple[int, int]] = []
    divisor = math.lcm(dp, 128)
    for p in reversed(params):
        at = _pad(at, 64)
        if p.shared_embedding and held:
            out.append((bucket_start, _pad(at, divisor), held))
            bucket_start = at = out[-1][1]
            held = []
        held.append((at, at + p.numel))
        at += p.numel
        if p.shared_embedding:
            out.append((bucket_start, _pad(at, divisor), held))
            bucket_start = at = out[-1][1]
            held = []
    if held:
        out.append((bucket_start, _pad(at, divisor), held))
    return out


def _buffer_state(params: Sequence[Param], dp: int, rank: int) -> StateBytes:
    size = params[0].element_size
    laid = buckets(params, dp)
    numel = laid[-1][1] if laid else 0
    optimizer = 0
    for start, end, held in laid:
        piece = (end - start) // dp
        lo, hi = start + rank * piece, start + (rank + 1) * piece
        for p_start, p_end in held:
            mine = min(hi, p_end) - max(lo, p_start)
            if mine > 0:  # main copy (bf16 models), exp_avg, exp_avg_sq, step
                optimizer += mine * ((FP32 if size != FP32 else 0) + 2 * FP32) + ADAM_STEP_BYTES
    return StateBytes(numel * size, numel * FP32, optimizer)


def chunk_state(params: Sequence[Param], dp: int, expert_dp: int, rank: int = 0, expert_rank: int = 0) -> StateBytes:
    """One DDP-wrapped chunk's state on the rank that is `rank` of its `dp` data-parallel ranks and `expert_rank` of
    its `expert_dp` expert data-parallel ones; a chunk that does not train (the reference) holds its parameters
    alone."""
    total = StateBytes(sum(p.numel * p.element_size for p in params if not p.trains), 0, 0)
    groups: Dict[Tuple[bool, int], List[Param]] = {}
    for p in params:
        if p.trains:
            groups.setdefault((p.expert, p.element_size), []).append(p)
    for (expert, _), group in groups.items():
        part = _buffer_state(group, expert_dp, expert_rank) if expert else _buffer_state(group, dp, rank)
        total = StateBytes(total.params + part.params, total.grads + part.grads, total.optimizer + part.optimizer)
    return total


def _sum(states: Sequence[StateBytes]) -> StateBytes:
    return StateBytes(*(sum(getattr(s, f) for s in states) for f in ("params", "grads", "optimizer")))


def module_params(module: Any, trains: bool) -> List[Param]:
    """The DDP view of a (meta or real) model chunk's parameters, in its named_parameters order."""
    return [
        Param(
            numel=t.numel(),
            element_size=t.element_size(),
            trains=trains and t.requires_grad,
            expert=not getattr(t, "allreduce", True),
            shared_embedding=bool(getattr(t, "shared_embedding", False)),
        )
        for _, t in module.named_parameters()
    ]


def data_parallel_sizes(sizes: Dict[str, Any]) -> Tuple[int, int]:
    """(dense, expert) data-parallel sizes the distributed optimizer shards over: dp x cp, and the stage's
    tp x cp x dp ranks over ep x etp."""
    tp, cp, dp, ep = (int(sizes.get(k) or 1) for k in ("tp", "cp", "dp", "ep"))
    etp = int(sizes.get("etp") or tp)
    return dp * cp, tp * cp * dp // (ep * etp)


def state_bytes(
    hf_config: Any, sizes: Dict[str, Any], *, kind: str = "causal_lm", trains: bool = True, dtype: Any = None
) -> List[StateBytes]:
    """Each pipeline stage's state on its largest data-parallel rank (tensor-parallel ranks hold alike), from
    megatron-core's own build of the chunks on the meta device in `dtype` (default bf16)."""
    from verl_megatron.model_info import built_stages

    dp, expert_dp = data_parallel_sizes(sizes)
    out = []
    for chunks in built_stages(hf_config, sizes, kind=kind, dtype=dtype):
        stage = [module_params(c, trains) for c in chunks]
        dense = [[p for p in params if not p.expert] for params in stage]
        experts = [[p for p in params if p.expert] for params in stage]
        # (the largest dense slice plus the largest expert slice: at most what the largest rank holds)
        largest = [
            max((_sum([chunk_state(c, dp, expert_dp, r, r) for c in part]) for r in range(n)), key=lambda s: s.total)
            for part, n in ((dense, dp), (experts, expert_dp))
        ]
        out.append(_sum(largest))
    return out


def held_bytes(params: Sequence[Any], grads: Sequence[Any], optimizer: Sequence[Any]) -> Dict[str, int]:
    """Bytes of the distinct storages behind a rank's parameters, gradients and optimizer tensors, each storage
    counted once and under the first of the three that uses it (an fp32 model's main params view its parameters)."""
    seen: set = set()

    def count(tensors: Sequence[Any]) -> int:
        total = 0
        for t in tensors:
            if t is None:
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    return {"params": count(params), "grads": count(grads), "optimizer": count(optimizer)}
