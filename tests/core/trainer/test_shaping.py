"""DAPO shaping in the trainer: the overlong penalty on the last token, and keeping informative groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.shaping import add_overlong_penalty, first_groups, informative_groups


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
