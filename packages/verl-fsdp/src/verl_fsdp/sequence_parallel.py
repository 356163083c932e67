"""Ulysses sequence parallelism (`parallel.cp` on the fsdp engine): each of a row's cp ranks embeds and runs 1/cp of
its positions through the model. Attention is the one place positions meet: there q/k/v go from position chunks to
head groups by an all-to-all (every rank: all positions of 1/cp of the heads), attend over the whole sequence with
the whole sequence's mask, and come back by the reverse all-to-all. Activations per rank fall ~1/cp; the weights are
FSDP's business (sharded over dp x cp ranks).

The model runs its own attention code with this module's function swapped in for the duration of a forward
(`transformers.AttentionInterface`), so a Hugging Face model needs no patching; the mask is the 4D one the engine's
packing already builds (sdpa, eager)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional

import torch
import torch.distributed as dist
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from verl.utils.shared_prefix import MASKABLE_ATTENTION

ATTENTION = "verl_ulysses"
_ACTIVE: Dict[str, Any] = {}  # while a sharded forward runs: its group and the attention it wraps


def check_shapes(config: Any, cp: int, attn_implementation: str) -> None:
    """Heads must split evenly over cp ranks, and the attention must take the engine's 4D mask; say what does not."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    bad = {k: v for k, v in (("num_attention_heads", heads), ("num_key_value_heads", kv)) if v % cp}
    if bad:
        raise ValueError(f"parallel.cp={cp} must divide the model's {bad}: choose a cp that divides them")
    if attn_implementation not in MASKABLE_ATTENTION:
        raise ValueError(
            f"parallel.cp on the fsdp engine attends with a 4D mask over the whole sequence; "
            f"model.attn_implementation={attn_implementation} takes none: set it to one of {MASKABLE_ATTENTION}"
        )


class _AllToAll(torch.autograd.Function):
    """x [cp, ...]: chunk i goes to rank i, and chunk i of the result came from rank i. Its own inverse."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        x = x.contiguous()  # (empty_like keeps a view's strides; the collective writes whole rows)
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


class _GatherPositions(torch.autograd.Function):
    """[B, Lc, ...] on each rank -> [B, cp * Lc, ...] on every rank. Every cp rank then computes the same loss from
    the same gathered positions, so the gradient of this rank's positions is its slice of any rank's gradient; it is
    scaled by cp because FSDP averages parameter gradients over dp x cp ranks, while the cp ranks' parts add up to
    one data-parallel replica's gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.cp, ctx.rank, ctx.chunk = cp, rank, x.shape[1]
        out = torch.empty((cp * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)  # rank i's rows i*B .. (i+1)*B-1
        return out.view(cp, *x.shape).transpose(0, 1).flatten(1, 2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        return grad.narrow(1, ctx.rank * ctx.chunk, ctx.chunk) * ctx.cp, None


def _positions_to_heads(x: torch.Tensor, group: Any, cp: int) -> torch.Tensor:
    """[B, H, Lc, D] (all heads, this rank's positions) -> [B, H/cp, cp * Lc, D] (this rank's heads, all positions)."""
    b, h, lc, d = x.shape
    chunks = x.reshape(b, cp, h // cp, lc, d).transpose(0, 1)  # chunk i: the heads rank i attends with
    got = _AllToAll.apply(chunks, group)  # chunk i: rank i's positions of this rank's heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * lc, d)


def _heads_to_positions(x: torch.Tensor, group: Any, cp: int) -> torch.Tensor:
    """[B, L, H/cp, D] (attention's output layout: all positions, this rank's heads) -> [B, L/cp, H, D]."""
    b, length, h, d = x.shape
    chunks = x.reshape(b, cp, length // cp, h, d).transpose(0, 1)  # chunk i: rank i's positions
    got = _AllToAll.apply(chunks, group)  # chunk i: this rank's positions of rank i's heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, length // cp, cp * h, d)


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    **kwargs: Any,
) -> Any:
    group, cp, inner = _ACTIVE["group"], _ACTIVE["cp"], _ACTIVE["inner"]
    q, k, v = (_positions_to_heads(t, group, cp) for t in (query, key, value))
    out, weights = ALL_ATTENTION_FUNCTIONS[inner](module, q, k, v, attention_mask, **kwargs)
    return _heads_to_positions(out, group, cp), weights


AttentionInterface.register(ATTENTION, _attention)


@dataclass
class SequenceShards:
    """One micro-batch's positions split over the cp ranks of `group`: rows padded from `length` to a multiple of
    cp, this rank computing chunk `rank`."""

    group: Any
    cp: int
    rank: int
    length: int
    padded: int

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """[B, padded, ...] -> this rank's [B, padded / cp, ...]."""
        chunk = self.padded // self.cp
        return x[:, self.rank * chunk : (self.rank + 1) * chunk]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's [B, padded / cp, ...] outputs -> every position's [B, length, ...], differentiable."""
        return _GatherPositions.apply(x, self.group)[:, : self.length]

    @contextlib.contextmanager
    def attending(self, model: torch.nn.Module) -> Iterator[None]:
        """Run `model`'s attention through the all-to-alls while entered."""
        config: Any = model.config
        inner = config._attn_implementation
        _ACTIVE.update(group=self.group, cp=self.cp, inner=inner)
        config._attn_implementation = ATTENTION
        try:
            yield
        finally:
            config._attn_implementation = inner
            _ACTIVE.clear()


def shard(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    allowed: torch.Tensor,
    group: Any,
    attn_implementation: str,
    dtype: torch.dtype,
) -> tuple[Dict[str, torch.Tensor], SequenceShards]:
    """The model's inputs for this rank: its chunk of `input_ids` and `position_ids` [B, L], and the whole sequence's
    mask (`allowed` [B, 1, L, L] bool: query i may attend key j) as `attn_implementation` takes it, all padded to a
    multiple of cp positions."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    length = input_ids.shape[1]
    padded = -(-length // cp) * cp
    extra = padded - length
    if extra:
        input_ids = torch.nn.functional.pad(input_ids, (0, extra))
        position_ids = torch.nn.functional.pad(position_ids, (0, extra))
        allowed = torch.nn.functional.pad(allowed, (0, extra, 0, extra))
    # a query with no key to attend (padding) takes itself: no empty softmax row, no NaN in the backward
    alone = ~allowed.any(-1, keepdim=True)
    allowed = allowed | (alone & torch.eye(padded, dtype=torch.bool, device=allowed.device))
    mask: torch.Tensor = allowed
    if attn_implementation == "eager":  # additive
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
    shards = SequenceShards(group, cp, rank, length, padded)
    kwargs = dict(input_ids=shards.local(input_ids), position_ids=shards.local(position_ids), attention_mask=mask)
    return kwargs, shards


def padded_rows_allowed(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L] 0/1 padding mask -> [B, 1, L, L] bool: causal, and only real tokens as keys."""
    length = attention_mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device).tril()
    return causal[None, None] & attention_mask.bool()[:, None, None, :]
