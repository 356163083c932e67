"""What a megatron role's state holds on one rank, before anything starts: parameters, gradients and optimizer
state in bytes, laid out as megatron-core lays them out (verl_fsdp.memory_model has the FSDP engine's); and the
activations its layers keep for backward.

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

from verl.decoder_dims import Dims
from verl.memory_model import ADAM_STEP_BYTES, FP32, MemoryModel, MicroBatch, PassSettings, StateBytes

NONE = StateBytes(0, 0, 0)


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
        total += _buffer_state(group, expert_dp, expert_rank) if expert else _buffer_state(group, dp, rank)
    return total


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
            max(
                (sum((chunk_state(c, dp, expert_dp, r, r) for c in part), NONE) for r in range(n)),
                key=lambda s: s.total,
            )
            for part, n in ((dense, dp), (experts, expert_dp))
        ]
        out.append(largest[0] + largest[1])
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


def activation_bytes(
    hf_config: Any, sizes: Dict[str, Any], mb: MicroBatch, settings: PassSettings, *, stage: int = 0
) -> int:
    """Bytes autograd keeps for backward from one micro-batch on one rank of pipeline stage `stage`, term by term
    what megatron-core's layers save: its local layers (no TransformerEngine: unfused attention keeps the softmax,
    [rows, heads, s, s]) as on CPU, or TransformerEngine's fused norm-linears and flash attention
    (`settings.fused_attention`: a GPU build). Tensor parallelism splits heads and the MLP; sequence parallelism
    also the norms' tokens; context parallelism the tokens. A mixture of experts' routed layers keep the router's
    choices, the permuted tokens and each routed token's expert MLP (k per token: balanced routing assumed, so with
    expert parallelism a rank's experts get k tokens per token it holds). The log-probs go through the
    vocab-parallel fused path: no [tokens, vocab] tensor."""
    from verl_megatron.hf_config import architecture

    d = Dims.of(hf_config)
    tp, pp, cp = (int(sizes.get(k) or 1) for k in ("tp", "pp", "cp"))
    etp = int(sizes.get("etp") or tp)
    chunks = int(sizes.get("vpp") or 1)
    sp = bool(sizes.get("sequence_parallel", tp > 1))
    e, h, head_dim = settings.dtype_bytes, d.hidden, d.head_dim
    seq = mb.seq // cp  # this rank's positions of each row
    t = mb.rows * seq
    tn = t // tp if sp else t  # tokens outside the tensor-parallel regions (norms, residual)
    q, kv, i_local, heads_local = d.q // tp, max(d.kv_heads // tp, 1) * head_dim, d.intermediate // tp, d.heads // tp
    if settings.fused_attention:  # fused norm + linear: its input, 1/rms, normed output; flash: q, k, v, out, lse
        norm = (2 * e * h + FP32) * tn
        attention = norm + e * (2 * q + 2 * kv) * t + FP32 * heads_local * t + e * q * t
        dense = norm + 4 * e * i_local * t
    else:  # torch's rms_norm keeps input, 1/rms, the normed input; the linear after it its input
        norm = (3 * e * h + FP32) * tn
        rope = 4 * e * head_dim * t  # cos and sin, for queries and keys, per layer
        # q and k, v repeated to every query head; the softmax [rows, heads, s/cp, s]; the bool mask; the context
        attention = norm + rope + 3 * e * q * t + e * mb.rows * heads_local * seq * mb.seq + seq * mb.seq + e * q * t
        if architecture(hf_config).qk_norm:  # q's input and output; k's input (a view of the qkv output), output
            attention += (2 * e * q + e * (q + 2 * kv) + e * kv + FP32 * (heads_local + kv // head_dim)) * t
        dense = norm + 5 * e * i_local * t  # gate|up [2i], SiLU(gate) and up for their product, the product
    # a routed layer: the router's top-k indices and probabilities, its [experts, tokens] map and probabilities,
    # the sorted indices; the permuted tokens and probabilities; per routed token fc1 [2i], SiLU, up, their product
    # (and its copy weighted by the probability), fc2's input
    k = d.top_k
    moe_mlp = norm + ((20 * k + 5 * d.experts) + e * h * k + FP32 * k + 6 * e * (d.expert_intermediate // etp) * k) * tn
    per_chunk = d.layers // (pp * chunks)
    mine = [i for c in range(chunks) for i in range((c * pp + stage) * per_chunk, (c * pp + stage + 1) * per_chunk)]
    kinds = [attention + (moe_mlp if d.routed[i] else dense) for i in mine]
    first = 8 * t if stage == 0 else 0  # input ids
    kept = mb.rows * mb.response // cp
    last = ((2 * e * h + FP32) * tn + e * h * kept + 24 * kept) if stage == pp - 1 else 0  # final norm; the head
    if settings.recompute:
        # Full recompute: each layer keeps its input (and the rotary table, shared); backward recomputes one layer
        # at a time, after the head's saved tensors are gone. The recomputed layer's input is the one kept.
        inputs = e * h * tn
        return first + e * head_dim * t + max(len(mine) * inputs + last, (len(mine) - 1) * inputs + max(kinds))
    return first + sum(kinds) + last


MEMORY_MODEL = MemoryModel(
    state_bytes=state_bytes, activation_bytes=activation_bytes, keeps_gradients=True, vocab_parallel_logits=True
)
