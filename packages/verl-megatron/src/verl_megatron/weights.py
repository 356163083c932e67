"""Move weights between this rank's megatron model chunks and Hugging Face tensors.

`load_hf` fills the chunks from an HF folder, each rank reading only the tensors its shards are cut from.
`stream_hf` is the 3D-HybridEngine's gather: one HF tensor at a time (never a second full copy of the model),
each assembled from the tensor-parallel shards of its pipeline stage and then sent to the other stages, in the
layout a generation engine with tensor parallelism `gen_tp` asks for (gen_tp=1: the full tensor; gen_tp=g:
this rank's generation shard, gathered only inside its micro data-parallel group of tp/g ranks, as in HybridFlow).
A mixture of experts' expert is gathered over its expert tensor-parallel group on the expert-parallel rank that
holds it, then broadcast to the other expert-parallel ranks (generation engines take whole experts: gen_tp=1).
`stream_shards` gathers nothing: each rank yields its own piece of every HF tensor, for a rollout on a pool of its
own that joins the ranks' pieces (verl.workers.weight_transfer.send_weight_shards).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from verl.engine_protocol import Shard
from verl_megatron import moe
from verl_megatron.convert import Dims, Placement, local_placements, mcore_to_hf
from verl_megatron.parallel import Layout

Tensor = torch.Tensor


def unwrap(module: Any) -> Any:
    """The GPT model inside megatron's DDP (and any Float16Module) wrapper."""
    while hasattr(module, "module"):
        module = module.module
    return module


def chunk_params(chunks: Sequence[torch.nn.Module]) -> List[Dict[str, Tensor]]:
    return [dict(unwrap(c).named_parameters()) for c in chunks]


def tp_split(p: Placement, layout: Layout) -> Tuple[int, int]:
    """(rank, size) of the tensor-parallel group that splits `p`: the expert one for an expert's weights."""
    return (layout.etp_rank, layout.etp) if p.rule.axis == "etp" else (layout.tp_rank, layout.tp)


@torch.no_grad()
def load_hf(
    chunks: Sequence[torch.nn.Module],
    placements: Sequence[Placement],
    read: Callable[[str], Tensor],
    layout: Layout,
    dims: Dims,
    *,
    optional: Sequence[str] = (),
) -> List[str]:
    """Copy this rank's shard of every placement into the chunks; returns the HF names left at their init.

    `optional` HF names may be absent from the folder (a value head when starting a critic from a causal LM);
    any other tensor the model needs and the folder lacks is an error naming both.
    """
    missing: List[str] = []
    for vp_stage, params in enumerate(chunk_params(chunks)):
        mine = local_placements(placements, layout.pp_rank, vp_stage, layout.ep_rank)
        unplaced = sorted(set(params) - set(mine))
        if unplaced:
            raise RuntimeError(f"megatron parameters with no conversion rule: {unplaced}")
        for name, p in mine.items():
            if name not in params:
                raise RuntimeError(f"the conversion plan expects '{name}' in model chunk {vp_stage}, which lacks it")
            try:
                hf = [read(n) for n in p.hf_names]
            except KeyError:
                if all(n in optional for n in p.hf_names):
                    missing += list(p.hf_names)
                    continue
                raise
            shard = p.rule.to_mcore(hf, *tp_split(p, layout), dims)
            target = params[name]
            if shard.shape != target.shape:
                raise ValueError(
                    f"{'/'.join(p.hf_names)} gives a shard of shape {tuple(shard.shape)} for '{name}', which has "
                    f"shape {tuple(target.shape)}: the HF config and its weights disagree"
                )
            target.copy_(shard)
    return missing


@dataclass
class SyncStats:
    """What one pass of `stream_hf` moved over collectives, as seen by this rank."""

    received_bytes: int = 0  # bytes that arrived from other ranks (all-gather pieces, broadcasts)
    tensors: int = 0


@dataclass
class GenerationGroups:
    """Micro data-parallel groups for a generation tensor parallelism of `gen_tp` (HybridFlow, TP_gen <= TP_train).

    The training TP group of size t splits into g = gen_tp blocks of m = t/g consecutive ranks; block k gathers
    the training shards it holds into generation shard k, so a rank's generation tp rank is tp_rank // m.
    """

    gen_tp: int
    micro_dp: int
    group: Any  # this rank's micro data-parallel group (None: the training TP group itself)
    gen_tp_rank: int
    _all: List[Any] = field(default_factory=list, repr=False)


