"""Properties that hold for every input (hypothesis): group advantages, PPO clipping, aggregation."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.algos import agg_loss, compute_advantages, compute_policy_loss
from verl.config.schema import ActorConfig, AlgorithmConfig

SETTINGS = settings(max_examples=60, deadline=None)

# Rewards on a grid of quarters (exact in binary): invariance to a shift is then exact up to the rounding of
# one division, not lost to cancellation between nearly equal rewards, which no estimator can avoid.
QUARTERS = st.integers(-8, 8).map(lambda k: k / 4)


@st.composite
def grouped_batch(draw):
    """Scores of groups of 1..6 samples, shuffled so groups are interleaved; every response 1..4 tokens."""
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    labels = [f"uid-{g}" for g, n in enumerate(sizes) for _ in range(n)]
    order = draw(st.permutations(range(len(labels))))
    labels = [labels[i] for i in order]
    scores = draw(st.lists(QUARTERS, min_size=len(labels), max_size=len(labels)))
    lengths = draw(st.lists(st.integers(1, 4), min_size=len(labels), max_size=len(labels)))
    return labels, scores, lengths


def as_tensors(scores, lengths, shift=0.0):
    rewards = torch.zeros(len(scores), 4, dtype=torch.float64)
    mask = torch.zeros(len(scores), 4, dtype=torch.bool)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = True
        rewards[i, n - 1] = s + shift
    return rewards, mask


def per_sequence(adv):
    return adv[:, 0]  # every response has a first token and the advantage is constant along it


@SETTINGS
@given(grouped_batch(), st.booleans(), st.sampled_from(["grpo", "rloo"]))
def test_group_advantages_sum_to_zero_per_group(batch, norm_by_std, name):
    labels, scores, lengths = batch
    rewards, mask = as_tensors(scores, lengths)
    config = AlgorithmConfig(norm_adv_by_std_in_grpo=norm_by_std)
    adv = per_sequence(compute_advantages(name, rewards, mask, config=config, index=labels)[0])
    for uid in set(labels):
        members = [i for i, label in enumerate(labels) if label == uid]
        assert math.isclose(float(adv[members].sum()), 0.0, abs_tol=1e-9), (uid, adv[members])


@SETTINGS
@given(grouped_batch(), st.booleans(), st.integers(-400, 400).map(lambda k: k / 4))
def test_grpo_is_invariant_to_a_reward_shift(batch, norm_by_std, shift):
    labels, scores, lengths = batch
    config = AlgorithmConfig(norm_adv_by_std_in_grpo=norm_by_std)
    base = compute_advantages("grpo", *as_tensors(scores, lengths), config=config, index=labels)[0]
    shifted = compute_advantages("grpo", *as_tensors(scores, lengths, shift), config=config, index=labels)[0]
    torch.testing.assert_close(shifted, base, atol=1e-9, rtol=0)


@st.composite
def ppo_batch(draw):
    b, t = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    n = b * t
    log_ratio = draw(st.lists(st.floats(-1.5, 1.5), min_size=n, max_size=n))
    adv = draw(st.lists(st.floats(-2, 2), min_size=n, max_size=n))
    mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    low, high = draw(st.floats(0.05, 0.5)), draw(st.floats(0.05, 0.5))
    c = draw(st.floats(1.05, 3.0))
    shape = (b, t)
    return (
        torch.tensor(log_ratio, dtype=torch.float64).reshape(shape),
        torch.tensor(adv, dtype=torch.float64).reshape(shape),
        torch.tensor(mask).reshape(shape),
        low,
        high,
        c,
    )


@SETTINGS
@given(ppo_batch())
def test_ppo_gradient_is_zero_exactly_where_the_ratio_is_clipped(batch):
    log_ratio, adv, mask, low, high, c = batch
    log_prob = log_ratio.clone().requires_grad_()  # pi_old = 1 everywhere, so log pi - log pi_old = log_ratio
    config = ActorConfig(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c)
    loss, _ = compute_policy_loss(
        "vanilla", torch.zeros_like(log_ratio), log_prob, adv, mask, loss_agg_mode="token-mean", config=config
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    n_tokens = max(int(mask.sum()), 1)
    for (i, j), keep in zip(
        torch.cartesian_prod(torch.arange(mask.shape[0]), torch.arange(mask.shape[1])).tolist(), mask.flatten().tolist()
    ):
        r, a = math.exp(float(log_ratio[i, j])), float(adv[i, j])
        if not keep:
            assert grad[i, j] == 0
            continue
        if min(abs(r - (1 + high)), abs(r - (1 - low)), abs(r - c)) < 1e-9:
            continue  # on a kink the gradient is a matter of convention
        clipped = (a > 0 and r > 1 + high) or (a < 0 and r < 1 - low)
        dual = a < 0 and r > c
        expected = 0.0 if clipped or dual else -a * r / n_tokens
        assert math.isclose(float(grad[i, j]), expected, rel_tol=1e-9, abs_tol=1e-12), (r, a, low, high, c)


@SETTINGS
@given(
    st.integers(1, 5),
    st.integers(1, 6),
    st.integers(0, 3),
    st.data(),
)
def test_aggregation_modes_agree_when_every_length_is_equal(batch, length, padding, data):
    width = length + padding
    values = data.draw(st.lists(st.floats(-10, 10), min_size=batch * width, max_size=batch * width))
    loss = torch.tensor(values, dtype=torch.float64).reshape(batch, width)
    mask = torch.zeros(batch, width, dtype=torch.bool)
    mask[:, :length] = True
    token_mean = agg_loss(loss, mask, "token-mean")
    torch.testing.assert_close(agg_loss(loss, mask, "seq-mean-token-mean"), token_mean)
    torch.testing.assert_close(agg_loss(loss, mask, "seq-mean-token-sum-norm", norm_length=length), token_mean)
    torch.testing.assert_close(agg_loss(loss, mask, "seq-mean-token-sum"), length * token_mean)
    if padding == 0:  # the default horizon is the padded width T
        torch.testing.assert_close(agg_loss(loss, mask, "seq-mean-token-sum-norm"), token_mean)
