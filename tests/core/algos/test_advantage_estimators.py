"""Advantage estimators against values worked out by hand, with padding, groups by uid, and edge cases."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from verl.algos import ADV_ESTIMATORS, compute_advantages, estimator_needs_values, estimator_requires
from verl.config.schema import AlgorithmConfig

EPS = 1e-6  # GRPO's std guard


def outcome_rewards(scores, lengths, width):
    """Token rewards with each score on the last response token, and the response mask."""
    rewards = torch.zeros(len(scores), width, dtype=torch.float64)
    mask = torch.zeros(len(scores), width, dtype=torch.bool)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = True
        if n:
            rewards[i, n - 1] = s
    return rewards, mask


def spread(per_seq, mask):
    """Expected [B, T]: each sequence's value on its response tokens, 0 on padding."""
    return torch.tensor(per_seq, dtype=torch.float64).unsqueeze(-1) * mask


# Groups interleaved in the batch: a at rows 0, 2; b at 1, 3, 4; c alone at 5.
INDEX = np.array(["a", "b", "a", "b", "b", "c"], dtype=object)
SCORES = [1.0, 1.0, 0.0, 2.0, 6.0, 5.0]
LENGTHS = [3, 4, 2, 1, 4, 2]


def run(name, rewards, mask, **kw):
    config = kw.pop("config", AlgorithmConfig())
    return compute_advantages(name, rewards, mask, config=config, **kw)


def test_grpo_by_hand():
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 4)
    adv, ret = run("grpo", rewards, mask, index=INDEX)
    # a: scores 1, 0 -> mean 0.5; unbiased std = sqrt((0.5^2 + 0.5^2) / 1) = sqrt(0.5)
    sa = math.sqrt(0.5) + EPS
    # b: scores 1, 2, 6 -> mean 3; deviations -2, -1, 3; var = (4 + 1 + 9) / 2 = 7
    sb = math.sqrt(7.0) + EPS
    # c: a group of one -> 0
    expected = spread([0.5 / sa, -2 / sb, -0.5 / sa, -1 / sb, 3 / sb, 0.0], mask)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_drgrpo_is_grpo_without_std_both_ways():
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 4)
    # a: 1 - 0.5, 0 - 0.5; b: 1 - 3, 2 - 3, 6 - 3; c: 0
    expected = spread([0.5, -2.0, -0.5, -1.0, 3.0, 0.0], mask)
    adv, _ = run("grpo", rewards, mask, index=INDEX, config=AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    torch.testing.assert_close(adv, expected)
    adv, _ = run("drgrpo", rewards, mask, index=INDEX, config=AlgorithmConfig(norm_adv_by_std_in_grpo=True))
    torch.testing.assert_close(adv, expected)  # the alias forces the std off


def test_rloo_by_hand():
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 4)
    # r_i - mean of the others: a: 1 - 0 = 1, 0 - 1 = -1; b: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5
    # (= n/(n-1) (r_i - mean): b: 3/2 * (-2, -1, 3)); c alone: 0
    expected = spread([1.0, -3.0, -1.0, -1.5, 4.5, 0.0], mask)
    adv, ret = run("rloo", rewards, mask, index=INDEX)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_opo_by_hand():
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 4)
    # a: lengths 3, 2, scores 1, 0 -> b = (3*1 + 2*0) / 5 = 0.6
    # b: lengths 4, 1, 4, scores 1, 2, 6 -> b = (4 + 2 + 24) / 9 = 30/9
    expected = spread([1 - 0.6, 1 - 30 / 9, 0 - 0.6, 2 - 30 / 9, 6 - 30 / 9, 0.0], mask)
    adv, _ = run("opo", rewards, mask, index=INDEX)
    torch.testing.assert_close(adv, expected)


def test_reinforce_plus_plus_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    # gamma = 0.5. Row 0: G2 = 1, G1 = 0 + 0.5*1 = 0.5, G0 = 0.25.
    # Row 1: t2 is padding (returns restart there), G1 = 2, G0 = 0 + 0.5*2 = 1.
    returns = [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]
    adv, ret = run("reinforce_plus_plus", rewards, mask, config=AlgorithmConfig(gamma=0.5))
    torch.testing.assert_close(ret, torch.tensor(returns, dtype=torch.float64))
    # Whitened over the 5 response tokens {0.25, 0.5, 1, 1, 2}: mean 4.75/5 = 0.95;
    # squared deviations 0.49 + 0.2025 + 0.0025 + 0.0025 + 1.1025 = 1.8, unbiased var = 1.8/4 = 0.45.
    std = math.sqrt(0.45 + 1e-8)
    expected = [[-0.7 / std, -0.45 / std, 0.05 / std], [0.05 / std, 1.05 / std, 0.0]]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64))


