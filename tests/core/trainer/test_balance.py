"""Balanced data-parallel ranks: whole prompt groups placed on ranks so that their token counts match."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.protocol import DataProto
from verl.trainer.balance import balance_batch, balanced_sets, group_cost, imbalance


def test_balanced_sets_by_hand():
    # costliest first, each to the lightest set with room: 5->A, 4->B, 3->B (7), 3->A (8), 2->B (9, full), 1->A (9)
    assert balanced_sets([5, 4, 3, 3, 2, 1], 2) == [[0, 3, 5], [1, 2, 4]]
    assert balanced_sets([1, 2, 3], 1) == [[0, 1, 2]]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.integers(1, 4).flatmap(
        lambda s: st.tuples(st.just(s), st.lists(st.integers(0, 1000), min_size=s, max_size=8 * s))
    )
)
def test_balanced_sets_partition_into_equal_sizes_within_the_greedy_bound(case):
    sets, costs = case
    costs = costs[: len(costs) - len(costs) % sets]
    parts = balanced_sets(costs, sets)
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))
    assert {len(p) for p in parts} <= {len(costs) // sets}
    loads = [sum(costs[i] for i in p) for p in parts]
    # no set exceeds the mean by more than the costliest item (the size bound allows one more item's worth)
    assert max(loads) <= sum(costs) / sets + max(costs, default=0) + 1e-9


def _batch(response_lengths, n=2, p=3, r=8):
    """Groups of n rows (uid per group) with full prompts and the given response lengths."""
    rows = len(response_lengths)
    mask = torch.zeros(rows, p + r, dtype=torch.long)
    mask[:, :p] = 1
    for i, length in enumerate(response_lengths):
        mask[i, p : p + length] = 1
    ids = torch.arange(rows * (p + r)).reshape(rows, p + r) % 50 + 3
    uid = np.array([f"g{i // n}" for i in range(rows)], dtype=object)
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "responses": ids[:, p:],
            "response_mask": mask[:, p:],
            "row": torch.arange(rows),
        },
        {"uid": uid},
    )


def test_balance_batch_moves_whole_groups_and_evens_the_ranks():
    # generation order puts the long groups on rank 0: 42 tokens against rank 1's 16 (prompts of 3 tokens)
    batch = _batch([8, 8, 7, 7, 1, 1, 1, 1])
    balanced, metrics = balance_batch(batch, 2)
    rows = balanced.batch["row"].tolist()
    assert sorted(rows) == list(range(8))
    assert rows == [0, 1, 6, 7, 2, 3, 4, 5]  # groups g0 + g3 on rank 0, g1 + g2 on rank 1
    for a, b in zip(rows[0::2], rows[1::2]):  # every group's rows still adjacent, in one rank's chunk
        assert balanced.non_tensor_batch["uid"][rows.index(a)] == balanced.non_tensor_batch["uid"][rows.index(b)]
    tokens = balanced.batch["attention_mask"].sum(-1)
    assert [int(c.sum()) for c in tokens.chunk(2)] == [2 * 11 + 2 * 4, 2 * 10 + 2 * 4]
    assert metrics["perf/rank_imbalance_before"] == imbalance([42, 16]) == 42 / 29
    assert metrics["perf/rank_imbalance"] == imbalance([30, 28]) == 30 / 29
    assert balanced.batch["input_ids"].tolist() == batch.batch["input_ids"][rows].tolist()  # columns move together


def test_with_shared_prefix_a_groups_prompt_counts_once():
    # 4 groups of 2: prompts of 3 tokens; with the prompt once, g0 (1+1) costs 5 and g1 (2+2) costs 7
    batch = _batch([1, 1, 2, 2, 3, 3, 4, 4])
    shared, _ = balance_batch(batch, 2, shared_prefix=True)
    assert shared.batch["row"].tolist() == [0, 1, 6, 7, 2, 3, 4, 5]  # costs 5+11 vs 7+9


def test_uneven_groups_stay_as_they_are():
    batch = _batch([8, 8, 7, 1, 1, 1], n=3)  # 2 groups of 3 rows: 6 rows on 4 ranks do not split
    same, metrics = balance_batch(batch, 4)
    assert same is batch and metrics["perf/rank_imbalance"] == metrics["perf/rank_imbalance_before"]


def test_group_cost_by_hand():
    # a prompt of 3 with responses 1 and 2: packed, one sequence of 6 (21 causal pairs); else rows of 4 and 5
    assert group_cost(3, [1, 2], shared_prefix=True, attention_weight=0.0) == 6
    assert group_cost(3, [1, 2], shared_prefix=True, attention_weight=0.5) == 6 + 0.5 * 21
    assert group_cost(3, [1, 2], shared_prefix=False, attention_weight=0.5) == 9 + 0.5 * (10 + 15)


def test_attention_cost_keeps_the_longest_sequence_with_the_shortest():
    # 6 groups of 2 rows, prompts of 3, packed lengths 12, 12, 12, 6, 6, 18. By tokens (33 a rank) the longest
    # group shares a rank with a 12 and a 6 (36 vs 30); counting attention (L + L(L+1)/2 at weight 1: 90, 27, 189)
    # it goes with the two 6s and the three 12s share the other rank (243 vs 270).
    batch = _batch([5, 4, 5, 4, 5, 4, 2, 1, 2, 1, 8, 7])
    by_tokens, _ = balance_batch(batch, 2, shared_prefix=True)
    by_attention, metrics = balance_batch(batch, 2, shared_prefix=True, attention_weight=1.0)
    assert by_tokens.batch["row"].tolist() == [4, 5, 8, 9, 10, 11, 0, 1, 2, 3, 6, 7]
    assert by_attention.batch["row"].tolist() == [6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5]
    assert metrics["perf/rank_imbalance"] == imbalance([9 + 9 + 21, 15 * 3])  # (tokens, each row's prompt counted)
