"""Logging helpers: policy and batch statistics over response tokens only, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from verl.algos import compute_policy_metrics, data_metrics, ratio_stats, rollout_mismatch_metrics
from verl.config.schema import ActorConfig

LN = math.log


def policy_batch():
    old = torch.zeros(1, 4)
    log_prob = torch.tensor([[LN(1.5), LN(0.5), 0.0, 30.0]])  # the last token is padding
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    return old, log_prob, mask


def test_policy_metrics_by_hand():
    old, log_prob, mask = policy_batch()
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    m = compute_policy_metrics(old, log_prob, mask, advantages=adv, config=ActorConfig(clip_ratio=0.2))
    assert m["actor/approx_kl"] == pytest.approx(-(LN(1.5) + LN(0.5)) / 3)
    # r - 1 - log r: (0.5 - ln 1.5) + (-0.5 - ln 0.5) + 0
    assert m["actor/approx_kl_k3"] == pytest.approx(((0.5 - LN(1.5)) + (-0.5 - LN(0.5))) / 3)
    # clip binds for PPO only at t0 (r = 1.5 > 1.2 with A > 0); t1 has r = 0.5 but A > 0
    assert m["actor/clipfrac"] == pytest.approx(1 / 3)
    assert (m["actor/ratio/mean"], m["actor/ratio/max"], m["actor/ratio/min"]) == pytest.approx((1.0, 1.5, 0.5))
    # without advantages: every ratio outside [0.8, 1.2]
    assert compute_policy_metrics(old, log_prob, mask)["actor/clipfrac"] == pytest.approx(2 / 3)


def test_ratio_stats_ignore_padding():
    old, log_prob, mask = policy_batch()
    assert ratio_stats(old, log_prob, mask) == pytest.approx(
        {"actor/ratio/mean": 1.0, "actor/ratio/max": 1.5, "actor/ratio/min": 0.5}
    )


def test_data_metrics_by_hand():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    rewards = scores - 0.5 * mask
    adv = torch.tensor([[1.0, 2.0, 99.0], [-1.0, 0.0, 4.0]])
    returns = torch.tensor([[1.0, 2.0, 99.0], [3.0, 2.0, 1.0]])
    values = torch.tensor([[1.0, 1.5, -99.0], [2.5, 2.0, 1.5]])
    m = data_metrics(
        response_mask=mask,
        token_level_scores=scores,
        token_level_rewards=rewards,
        advantages=adv,
        returns=returns,
        values=values,
        max_response_length=3,
    )
    assert (m["critic/score/mean"], m["critic/score/max"], m["critic/score/min"]) == pytest.approx((2.0, 3.0, 1.0))
    # rewards per sequence: 1 - 0.5*2 = 0, 3 - 0.5*3 = 1.5
    assert (m["critic/rewards/mean"], m["critic/rewards/max"], m["critic/rewards/min"]) == pytest.approx(
        (0.75, 1.5, 0.0)
    )
    # advantages over the 5 response tokens 1, 2, -1, 0, 4 (the 99 is padding)
    assert (m["critic/advantages/mean"], m["critic/advantages/max"], m["critic/advantages/min"]) == pytest.approx(
        (1.2, 4, -1)
    )
    assert (m["critic/returns/mean"], m["critic/values/mean"]) == pytest.approx((9 / 5, 8.5 / 5))
    # returns - values = 0, 0.5, 0.5, 0, -0.5: mean 0.1, unbiased var (0.01 + 0.16*2 + 0.01 + 0.36) / 4 = 0.175
    # returns 1, 2, 3, 2, 1: mean 1.8, unbiased var (0.64 + 0.04 + 1.44 + 0.04 + 0.64) / 4 = 0.7
    assert m["critic/vf_explained_var"] == pytest.approx(1 - 0.175 / (0.7 + 1e-5), rel=1e-5)
    assert (m["response_length/mean"], m["response_length/max"], m["response_length/min"]) == pytest.approx((2.5, 3, 2))
    assert m["response_length/clip_ratio"] == pytest.approx(0.5)


def test_data_metrics_of_an_empty_selection_are_zero_not_nan():
    mask = torch.zeros(2, 3, dtype=torch.bool)
    m = data_metrics(
        response_mask=mask,
        advantages=torch.full((2, 3), float("nan")),
        returns=torch.zeros(2, 3),
        values=torch.zeros(2, 3),
    )
    assert all(math.isfinite(v) for v in m.values()), m
    assert m["critic/advantages/max"] == 0.0


def test_rollout_mismatch_metrics_by_hand():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 7.0]])
    rollout = torch.tensor([[-1.5, -2.0, -2.0], [-0.25, -0.5, float("nan")]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the NaN sits in padding and must not leak
    m = {k: float(v) for k, v in rollout_mismatch_metrics(old, rollout, mask).items()}
    # |diffs| on masked tokens: 0.5, 0, 1, 0.25, 0 -> mean 1.75 / 5
    assert m["rollout/logprob_diff_max"] == pytest.approx(1.0)
    assert m["rollout/logprob_diff_mean"] == pytest.approx(0.35)
    # old - rollout: 0.5, 0, -1, -0.25, 0 -> largest ratio exp(0.5)
    assert m["rollout/prob_ratio_max"] == pytest.approx(math.exp(0.5))