def test_reinforce_plus_plus_carries_the_return_across_a_masked_span():
    # A tool's output inside a multi-turn response is masked: the outcome reward must still reach the first turn.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 1]], dtype=torch.bool)
    _, ret = run("reinforce_plus_plus", rewards, mask)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]], dtype=torch.float64))
    # gamma = 0.5 discounts per response token, not per masked one: G4 = 1, G1 = 0.5, G0 = 0.25
    _, ret = run("reinforce_plus_plus", rewards, mask, config=AlgorithmConfig(gamma=0.5))
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 0.0, 0.0, 1.0]], dtype=torch.float64))
    # A reward inside the first turn adds to it: G0 = 1 + 0.5 * (0 + 0.5 * 4) = 2 (gamma 0.5)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0, 4.0]], dtype=torch.float64)
    _, ret = run("reinforce_plus_plus", rewards, mask, config=AlgorithmConfig(gamma=0.5))
    torch.testing.assert_close(ret, torch.tensor([[2.0, 2.0, 0.0, 0.0, 4.0]], dtype=torch.float64))


def test_remax_carries_the_return_across_a_masked_span():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 1]], dtype=torch.bool)
    adv, ret = run("remax", rewards, mask, reward_baselines=torch.tensor([0.25], dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.75, 0.0, 0.0, 0.75]], dtype=torch.float64))


def test_reinforce_plus_plus_baseline_by_hand():
    index = ["a", "a", "b", "b"]
    rewards, mask = outcome_rewards([1.0, 0.0, 3.0, 3.0], [2, 1, 2, 3], 3)
    # Group baselines: a: 1 - 0.5 = 0.5, 0 - 0.5 = -0.5; b: all equal -> 0.
    # Tokens in the mask: 0.5, 0.5 | -0.5 | 0, 0 | 0, 0, 0 -> mean = 0.5/8 = 0.0625
    # deviations 0.4375 (x2), -0.5625, -0.0625 (x5); squares 0.19140625*2 + 0.31640625 + 0.00390625*5 = 0.71875
    # unbiased var = 0.71875 / 7
    std = math.sqrt(0.71875 / 7 + 1e-8)
    expected = [[0.4375 / std, 0.4375 / std, 0], [-0.5625 / std, 0, 0], [-0.0625 / std] * 2 + [0], [-0.0625 / std] * 3]
    adv, ret = run("reinforce_plus_plus_baseline", rewards, mask, index=index)
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(ret, adv)


def test_remax_by_hand():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    baselines = torch.tensor([0.5, 3.0], dtype=torch.float64)  # the greedy responses' rewards
    # reward-to-go: row 0 [1, 1, 0 (pad)], row 1 [2, 2, 2]; minus the baseline on response tokens
    adv, ret = run("remax", rewards, mask, reward_baselines=baselines)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]], dtype=torch.float64))
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.0], [-1.0, -1.0, -1.0]], dtype=torch.float64))


