"""DAPO shaping in the trainer: the overlong penalty on the last token, and keeping informative groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.shaping import add_overlong_penalty, first_groups, groups_per_share, informative_groups


def _batch(lengths, scores, uids) -> DataProto:
    width = 8
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    token_scores = torch.zeros(len(lengths), width)
    for row, (n, s) in enumerate(zip(lengths, scores)):
        if n:
            token_scores[row, n - 1] = s
    return DataProto.from_dict({"response_mask": mask, "token_level_scores": token_scores}, {"uid": uids})


def test_overlong_penalty_lands_on_the_last_token():
    # max 8, buffer 4: penalty = min(0, -(len - 4) / 4 * 1.0): len 8 -> -1, 6 -> -0.5, 4 -> 0; an empty row gets none.
    batch = _batch([8, 6, 4, 0], [1.0, 1.0, 1.0, 0.0], ["a", "a", "b", "b"])
    cfg = OmegaConf.create({"len": 4, "penalty_factor": 1.0})
    mean = add_overlong_penalty(batch, cfg, max_response_length=8)
    scores = batch.batch["token_level_scores"]
    assert scores[0, 7].item() == 0.0 and scores[1, 5].item() == 0.5 and scores[2, 3].item() == 1.0
    assert scores.sum(-1).tolist() == [0.0, 0.5, 1.0, 0.0]
    # The mean counts the empty row's own penalty: -(0 - 4) / 4 clamps to 0.
    assert mean == pytest.approx((-1.0 - 0.5 + 0.0 + 0.0) / 4)


def test_informative_groups_drop_all_equal_groups_and_keep_order():
    # group a: 1, 0 (kept); group b: 1, 1 (dropped); group c: 0, 1 (kept)
    batch = _batch([2, 2, 2, 2, 2, 2], [1, 0, 1, 1, 0, 1], ["a", "a", "b", "b", "c", "c"])
    kept, dropped = informative_groups(batch, "seq_reward")
    assert dropped == 1
    assert list(kept.non_tensor_batch["uid"]) == ["a", "a", "c", "c"]
    assert list(first_groups([kept, kept], n=2, groups=3).non_tensor_batch["uid"]) == ["a", "a", "c", "c", "a", "a"]


def test_unknown_filter_metric_names_the_key():
    batch = _batch([2, 2], [1, 0], np.array(["a", "a"], dtype=object))
    with pytest.raises(ValueError, match="algorithm.filter_groups.metric"):
        informative_groups(batch, "acc")


def test_online_dpo_pairs_the_best_and_the_worst_of_each_group():
    from verl.trainer.shaping import best_and_worst

    # groups of 3: [1, 0, 2] -> best row 2, worst row 1; [1, 1, 1] tied -> dropped; [0, 3, 3] -> best 4 (first of
    # the ties), worst 3; [5, 0, 0] -> 9 then 10.
    scores = [1.0, 0.0, 2.0, 1.0, 1.0, 1.0, 0.0, 3.0, 3.0, 5.0, 0.0, 0.0]
    batch = _batch([2] * 12, scores, [str(i // 3) for i in range(12)])
    batch.batch["row"] = torch.arange(12)
    pairs, metrics = best_and_worst(batch, 3)
    assert pairs.batch["row"].tolist() == [2, 1, 7, 6, 9, 10]
    assert pairs.batch["is_chosen"].tolist() == [1, 0, 1, 0, 1, 0]
    assert metrics == {"dpo/pairs": 3.0, "dpo/tied_groups": 1.0, "dpo/score_gap": pytest.approx((2 + 3 + 5) / 3)}
    pairs, metrics = best_and_worst(batch, 3, multiple=2)  # two data-parallel ranks: whole pairs each
    assert pairs.batch["row"].tolist() == [2, 1, 7, 6] and metrics["dpo/pairs"] == 2.0
    with pytest.raises(ValueError, match="does not hold whole groups of rollout.n=5"):
        best_and_worst(batch, 5)


def test_reward_server_skip_keeps_whole_scored_groups():
    from verl.trainer.shaping import scored_groups

    batch = _batch([2] * 8, [0.0] * 8, [str(i // 2) for i in range(8)])
    batch.batch["row"] = torch.arange(8)
    missing = np.array([0, 0, 0, 1, 0, 0, 0, 0], dtype=bool)  # group 1 lacks a score
    kept, dropped = scored_groups(batch, missing, n=2)
    assert kept.batch["row"].tolist() == [0, 1, 4, 5, 6, 7] and dropped == 1
    kept, dropped = scored_groups(batch, missing, n=2, multiple=4)  # DP 4: two groups a share
    assert kept.batch["row"].tolist() == [0, 1, 4, 5] and dropped == 2
    with pytest.raises(RuntimeError, match="no prompt group of this batch was fully scored"):
        scored_groups(batch, np.ones(8, dtype=bool), n=2)


def test_groups_per_share_is_the_fewest_groups_that_split_over_the_ranks():
    # (dp, n) -> groups: 4 ranks, 2 samples a group: 2 groups (4 rows); 4 ranks, 8 samples: 1; 6 ranks, 4: 3 (12 rows)
    assert [groups_per_share(dp, n) for dp, n in ((1, 5), (4, 2), (4, 8), (6, 4), (3, 3))] == [1, 2, 1, 3, 1]