def generation_groups(layout: Layout, gen_tp: int) -> GenerationGroups:
    """Create (collectively, on every rank of the world) the micro-DP groups for `gen_tp`."""
    from megatron.core import parallel_state as mpu

    if gen_tp < 1 or layout.tp % gen_tp:
        raise ValueError(
            f"rollout tensor parallelism {gen_tp} must divide the actor's tp={layout.tp} (HybridFlow regroups each "
            "training TP group into micro data-parallel groups); set rollout.parallel.tp to a divisor"
        )
    m = layout.tp // gen_tp
    if gen_tp == 1:
        return GenerationGroups(1, m, mpu.get_tensor_model_parallel_group(), 0)
    world, mine, groups = dist.get_world_size(), None, []
    for start in range(0, world, layout.tp):  # every TP group is a run of tp consecutive global ranks
        for block in range(gen_tp):
            ranks = list(range(start + block * m, start + (block + 1) * m))
            g = dist.new_group(ranks)
            groups.append(g)
            if dist.get_rank() in ranks:
                mine = g
    return GenerationGroups(gen_tp, m, mine, layout.tp_rank // m, groups)


def hf_shapes(hf_config: Any, kind: str) -> Dict[str, torch.Size]:
    """Shape of every HF tensor under its checkpoint name, from a meta-device instance of the HF model (no memory)."""
    import copy

    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    cfg = copy.deepcopy(hf_config)
    with torch.device("meta"):
        if kind == "value":
            cfg.num_labels = 1
            model = AutoModelForTokenClassification.from_config(cfg)
        else:
            model = AutoModelForCausalLM.from_config(cfg)
    if not moe.is_moe(cfg):
        return {n: p.shape for n, p in model.named_parameters()}
    # transformers fuses a layer's experts (and renames Mixtral's block) in memory; checkpoints, and the converter,
    # name each expert: its own reverse conversion gives those names (on the meta tensors, no memory)
    from verl.utils.hf_files import checkpoint_tensors

    return {k: t.shape for n, p in model.named_parameters() for k, t in checkpoint_tensors(model, n, p)}


@torch.no_grad()
def stream_hf(
    chunks: Sequence[torch.nn.Module],
    placements: Sequence[Placement],
    layout: Layout,
    dims: Dims,
    shapes: Dict[str, torch.Size],
    *,
    dtype: torch.dtype,
    gen: Optional[GenerationGroups] = None,
    stats: Optional[SyncStats] = None,
) -> Iterator[Tuple[str, Tensor]]:
    """(HF name, tensor) for the whole model, one at a time, on every rank (collective: all ranks iterate fully).

    With gen.gen_tp > 1 the tensors are this rank's generation shards (HF names, split as the generation engine's
    tensor parallelism splits them); replicated tensors (norms) are whole.
    """
    from megatron.core import parallel_state as mpu

    gen = gen or generation_groups(layout, 1)
    stats = stats if stats is not None else SyncStats()
    params = chunk_params(chunks)
    pp_group = mpu.get_pipeline_model_parallel_group()
    device = next(iter(params[0].values())).device
    if gen.gen_tp > 1 and any(p.expert is not None for p in placements):
        raise ValueError(
            f"rollout tensor parallelism {gen.gen_tp} with a mixture of experts: experts stream whole (gen_tp=1); "
            "the generation engine slices its own shards (vLLM, SGLang)"
        )
    for p in placements:
        if p.mirror:
            continue
        pieces: Optional[List[Tensor]] = None
        if p.pp_rank == layout.pp_rank:
            if p.expert is not None:
                pieces = _expert_pieces(p, params, layout, dims, dtype, stats)
            else:
                pieces = _dense_pieces(p, params, layout, dims, dtype, gen, stats)
        if layout.pp > 1:
            pieces = _broadcast_from_stage(p, pieces, layout, gen, dims, shapes, dtype, device, pp_group, stats)
        for name, tensor in zip(p.hf_names, pieces):
            stats.tensors += 1
            yield name, tensor


def _dense_pieces(p, params, layout, dims, dtype, gen, stats) -> List[Tensor]:
    """The HF tensors of `p`, assembled inside this rank's (micro data-parallel) tensor-parallel group."""
    local = params[p.vp_stage][p.local_name].detach()
    if p.rule.kind == "replicate" or gen.micro_dp == 1:
        shards, first = [local], layout.tp_rank if p.rule.kind != "replicate" else 0
    else:
        shards = [torch.empty_like(local) for _ in range(gen.micro_dp)]
        dist.all_gather(shards, local.contiguous(), group=gen.group)
        stats.received_bytes += (gen.micro_dp - 1) * local.numel() * local.element_size()
        first = gen.gen_tp_rank * gen.micro_dp
    tp_total = layout.tp if p.rule.kind != "replicate" else 1
    return [t.to(dtype) for _, t in mcore_to_hf(p, shards, first, tp_total, dims)]


def _expert_pieces(p, params, layout, dims, dtype, stats) -> List[Tensor]:
    """An expert's whole HF tensors on every rank of the stage: gathered over the expert tensor-parallel group,
    then sent from the expert-parallel rank holding the expert. Every EP rank gathers its own local expert of
    the same index alongside (same shapes), so the collectives line up without a shape exchange."""
    from megatron.core import parallel_state as mpu

    local = params[p.vp_stage][p.local_name].detach()
    shards = [local]
    if layout.etp > 1:
        shards = [torch.empty_like(local) for _ in range(layout.etp)]
        dist.all_gather(shards, local.contiguous(), group=mpu.get_expert_tensor_parallel_group())
        stats.received_bytes += (layout.etp - 1) * local.numel() * local.element_size()
    pieces = [t.to(dtype).contiguous() for _, t in mcore_to_hf(p, shards, 0, layout.etp, dims)]
    if layout.ep > 1:
        group = mpu.get_expert_model_parallel_group()
        src = dist.get_global_rank(group, p.ep_rank)
        for t in pieces:
            dist.broadcast(t, src=src, group=group)
            if layout.ep_rank != p.ep_rank:
                stats.received_bytes += t.numel() * t.element_size()
    return pieces


def tp_shape(p: Placement, full: torch.Size, tp: int, rank: int, dims: Dims) -> torch.Size:
    """Shape of tensor-parallel rank `rank`'s piece (of `tp`) of an HF tensor whose full shape is `full`."""
    if tp == 1 or p.rule.kind == "replicate":
        return full
    if p.rule.kind == "row":
        return torch.Size([full[0], full[1] // tp])
    if p.rule.kind == "vocab":
        rows = dims.padded_vocab // tp
        return torch.Size([max(0, min(rows, dims.vocab_size - rank * rows)), *full[1:]])
    return torch.Size([full[0] // tp, *full[1:]])  # qkv (heads and groups split evenly), glu


def sender_table(layout: Layout) -> List[Tuple[int, int, bool]]:
    """What each rank of the role holds, in global rank order: (tp rank, pipeline rank, sends); only the first
    data- and context-parallel replica sends, the others hold the same pieces. Collective over the default group."""
    table: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(table, (layout.tp_rank, layout.pp_rank, layout.dp_rank == 0 and layout.cp_rank == 0))
    return table


@torch.no_grad()
def stream_shards(
    chunks: Sequence[torch.nn.Module],
    placements: Sequence[Placement],
    layout: Layout,
    dims: Dims,
    shapes: Dict[str, torch.Size],
    *,
    dtype: torch.dtype,
    before: Optional[Callable[[], None]] = None,
) -> Iterator[Shard]:
    """This rank's block of every HF tensor, for a rollout pool that joins the ranks' blocks:
    a tensor-parallel rank's piece of its pipeline stage's tensors (rows of q/k/v, gate/up and the vocabulary;
    columns of o_proj and down_proj), a replicated tensor (a norm) from the stage's tp rank 0, an empty block
    elsewhere. Global rank order runs tp fastest, so the stage's pieces join in tp order. Dense models only: a
    mixture of experts' experts stream whole (`stream_hf`). Collective once (every rank's place, `sender_table`).
    `before` runs when the stream is first read (the engine's parameters back on the device), not when it is made."""
    if before is not None:
        before()
    table = sender_table(layout)
    params = chunk_params(chunks)
    device = next(iter(params[0].values())).device
    me = dist.get_rank()
    for p in placements:
        if p.mirror:
            continue
        whole = p.rule.kind == "replicate"
        holders = {r for r, (tp_rank, pp_rank, sends) in enumerate(table) if sends and pp_rank == p.pp_rank}
        if whole:
            holders = {r for r in holders if table[r][0] == 0}
        elif (order := [table[r][0] for r in sorted(holders)]) != list(range(layout.tp)):  # (joined in rank order)
            raise RuntimeError(
                f"{p.hf_names[0]}: its holders' tp ranks run {order} in global rank order, not 0..{layout.tp - 1}: "
                "the pieces would join out of order"
            )
        pieces: Optional[List[Tensor]] = None
        if me in holders:
            local = params[p.vp_stage][p.local_name].detach()
            first, tp = (0, 1) if whole else (layout.tp_rank, layout.tp)
            pieces = [t.to(dtype) for _, t in mcore_to_hf(p, [local], first, tp, dims)]
        dim = 1 if p.rule.kind == "row" else 0
        for i, name in enumerate(p.hf_names):
            full = shapes[name]
            sizes = [
                tp_shape(p, full, 1 if whole else layout.tp, table[r][0], dims)[dim] if r in holders else 0
                for r in range(len(table))
            ]
            if pieces is not None:
                part = pieces[i]
            else:
                part = torch.empty(*full[:dim], 0, *full[dim + 1 :], dtype=dtype, device=device)
            yield Shard(name, part, tuple(full), dim, sizes)


def _broadcast_from_stage(p, pieces, layout, gen, dims, shapes, dtype, device, pp_group, stats) -> List[Tensor]:
    src = dist.get_global_rank(pp_group, p.pp_rank)
    if pieces is None:
        pieces = [
            torch.empty(tp_shape(p, shapes[n], gen.gen_tp, gen.gen_tp_rank, dims), dtype=dtype, device=device)
            for n in p.hf_names
        ]
        receiving = True
    else:
        receiving = False
    for t in pieces:
        dist.broadcast(t, src=src, group=pp_group)
        if receiving:
            stats.received_bytes += t.numel() * t.element_size()
    return pieces
