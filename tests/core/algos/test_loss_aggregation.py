"""Loss aggregation modes against hand-computed values, with padding, empty rows and bad input."""

from __future__ import annotations

import pytest
import torch

from verl.algos import AGG_MODES, agg_loss, masked_mean, masked_sum, masked_var, masked_whiten

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "mode, norm_length, expected",
    [
        ("token-mean", None, (1 + 2 + 4) / 3),
        ("seq-mean-token-mean", None, ((1 + 2) / 2 + 4 / 1) / 2),
        ("seq-mean-token-sum", None, ((1 + 2) + 4) / 2),
        ("seq-mean-token-sum-norm", None, ((1 + 2) / 3 + 4 / 3) / 2),  # H = T = 3
        ("seq-mean-token-sum-norm", 7, ((1 + 2) / 7 + 4 / 7) / 2),
    ],
)
def test_modes_by_hand(mode, norm_length, expected):
    torch.testing.assert_close(
        agg_loss(LOSS, MASK, mode, norm_length=norm_length), torch.tensor(expected, dtype=torch.float64)
    )


def test_the_four_modes_are_registered():
    assert set(AGG_MODES.names()) >= {
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    }


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_an_all_masked_row_holding_inf_and_nan(mode):
    loss = torch.tensor([[1.0, 2.0], [float("inf"), float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 1], [0, 0]], dtype=torch.bool)
    out = agg_loss(loss, mask, mode)
    # the empty row counts as a zero-loss sequence in the seq-mean modes (every row weighs 1/B)
    expected = {
        "token-mean": 1.5,
        "seq-mean-token-mean": 1.5 / 2,
        "seq-mean-token-sum": 3 / 2,
        "seq-mean-token-sum-norm": 3 / 2 / 2,
    }
    assert out.item() == pytest.approx(expected[mode])
    out.backward()
    assert torch.equal(loss.grad[1], torch.zeros(2))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_nothing_to_aggregate_gives_zero(mode):
    assert float(agg_loss(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool), mode)) == 0.0
    assert float(agg_loss(torch.ones(0, 3), torch.zeros(0, 3, dtype=torch.bool), mode)) == 0.0


def test_bf16_is_aggregated_in_float32():
    # 300 tokens of 1.0: a bf16 count would still be exact, but a bf16 sum of 300 values of 1.01 is not.
    loss = torch.full((1, 300), 1.01).bfloat16()
    out = agg_loss(loss, torch.ones(1, 300, dtype=torch.bool), "seq-mean-token-sum")
    assert out.dtype == torch.float32
    assert float(out) == pytest.approx(300 * float(loss[0, 0]), rel=1e-6)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="same shape"):
        agg_loss(LOSS, MASK[:, :2], "token-mean")
    with pytest.raises(KeyError, match="did you mean 'seq-mean-token-sum'"):
        agg_loss(LOSS, MASK, "seq-mean-token-summ")
    with pytest.raises(ValueError, match="norm_length"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=0)


def test_masked_helpers_by_hand():
    values = torch.tensor([1.0, 2.0, 4.0, float("nan")], dtype=torch.float64)
    mask = torch.tensor([1, 1, 1, 0], dtype=torch.bool)
    assert float(masked_sum(values, mask)) == 7.0
    assert float(masked_mean(values, mask)) == pytest.approx(7 / 3)
    # deviations from 7/3: -4/3, -1/3, 5/3 -> squares 16/9 + 1/9 + 25/9 = 42/9; unbiased / 2 = 7/3
    assert float(masked_var(values, mask)) == pytest.approx(7 / 3)
    assert float(masked_var(values, mask, unbiased=False)) == pytest.approx(14 / 9)
    white = masked_whiten(values, mask)
    torch.testing.assert_close(white[:3], (values[:3] - 7 / 3) / (7 / 3 + 1e-8) ** 0.5)
    torch.testing.assert_close(masked_whiten(values, mask, shift_mean=False)[:3], white[:3] + 7 / 3)
    # one element: no spread to measure -> variance 0, whitened value 0 (verl raises here)
    one = torch.tensor([1, 0, 0, 0], dtype=torch.bool)
    assert float(masked_var(values, one)) == 0.0 and float(masked_whiten(values, one)[0]) == 0.0
    none = torch.zeros(4, dtype=torch.bool)
    assert float(masked_mean(values, none)) == 0.0 and float(masked_var(values, none)) == 0.0
