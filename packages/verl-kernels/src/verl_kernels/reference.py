"""The naive computation: full [N, V] logits, log-softmax, autograd. The definition every other path must match."""

from __future__ import annotations

import torch

from verl_kernels.precision import accum_dtype


def linear_logprob_entropy_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    entropy_grad: bool = False,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob, entropy) per row of hidden [N, H] against weight [V, H]; rows labelled ignore_index give 0, 0.

    Logits are computed in float32 (float64 for float64 inputs) from the inputs as given: the same numbers the
    fused paths produce, at the cost of [N, V] float32 tensors in forward and backward.
    """
    acc = accum_dtype(hidden.dtype)
    logits = hidden.to(acc) @ weight.to(acc).T
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    del logits  # autograd keeps what it needs; the name would keep another [N, V] alive
    valid = labels != ignore_index
    picked = logp.gather(-1, torch.where(valid, labels, 0).unsqueeze(-1)).squeeze(-1)
    logprob = torch.where(valid, picked, 0.0)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp.exp() * logp).sum(-1)
    entropy = torch.where(valid, entropy, 0.0)
    return logprob, entropy