def test_gae_by_hand():
    config = AlgorithmConfig(gamma=0.9, lam=0.8)  # gamma * lam = 0.72
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 5.0]], dtype=torch.float64)  # 5.0 sits on padding
    values = torch.tensor([[0.5, 0.4, 0.2], [0.3, 0.6, 9.9]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    # Row 0: d2 = 1 - 0.2 = 0.8                 A2 = 0.8
    #        d1 = 0 + 0.9*0.2 - 0.4 = -0.22     A1 = -0.22 + 0.72*0.8 = 0.356
    #        d0 = 0 + 0.9*0.4 - 0.5 = -0.14     A0 = -0.14 + 0.72*0.356 = 0.11632
    # Row 1: t2 is padding: skipped (its reward and value never enter)
    #        d1 = 1 + 0 - 0.6 = 0.4             A1 = 0.4
    #        d0 = 0 + 0.9*0.6 - 0.3 = 0.24      A0 = 0.24 + 0.72*0.4 = 0.528
    raw = [0.11632, 0.356, 0.8, 0.528, 0.4]
    returns = [[0.11632 + 0.5, 0.356 + 0.4, 0.8 + 0.2], [0.528 + 0.3, 0.4 + 0.6, 0.0]]
    adv, ret = run("gae", rewards, mask, values=values, config=config)
    torch.testing.assert_close(ret, torch.tensor(returns, dtype=torch.float64))
    mean, std = statistics.mean(raw), math.sqrt(statistics.variance(raw) + 1e-8)  # unbiased, as masked_whiten
    white = [(a - mean) / std for a in raw]
    expected = torch.tensor([white[:3], white[3:] + [0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected)


def test_gae_skips_a_masked_token_inside_the_response():
    config = AlgorithmConfig(gamma=0.9, lam=0.8)
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 7.0, 0.2]], dtype=torch.float64)  # 7.0: an observation token's value, unused
    mask = torch.tensor([[1, 0, 1]], dtype=torch.bool)
    # A2 = 1 - 0.2 = 0.8; t1 skipped; A0 = (0 + 0.9*0.2 - 0.5) + 0.72*0.8 = -0.32 + 0.576 = 0.256
    _, ret = run("gae", rewards, mask, values=values, config=config)
    torch.testing.assert_close(ret, torch.tensor([[0.256 + 0.5, 0.0, 0.8 + 0.2]], dtype=torch.float64))


# --------------------------------------------------------------------------- edge cases

GROUP = ["grpo", "drgrpo", "rloo", "opo", "reinforce_plus_plus_baseline"]


@pytest.mark.parametrize("name", GROUP)
def test_groups_of_one_give_zero(name):
    rewards, mask = outcome_rewards([3.0, -1.0, 0.5], [2, 3, 1], 3)
    adv, _ = run(name, rewards, mask, index=["x", "y", "z"])
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("name", GROUP)
def test_all_equal_rewards_give_exactly_zero(name):
    # In float32 the mean of three 2.9s is 2.9 - 2.4e-7 and of seven 0.1s is 0.1 + 7e-9: without an exact
    # equality check, GRPO would divide that rounding by (std ~ 3e-7) + 1e-6 and give advantages of ~0.2.
    rewards, mask = outcome_rewards([2.9] * 3 + [0.1] * 7, [3, 1, 2, 2, 3, 1, 1, 2, 3, 3], 3)
    adv, ret = run(name, rewards.float(), mask, index=["g"] * 3 + ["h"] * 7)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS.names()))
def test_all_masked_rows_are_zero_and_finite(name):
    rewards, mask = outcome_rewards([1.0, 0.0, 2.0, 1.0], [2, 0, 3, 0], 3)
    rewards[1, 2] = 1.0  # a reward placed on padding
    values = torch.full_like(rewards, float("nan"))
    values[mask] = 0.25  # padding values are garbage, even NaN
    kw = {"index": ["a", "a", "b", "b"], "values": values, "reward_baselines": torch.zeros(4, dtype=torch.float64)}
    adv, ret = run(name, rewards, mask, **kw)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.equal(adv[~mask], torch.zeros_like(adv[~mask]))
    assert torch.equal(ret[~mask], torch.zeros_like(ret[~mask]))


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS.names()))
def test_a_batch_without_any_response_token(name):
    rewards = torch.zeros(2, 3)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    kw = {"index": ["a", "a"], "values": torch.zeros(2, 3), "reward_baselines": torch.zeros(2)}
    adv, ret = run(name, rewards, mask, **kw)
    assert torch.equal(adv, torch.zeros(2, 3)) and torch.equal(ret, torch.zeros(2, 3))


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS.names()))
def test_empty_responses_width_zero(name):
    rewards, mask = torch.zeros(3, 0), torch.zeros(3, 0, dtype=torch.bool)
    kw = {"index": ["a", "a", "b"], "values": torch.zeros(3, 0), "reward_baselines": torch.zeros(3)}
    adv, ret = run(name, rewards, mask, **kw)
    assert adv.shape == (3, 0) and ret.shape == (3, 0)


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS.names()))
def test_bf16_inputs_match_float32(name):
    rewards, mask = outcome_rewards([1.0, 0.0, 0.5, 2.0, 1.5, 1.0], [3, 2, 4, 1, 4, 2], 4)
    values = torch.linspace(-1, 1, 24).reshape(6, 4)
    kw = {"index": ["a", "a", "a", "b", "b", "b"], "reward_baselines": torch.tensor([0.5, 0.5, 0.5, 1, 1, 1.0])}
    config = AlgorithmConfig(gamma=0.9, lam=0.95)
    adv32, ret32 = run(name, rewards.float(), mask, values=values, config=config, **kw)
    adv16, ret16 = run(
        name,
        rewards.bfloat16(),
        mask,
        values=values.bfloat16(),
        config=config,
        **{**kw, "reward_baselines": kw["reward_baselines"].bfloat16()},
    )
    assert adv16.dtype == torch.float32  # computed in float32: bf16 would keep ~3 significant digits
    assert torch.isfinite(adv16).all()
    torch.testing.assert_close(adv16, adv32, atol=2e-2, rtol=2e-2)  # only the inputs' bf16 rounding differs
    torch.testing.assert_close(ret16, ret32, atol=2e-2, rtol=2e-2)


