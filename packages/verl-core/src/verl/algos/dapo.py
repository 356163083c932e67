"""DAPO's batch-shaping pieces: the dynamic-sampling group filter and the soft overlong reward penalty."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from verl.algos.utils import group_ids

__all__ = ["filter_groups", "overlong_penalty"]


def filter_groups(scores: Tensor | np.ndarray, index: Any, *, keep_singletons: bool = False) -> tuple[np.ndarray, int]:
    """(keep_mask bool[B], n_groups_dropped): drop every group whose scores are all equal.

    Such a group gets zero advantage from any group baseline, so it only dilutes the batch (DAPO's dynamic
    sampling keeps generating until enough informative groups remain). Equality is exact: scores that
    differ by rounding are different. A group of one sample is all-equal by definition and is dropped too,
    since the group estimators here give it zero advantage; upstream DAPO keeps it (its GRPO gives a lone
    sample its raw reward): keep_singletons=True does the same.
    """
    values = (
        scores.detach().cpu().double().numpy() if isinstance(scores, Tensor) else np.asarray(scores, dtype=np.float64)
    )
    if values.ndim != 1:
        raise ValueError(f"filter_groups takes one score per sample, shape [batch]; got {values.shape}")
    gid, n = group_ids(index, values.shape[0])
    gids = gid.numpy()
    hi = np.full(n, -np.inf)
    lo = np.full(n, np.inf)
    np.maximum.at(hi, gids, values)
    np.minimum.at(lo, gids, values)
    dropped = hi == lo
    if keep_singletons:
        dropped &= np.bincount(gids, minlength=n) > 1
    return ~dropped[gids], int(dropped.sum())


def overlong_penalty(
    response_lengths: Tensor | np.ndarray, *, max_response_length: int, buffer_len: int, penalty_factor: float
) -> Tensor:
    """DAPO's soft overlong punishment per response, [B]: 0 up to L_max - buffer, then linear down to -factor at L_max.

    penalty = min(0, -(length - (L_max - buffer)) / buffer * factor). Added to the outcome reward.
    """
    if buffer_len <= 0 or buffer_len > max_response_length:
        raise ValueError(
            f"algorithm.overlong_buffer.len must be in [1, max_response_length={max_response_length}], got {buffer_len}"
        )
    if penalty_factor < 0:
        raise ValueError(f"algorithm.overlong_buffer.penalty_factor must be >= 0, got {penalty_factor}")
    lengths = torch.as_tensor(response_lengths).to(torch.float32)
    exceed = lengths - (max_response_length - buffer_len)
    return (-exceed / buffer_len * penalty_factor).clamp(max=0.0)
