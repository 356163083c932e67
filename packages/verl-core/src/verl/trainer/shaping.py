"""Batch-level reward shaping and sample selection the trainer applies between scoring and advantages:
DAPO's soft overlong penalty and dynamic sampling (keep only prompt groups whose rewards differ)."""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import torch

from verl.algos import filter_groups, overlong_penalty
from verl.protocol import DataProto


def add_overlong_penalty(batch: DataProto, cfg: Any, max_response_length: int) -> float:
    """Add the penalty of algorithm.overlong_buffer to each response's last-token score; returns its mean."""
    b = batch.batch
    lengths = b["response_mask"].sum(-1)
    penalty = overlong_penalty(
        lengths, max_response_length=max_response_length, buffer_len=cfg.len, penalty_factor=cfg.penalty_factor
    )
    rows = torch.nonzero(lengths > 0).squeeze(-1)  # an empty response has no token to carry a reward
    scores = b["token_level_scores"].clone()
    scores[rows, lengths[rows] - 1] += penalty[rows].to(scores.dtype)
    b["token_level_scores"] = scores
    return float(penalty.mean())


def informative_groups(batch: DataProto, metric: str) -> Tuple[DataProto, int]:
    """The rows of groups (same uid) whose `metric` is not the same for every sample; and how many were dropped."""
    if metric != "seq_reward":
        raise ValueError(
            f"algorithm.filter_groups.metric='{metric}' is not available: use seq_reward (the summed token scores)"
        )
    keep, dropped = filter_groups(batch.batch["token_level_scores"].sum(-1), batch.non_tensor_batch["uid"])
    return batch[np.nonzero(keep)[0]], dropped


def first_groups(parts: List[DataProto], n: int, groups: int) -> DataProto:
    """The first `groups` groups of n adjacent samples from `parts`, concatenated."""
    return DataProto.concat(parts)[: groups * n]
