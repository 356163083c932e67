"""Context parallelism: each of the cp ranks of a group runs the model on a part of every sequence.

The split is megatron's load-balanced one (the one TransformerEngine's attention and megatron's RoPE expect):
a sequence padded to a multiple of 2*cp is cut into 2*cp chunks, and cp rank r holds chunks r and 2*cp-1-r, so
every rank gets as many early (cheap) as late (expensive) causal-attention rows.

On GPU, TransformerEngine's attention exchanges keys and values between the ranks. Without it (CPU, or a GPU
build without TE), `AllGatherContextAttention` does: it all-gathers the keys and values of the group (the
all-gather variant of context parallelism) and masks by the tokens' global positions.

Per-token outputs (log-probs, entropy, values) are computed by the rank that holds the predicting position and
summed over the group (`sum_over_group`), so every rank ends with the full [B, R] outputs and the same loss;
each rank's gradient is its own positions' share.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist
from megatron.core.transformer.dot_product_attention import DotProductAttention


def chunk_positions(seq_len: int, cp: int, cp_rank: int, device: Any = None) -> torch.Tensor:
    """Global positions [seq_len / cp] held by `cp_rank`: chunks cp_rank and 2*cp-1-cp_rank of 2*cp."""
    if seq_len % (2 * cp):
        raise ValueError(f"sequence length {seq_len} is not a multiple of 2*cp = {2 * cp}")
    size = seq_len // (2 * cp)
    first = torch.arange(cp_rank * size, (cp_rank + 1) * size, device=device)
    second = torch.arange((2 * cp - 1 - cp_rank) * size, (2 * cp - cp_rank) * size, device=device)
    return torch.cat([first, second])


def local_index(positions: torch.Tensor, seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """For global `positions`, their index in this rank's part of the sequence, or -1 where another rank has them."""
    mine = chunk_positions(seq_len, cp, cp_rank, positions.device)
    where = torch.full((seq_len,), -1, dtype=torch.long, device=positions.device)
    where[mine] = torch.arange(mine.numel(), device=positions.device)
    return where[positions]


@functools.lru_cache(maxsize=4)
def causal_mask(seq_len: int, cp: int, cp_rank: int, device: torch.device) -> torch.Tensor:
    """[1, 1, s/cp, s] True where this rank's query may not see a key of the gathered (rank-ordered) sequence.

    Cached: every layer of a forward pass asks for the same one (callers must not modify it)."""
    q_pos = chunk_positions(seq_len, cp, cp_rank, device)
    k_pos = torch.cat([chunk_positions(seq_len, cp, r, device) for r in range(cp)])
    return (k_pos[None, :] > q_pos[:, None])[None, None]


class _SumOverGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
        return grad, None


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        out = x.new_empty((x.shape[0] * dist.get_world_size(group), *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
        size = dist.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] // size, *grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


def sum_over_group(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """All-reduce sum whose backward passes the gradient through: each rank differentiates only the outputs it
    computed. Megatron's schedule multiplies the loss by cp and its DDP averages gradients over dp*cp, which
    together sum the ranks' shares."""
    return _SumOverGroup.apply(x, group)


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The group's parts [s/cp, ...] concatenated in rank order; backward sums every rank's gradient of a part
    into the rank that holds it (a reduce-scatter)."""
    return _GatherSequence.apply(x, group)


class AllGatherContextAttention(DotProductAttention):
    """megatron's local attention for cp > 1: keys and values all-gathered over the context-parallel group."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        from megatron.core import parallel_state as mpu

        # DotProductAttention refuses cp > 1 because it cannot see the other ranks' keys; this class brings them.
        single = copy.copy(config)
        single.context_parallel_size = 1
        super().__init__(single, *args, **kwargs)
        self.config = config
        self.cp_group = mpu.get_context_parallel_group()
        self.cp = config.context_parallel_size
        self.cp_rank = mpu.get_context_parallel_rank()

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Any = None,
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        local = query.shape[0]  # [s/cp, b, heads, head_dim]
        seq_len = local * self.cp
        # Backward sums each rank's key/value gradients back to the rank that owns the tokens.
        key, value = gather_sequence(key, self.cp_group), gather_sequence(value, self.cp_group)
        # Padded rows: causal over global positions. Packed rows bring their own mask, [b, 1, s/cp, s] over this
        # rank's queries and the keys in gathered (rank) order.
        masked = causal_mask(seq_len, self.cp, self.cp_rank, query.device) if attention_mask is None else attention_mask
        return super().forward(query, key, value, masked, attn_mask_type, attention_bias, packed_seq_params)
