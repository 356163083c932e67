"""Balanced data-parallel ranks: a step's prompt groups placed so that every rank computes about as many tokens.

A worker group splits a batch into `dp` contiguous chunks of equal rows, one per data-parallel rank, and a step
waits for its slowest rank. With long-tail response lengths the chunks of a batch in generation order carry very
different token counts. `balance_batch` reorders the batch (every column together, so nothing needs to be put
back) so that each chunk holds whole prompt groups (the samples of one prompt stay together: their prompt is
computed once, verl.utils.shared_prefix) and the chunks' costs are as even as the greedy rule makes them. A
group's cost is its tokens (its prompt once when packed), plus, with an `attention_weight`, the query-key pairs of
its sequences (one packed sequence per group, else one per row) at that weight against a token's dense cost.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from verl.algos.utils import group_ids
from verl.protocol import DataProto


def balanced_sets(costs: Sequence[float], sets: int) -> List[List[int]]:
    """Items split into `sets` sets of len(costs) / sets items each, their cost sums close: the costliest item first,
    each to the lightest set that still has room (LPT under a size bound). Each set lists its items in order."""
    if sets < 1 or len(costs) % sets:
        raise ValueError(f"{len(costs)} items do not split into {sets} sets of equal size")
    room = len(costs) // sets
    loads = [0.0] * sets
    members: List[List[int]] = [[] for _ in range(sets)]
    for item in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        target = min((s for s in range(sets) if len(members[s]) < room), key=lambda s: (loads[s], s))
        members[target].append(item)
        loads[target] += costs[item]
    return [sorted(m) for m in members]


def imbalance(chunk_tokens: Sequence[float]) -> float:
    """The slowest rank's tokens over the mean rank's: 1.0 is perfectly even."""
    mean = sum(chunk_tokens) / len(chunk_tokens)
    return max(chunk_tokens) / mean if mean > 0 else 1.0


def _chunk_tokens(tokens: torch.Tensor, dp: int) -> List[float]:
    return [float(c.sum()) for c in tokens.chunk(dp)]


def group_cost(prompt: float, responses: Sequence[float], *, shared_prefix: bool, attention_weight: float) -> float:
    """What one prompt group costs a rank: its tokens, plus attention_weight x the query-key pairs of its causal
    sequences (the packed one, prompt then every response; or each row's own)."""
    if shared_prefix:
        length = prompt + sum(responses)
        return length + attention_weight * length * (length + 1) / 2
    return sum(prompt + r + attention_weight * (prompt + r) * (prompt + r + 1) / 2 for r in responses)


def balance_batch(
    batch: DataProto, dp: int, *, shared_prefix: bool = False, attention_weight: float = 0.0
) -> Tuple[DataProto, Dict[str, float]]:
    """`batch` reordered so that its `dp` contiguous chunks hold whole groups (by the `uid` column) of balanced
    cost (`group_cost`: tokens, a group's prompt once with `shared_prefix`, and its attention at
    `attention_weight`). Metrics: perf/rank_imbalance (max over mean of the chunks' tokens) after, and
    perf/rank_imbalance_before in the order the batch came. Batches whose groups differ in size, or do not split
    into `dp` equal parts, are left as they are."""
    b = batch.batch
    prompt_len = b["input_ids"].shape[1] - b["responses"].shape[1]
    prompt_tokens = b["attention_mask"][:, :prompt_len].sum(-1).float()
    response_tokens = b["response_mask"].sum(-1).float()
    before = imbalance(_chunk_tokens(prompt_tokens + response_tokens, dp))  # (a prompt counted per sample)
    gid, count = group_ids(batch.non_tensor_batch["uid"], len(batch), name="uid")
    rows: List[List[int]] = [[] for _ in range(count)]
    for row, g in enumerate(gid.tolist()):
        rows[g].append(row)
    if count % dp or len({len(r) for r in rows}) != 1:
        return batch, {"perf/rank_imbalance_before": before, "perf/rank_imbalance": before}
    costs = [
        group_cost(
            float(prompt_tokens[r[0]]),
            response_tokens[r].tolist(),
            shared_prefix=shared_prefix,
            attention_weight=attention_weight,
        )
        for r in rows
    ]
    order = [row for s in balanced_sets(costs, dp) for g in s for row in rows[g]]
    after = imbalance(_chunk_tokens((prompt_tokens + response_tokens)[order], dp))
    return batch.reorder(order), {"perf/rank_imbalance_before": before, "perf/rank_imbalance": after}
