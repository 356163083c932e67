"""Vocab-parallel log-prob and entropy: each tensor-parallel rank holds a slice of the output projection.

Each rank reduces its rows of the vocabulary to per-token partial states (online_softmax.Partials) with the same
kernels as the single-device path; two small all-reduces over [N] vectors combine them: a MAX of the row maxima,
then one SUM of the rebased sum-exp, the rebased entropy partial, the label logit (only the owning rank's is
non-zero) and a label hit count (so an out-of-range label is caught on every rank). Backward recomputes the local
logits and all-reduces the hidden-state gradient, so every rank gets the full gradient for hidden and the exact
gradient for its weight shard.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from verl_kernels.api import check_inputs, kernel_ops, run_fused
from verl_kernels.online_softmax import Partials


def combine_partials(p: Partials, hits: torch.Tensor, group) -> tuple[Partials, torch.Tensor]:
    """Merge every rank's partial state over its vocabulary slice into the full-vocabulary state (on all ranks)."""
    m = p.m.clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    w = torch.exp(p.m - m)
    # Rebased to the global max (see online_softmax.merge), the states simply add.
    packed = torch.stack([w * p.s, w * (p.t + p.s * (p.m - m)), p.label_logit, hits])
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    s, t, label_logit, hits = packed.unbind(0)
    return Partials(m, s, t, label_logit), hits


def vocab_parallel_linear_logprob_entropy(
    hidden: torch.Tensor,
    weight_shard: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_start: int,
    group: dist.ProcessGroup | None,
    temperature: float = 1.0,
    entropy_grad: bool = False,
    ignore_index: int = -100,
    impl: str = "chunked",
    chunk_tokens: int | None = None,
    chunk_vocab: int | None = None,
    reduce_grad_hidden: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """linear_logprob_entropy with the vocabulary split across the ranks of `group` (None: the default group).

    weight_shard [V_local, H] holds global vocabulary ids [vocab_start, vocab_start + V_local); the shards of the
    group must tile the vocabulary. hidden [..., H] and labels [...] (global ids) are the same on every rank, and
    every rank returns the same full-vocabulary logprob and entropy. The gradient for hidden is summed over the
    group in backward, so pass hidden as it is (not through Megatron's copy_to_tensor_model_parallel_region), or
    set reduce_grad_hidden=False if the caller already all-reduces it.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "vocab_parallel_linear_logprob_entropy needs torch.distributed initialised (init_process_group); "
            "for an unsharded weight use linear_logprob_entropy"
        )
    if not isinstance(vocab_start, int) or isinstance(vocab_start, bool) or vocab_start < 0:
        raise ValueError(
            f"vocab_start must be a non-negative int (the global id of weight_shard row 0); got {vocab_start!r}"
        )
    ops = kernel_ops(impl)
    if ops is None:
        raise ValueError(f"impl={impl!r} has no vocab-parallel form; use 'chunked' or 'triton'")
    check_inputs(hidden, weight_shard, labels, temperature, chunk_tokens, chunk_vocab, weight_name="weight_shard")
    setup_kwargs = {
        "vocab_start": vocab_start,
        "inv_temp": 1.0 / temperature,
        "entropy_grad": entropy_grad,
        "ignore_index": ignore_index,
        "combine": lambda p, hits: combine_partials(p, hits, group),
        "reduce_grad_hidden": (lambda g: dist.all_reduce(g, group=group)) if reduce_grad_hidden else None,
        "vocab_hint": "covered by the shards of the group ",
    }
    return run_fused(ops, hidden, weight_shard, labels, setup_kwargs, chunk_tokens, chunk_vocab)