def test_groups_are_found_by_uid_not_position():
    rewards, mask = outcome_rewards([1.0, 5.0, 0.0, 7.0], [1, 1, 1, 1], 1)
    perm = [2, 0, 3, 1]
    adv, _ = run("grpo", rewards, mask, index=["p", "q", "p", "q"])
    adv_perm, _ = run("grpo", rewards[perm], mask[perm], index=[["p", "q", "p", "q"][i] for i in perm])
    torch.testing.assert_close(adv_perm, adv[perm])


@pytest.mark.parametrize(
    "index",
    [np.array(["u1", "u2", "u1"], dtype=object), ["u1", "u2", "u1"], np.array([7, 9, 7]), torch.tensor([7, 9, 7])],
)
def test_index_may_be_strings_ints_arrays_or_tensors(index):
    rewards, mask = outcome_rewards([1.0, 2.0, 3.0], [1, 1, 1], 1)
    adv, _ = run("drgrpo", rewards, mask, index=index)
    # groups {0, 2}: mean 2 -> -1, +1; {1}: alone -> 0
    torch.testing.assert_close(adv, torch.tensor([[-1.0], [0.0], [1.0]], dtype=torch.float64))


def test_index_of_the_wrong_length_is_named():
    rewards, mask = outcome_rewards([1.0, 2.0, 3.0], [1, 1, 1], 1)
    with pytest.raises(ValueError, match="index has 2 labels but the batch has 3"):
        run("grpo", rewards, mask, index=["a", "b"])


@pytest.mark.parametrize(
    "name, missing",
    [("gae", "values"), ("grpo", "index"), ("rloo", "index"), ("opo", "index"), ("remax", "reward_baselines")],
)
def test_missing_required_input_is_named(name, missing):
    rewards, mask = outcome_rewards([1.0, 2.0], [1, 1], 1)
    with pytest.raises(ValueError, match=f"'{name}' needs {missing}"):
        run(name, rewards, mask)


def test_shapes_are_checked():
    rewards, mask = outcome_rewards([1.0, 2.0], [1, 1], 2)
    with pytest.raises(ValueError, match="response_mask"):
        run("grpo", rewards, mask[:, :1], index=["a", "a"])
    with pytest.raises(ValueError, match="values"):
        run("gae", rewards, mask, values=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="reward_baselines"):
        run("remax", rewards, mask, reward_baselines=torch.zeros(3))


def test_what_each_estimator_requires():
    assert estimator_needs_values("gae") and not estimator_needs_values("grpo")
    assert estimator_requires("remax") == ("reward_baselines",)
    assert estimator_requires("reinforce_plus_plus") == ()
    assert {n for n in ADV_ESTIMATORS.names() if "index" in estimator_requires(n)} == set(GROUP)
    assert estimator_needs_values({"_target_": "verl.algos.advantages.gae"})  # a _target_ keeps the metadata


def test_unknown_estimator_suggests_the_close_name():
    rewards, mask = outcome_rewards([1.0], [1], 1)
    with pytest.raises(KeyError, match="did you mean 'rloo'"):
        run("rlooo", rewards, mask)


def test_an_estimator_returning_the_wrong_thing_is_named():
    def broken(token_level_rewards, response_mask, **_):
        return token_level_rewards  # not a pair

    rewards, mask = outcome_rewards([1.0], [1], 1)
    with pytest.raises(TypeError, match="must return \\(advantages, returns\\)"):
        run(broken, rewards, mask)
