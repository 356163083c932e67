"""The critic's clipped value loss (PPO): new predictions may move at most cliprange_value from the old values."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from verl.algos.aggregation import agg_loss
from verl.algos.utils import masked_mean, zero_padding

__all__ = ["compute_value_loss"]


def compute_value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    *,
    cliprange_value: float,
    loss_agg_mode: str,
    norm_length: int | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """0.5 * agg(max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)), with metrics vf_clipfrac and vpred_mean.

    vf_clipfrac: tokens where the clipped prediction gave the larger error (its gradient is then 0).
    """
    for name, t in (("returns", returns), ("values", values), ("response_mask", response_mask)):
        if t.shape != vpreds.shape:
            raise ValueError(f"{name} {tuple(t.shape)} must match vpreds {tuple(vpreds.shape)}")
    if cliprange_value < 0:
        raise ValueError(f"critic.cliprange_value must be >= 0, got {cliprange_value}")
    v, r, old = zero_padding(response_mask, vpreds, returns, values)
    v_clipped = torch.clamp(v, old - cliprange_value, old + cliprange_value)
    loss_unclipped = (v - r) ** 2
    loss_clipped = (v_clipped - r) ** 2
    loss = 0.5 * agg_loss(
        torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode, norm_length=norm_length
    )
    metrics = {
        "vf_clipfrac": masked_mean((loss_clipped > loss_unclipped).to(v.dtype), response_mask).detach(),
        "vpred_mean": masked_mean(v, response_mask).detach(),
    }
    return loss, metrics
