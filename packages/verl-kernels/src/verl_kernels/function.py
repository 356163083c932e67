"""The autograd function every fused implementation shares.

Forward: the implementation's kernels reduce each row over the local vocabulary to a partial state (see
online_softmax); an optional `combine` merges states across tensor-parallel ranks; the finished per-row log-sum-exp
and entropy are saved. Backward: the kernels recompute logits block by block from hidden and weight and turn them
into gradients, so no [N, V] tensor exists in either direction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from verl_kernels.online_softmax import Partials, finish


class KernelOps(NamedTuple):
    """The two kernels an implementation provides (see chunked.py for the reference signatures)."""

    # (hidden [N,H], weight [V,H], labels [N], vocab_start, inv_temp, chunk_tokens, chunk_vocab) -> Partials
    partials: Callable[..., Partials]
    # (hidden, weight, labels, vocab_start, inv_temp, lse, entropy, g_logprob, g_entropy | None,
    #  need_hidden, need_weight, chunk_tokens, chunk_vocab) -> (grad_hidden | None, grad_weight | None),
    # grad_hidden in the accumulation dtype (it may still be summed across ranks), grad_weight in weight's dtype
    grads: Callable[..., tuple[torch.Tensor | None, torch.Tensor | None]]
    # default (chunk_tokens, chunk_vocab) for a device type
    default_chunks: Callable[[torch.device], tuple[int, int]]


def _single_shard(p: Partials, hits: torch.Tensor) -> tuple[Partials, torch.Tensor]:
    return p, hits


@dataclass(frozen=True)
class Setup:
    """Everything but the tensors: how to compute, and across which shards."""

    vocab_start: int  # global id of weight row 0
    inv_temp: float
    entropy_grad: bool
    ignore_index: int
    chunk_tokens: int
    chunk_vocab: int
    # Merge per-rank partial states and label hit counts into global ones (identity for a single shard).
    combine: Callable[[Partials, torch.Tensor], tuple[Partials, torch.Tensor]] = _single_shard
    # Sum the hidden-state gradient over ranks in place (None: this shard's gradient is the whole gradient).
    reduce_grad_hidden: Callable[[torch.Tensor], None] | None = None
    vocab_hint: str = ""  # how the vocabulary is described in the out-of-range label error


class LinearLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, ops: KernelOps, setup: Setup):
        p = ops.partials(
            hidden, weight, labels, setup.vocab_start, setup.inv_temp, setup.chunk_tokens, setup.chunk_vocab
        )
        local = labels - setup.vocab_start
        hits = ((local >= 0) & (local < weight.shape[0])).to(p.m.dtype)
        p, hits = setup.combine(p, hits)
        valid = labels != setup.ignore_index
        bad = valid & (hits != 1)
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"labels: {int(bad.sum())} label(s) outside the vocabulary {setup.vocab_hint}"
                f"(first at flat position {first}: {int(labels[first])}); use ignore_index={setup.ignore_index} "
                "for positions without a label"
            )
        logprob, entropy, lse = finish(p, valid)
        ctx.save_for_backward(hidden, weight, labels, lse, entropy)
        ctx.setup, ctx.ops = setup, ops
        if not setup.entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, g_logprob, g_entropy):
        hidden, weight, labels, lse, entropy = ctx.saved_tensors
        setup: Setup = ctx.setup
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        valid = labels != setup.ignore_index
        # Ignored rows contribute nothing, whatever gradient arrives for them.
        g_logprob = torch.where(valid, g_logprob, 0.0).to(lse.dtype)
        g_entropy = torch.where(valid, g_entropy, 0.0).to(lse.dtype) if setup.entropy_grad else None
        grad_hidden, grad_weight = ctx.ops.grads(
            hidden,
            weight,
            labels,
            setup.vocab_start,
            setup.inv_temp,
            lse,
            entropy,
            g_logprob,
            g_entropy,
            need_hidden,
            need_weight,
            setup.chunk_tokens,
            setup.chunk_vocab,
        )
        if grad_hidden is not None:
            # Summed across ranks before rounding to the input dtype.
            if setup.reduce_grad_hidden is not None:
                setup.reduce_grad_hidden(grad_hidden)
            grad_hidden = grad_hidden.to(hidden.dtype)
        return grad_hidden, grad_weight, None, None, None
