"""Batch-level reward shaping and sample selection the trainer applies between scoring and advantages:
DAPO's soft overlong penalty and dynamic sampling (keep only prompt groups whose rewards differ)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from verl.algos import filter_groups, overlong_penalty
from verl.config.schema import OverlongBufferConfig
from verl.protocol import DataProto


def groups_per_share(dp: int, n: int) -> int:
    """The fewest prompt groups of n samples whose rows split evenly over dp data-parallel ranks: a batch that
    keeps some groups keeps a multiple of this many."""
    return dp // math.gcd(dp, n)


def score_batch(
    batch: DataProto, reward: Any, overlong: OverlongBufferConfig, max_response_length: int
) -> Dict[str, float]:
    """The reward's token-level scores into the batch (token_level_scores), with DAPO's overlong penalty when
    algorithm.overlong_buffer enables it; returns the reward's metrics."""
    scores, metrics = reward(batch)
    batch.batch["token_level_scores"] = scores
    if overlong.enable:
        metrics["reward/overlong_penalty_mean"] = add_overlong_penalty(batch, overlong, max_response_length)
    return metrics


def add_overlong_penalty(batch: DataProto, cfg: OverlongBufferConfig, max_response_length: int) -> float:
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


def best_and_worst(batch: DataProto, n: int, multiple: int = 1) -> Tuple[DataProto, dict]:
    """Online DPO's pairs: in each group of n adjacent samples, the best-scored (chosen) then the worst-scored
    (rejected) sample, first ones on ties; groups whose samples all score the same are dropped, and the last pairs
    too until their number is a multiple of `multiple` (the data-parallel ranks take whole pairs each).
    The pairs carry `is_chosen` (1, 0, ...); metrics: dpo/pairs, dpo/tied_groups, dpo/score_gap."""
    if len(batch) % n:
        raise ValueError(f"a batch of {len(batch)} samples does not hold whole groups of rollout.n={n}")
    scores = batch.batch["token_level_scores"].sum(-1).view(-1, n)
    best, worst = scores.argmax(-1), scores.argmin(-1)
    informative = torch.nonzero(scores.max(-1).values > scores.min(-1).values).squeeze(-1)
    kept = informative[: len(informative) - len(informative) % multiple]
    rows = torch.stack([kept * n + best[kept], kept * n + worst[kept]], -1).reshape(-1)
    pairs = batch[rows.tolist()]
    pairs.batch["is_chosen"] = torch.tensor([1, 0] * len(kept), dtype=torch.long)
    gap = (scores.max(-1).values - scores.min(-1).values)[kept]
    metrics = {
        "dpo/pairs": float(len(kept)),
        "dpo/tied_groups": float(len(scores) - len(informative)),
        "dpo/score_gap": float(gap.mean()) if len(kept) else 0.0,
    }
    return pairs, metrics


def scored_groups(batch: DataProto, missing: Any, n: int, multiple: int = 1) -> Tuple[DataProto, int]:
    """The prompt groups (n adjacent samples) whose every sample got its score (reward.server.on_timeout=skip), as
    many as whole data-parallel shares allow (`multiple` rows); and how many groups were dropped."""
    whole = np.asarray(~np.asarray(missing, dtype=bool).reshape(-1, n).any(-1))
    keep = np.nonzero(whole)[0]
    per = groups_per_share(multiple, n)
    keep = keep[: len(keep) - len(keep) % per]
    if len(keep) == 0:
        raise RuntimeError(
            "no prompt group of this batch was fully scored by the reward server within reward.server.timeout_s "
            "(on_timeout=skip): are its clients running? Raise timeout_s, or use on_timeout=default"
        )
    rows = (keep[:, None] * n + np.arange(n)).reshape(-1)
    return batch[rows], int(len(whole) - len(keep))
