"""DAPO dynamic-sampling filter and overlong penalty, by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.algos import filter_groups, overlong_penalty


def test_filter_groups_by_hand():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0])
    index = np.array(["a", "a", "b", "b", "c", "c", "d"], dtype=object)
    # a: all 1 -> drop; b: 0 and 1 -> keep; c: all 0.5 -> drop; d: alone -> drop (zero advantage here)
    keep, dropped = filter_groups(scores, index)
    assert keep.dtype == np.bool_ and keep.tolist() == [False, False, True, True, False, False, False]
    assert dropped == 3
    keep, dropped = filter_groups(scores.numpy(), index, keep_singletons=True)  # upstream DAPO's choice
    assert keep.tolist() == [False, False, True, True, False, False, True] and dropped == 2


def test_filter_groups_finds_groups_by_uid():
    keep, dropped = filter_groups([3.0, 1.0, 3.0, 2.0], ["x", "y", "x", "y"])
    assert keep.tolist() == [False, True, False, True] and dropped == 1


def test_filter_groups_bad_input():
    with pytest.raises(ValueError, match="one score per sample"):
        filter_groups(torch.zeros(2, 3), ["a", "b"])
    with pytest.raises(ValueError, match="index has 1 labels"):
        filter_groups(torch.zeros(2), ["a"])


def test_overlong_penalty_by_hand():
    # L_max = 20, buffer 4: free up to 16, then -(L - 16)/4 * factor
    lengths = torch.tensor([10, 16, 17, 18, 20])
    out = overlong_penalty(lengths, max_response_length=20, buffer_len=4, penalty_factor=1.0)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    out = overlong_penalty(np.array([17, 20]), max_response_length=20, buffer_len=4, penalty_factor=2.0)
    torch.testing.assert_close(out, torch.tensor([-0.5, -2.0]))


@pytest.mark.parametrize("buffer_len", [0, 21])
def test_overlong_buffer_must_fit(buffer_len):
    with pytest.raises(ValueError, match="overlong_buffer.len"):
        overlong_penalty(torch.tensor([1]), max_response_length=20, buffer_len=buffer_len, penalty_factor=1.0)
