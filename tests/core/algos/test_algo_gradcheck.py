"""torch.autograd.gradcheck (float64, small inputs) for every loss: analytic gradients match finite differences.

Inputs stay away from the kinks (clip bounds, |x| at 0) where a derivative does not exist.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck

from verl.algos import (
    agg_loss,
    compute_policy_loss,
    compute_value_loss,
    dpo_loss,
    entropy_loss,
    kl_loss,
    kl_penalty,
)
from verl.config.schema import ActorConfig

F64 = torch.float64
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
# Ratios in every region of PPO (below, inside, above the clip range, beyond the dual clip c = 3), none on a kink.
RATIOS = torch.tensor([[0.5, 0.9, 1.1, 1.5, 4.0, 1.0], [0.6, 1.3, 3.5, 1.0, 1.0, 1.0]], dtype=F64)
ADV = torch.tensor([[1.0, -1.0, 0.5, -0.7, -1.2, 2.0], [-0.3, 0.8, -2.0, 1.0, 1.0, 1.0]], dtype=F64)
OLD = -torch.arange(1, 13, dtype=F64).reshape(2, 6) / 5


def check(fn, *inputs):
    inputs = tuple(t.detach().clone().requires_grad_() for t in inputs)
    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_ppo_clip_and_dual_clip(mode):
    config = ActorConfig(clip_ratio=0.2, clip_ratio_c=3.0)

    def loss(log_prob, adv):
        return compute_policy_loss("vanilla", OLD, log_prob, adv, MASK, loss_agg_mode=mode, config=config)[0]

    check(loss, OLD + RATIOS.log(), ADV)


def test_ppo_with_truncated_importance_sampling():
    config = ActorConfig(clip_ratio=0.2, tis_imp_ratio_cap=1.5)
    rollout = OLD - torch.linspace(-0.5, 0.5, 12, dtype=F64).reshape(2, 6)  # weights 0.61..1.65, some capped

    def loss(log_prob):
        return compute_policy_loss(
            "vanilla", OLD, log_prob, ADV, MASK, loss_agg_mode="token-mean", config=config, rollout_log_probs=rollout
        )[0]

    check(loss, OLD + RATIOS.log())


def test_gspo_gradient_is_that_of_the_sequence_objective():
    # With one advantage per sequence and seq-mean-token-mean, the stop-gradient construction must give the true
    # gradient of mean_i max(-A_i s_i, -A_i clip(s_i)), s_i the geometric-mean ratio, which finite differences see.
    config = ActorConfig(clip_ratio=0.2)
    adv = torch.tensor([[1.0] * 6, [-0.5] * 6], dtype=F64)
    log_ratio = torch.tensor([[0.05, -0.02, 0.1, 0.0, -0.04, 0.03], [0.3, -0.1, 0.05, 0.0, 0.0, 0.0]], dtype=F64)

    def loss(log_prob):
        return compute_policy_loss(
            "gspo", OLD, log_prob, adv, MASK, loss_agg_mode="seq-mean-token-mean", config=config
        )[0]

    check(loss, OLD + log_ratio)
    check(loss, OLD + 3 * log_ratio)  # row 1 now outside the clip range


@pytest.mark.parametrize("mode", MODES)
def test_cispo_gradient_treats_the_clipped_weight_as_a_constant(mode):
    # CISPO's gradient is -sg(w) A grad log pi: exact for a weight that does not move with log pi. Holding the
    # ratio fixed (pi_old moves with pi), finite differences see that; a weight that leaked gradient would not.
    config = ActorConfig(clip_ratio=0.2)
    log_ratio = RATIOS.log()

    def loss(log_prob):
        old = log_prob.detach() - log_ratio
        return compute_policy_loss("cispo", old, log_prob, ADV, MASK, loss_agg_mode=mode, config=config)[0]

    check(loss, OLD + log_ratio)


@pytest.mark.parametrize("mode", MODES)
def test_value_loss(mode):
    values = torch.zeros(2, 6, dtype=F64)
    returns = torch.tensor([[1.0, -1.0, 0.3, 2.0, -0.2, 0.0], [0.5, 0.5, 0.5, 0, 0, 0]], dtype=F64)
    vpreds = torch.tensor([[0.8, -0.1, 0.1, 0.9, -0.7, 0.2], [0.25, 0.7, -0.6, 0, 0, 0]], dtype=F64)

    def loss(vpreds, returns):
        return compute_value_loss(vpreds, returns, values, MASK, cliprange_value=0.5, loss_agg_mode=mode)[0]

    check(loss, vpreds, returns)


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_and_entropy(mode):
    x = torch.randn(2, 6, dtype=F64, generator=torch.Generator().manual_seed(0))
    check(lambda x: agg_loss(x, MASK, mode, norm_length=8), x)
    check(lambda x: entropy_loss(x.exp(), MASK, mode), x)


@pytest.mark.parametrize("kind", ["k1", "abs", "mse", "low_var_kl"])
def test_kl_estimators(kind):
    lp = torch.tensor([[-1.0, -0.5, -2.0]], dtype=F64)
    ref = torch.tensor([[-1.3, -0.2, -1.0]], dtype=F64)  # no equal pair: |x| has a kink at 0
    check(lambda a, b: kl_penalty(a, b, kind), lp, ref)
    check(lambda a, b: kl_loss(a, b, MASK[:1, :3], kind=kind, loss_agg_mode="token-mean")[0], lp, ref)


def test_full_kl():
    g = torch.Generator().manual_seed(1)
    check(
        lambda p, q: kl_penalty(p, q, "full"),
        torch.randn(2, 3, 4, dtype=F64, generator=g),
        torch.randn(2, 3, 4, dtype=F64, generator=g),
    )


@pytest.mark.parametrize("kind, smoothing", [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0)])
def test_dpo(kind, smoothing):
    inputs = [torch.tensor(v, dtype=F64) for v in ([-1.0, -3.0], [-2.0, -2.5], [-1.5, -2.0], [-1.2, -2.8])]
    check(lambda *x: dpo_loss(*x, beta=0.5, kind=kind, label_smoothing=smoothing)[0], *inputs)
    lengths = torch.tensor([3, 5])
    rpo = dict(nll_weight=0.7, chosen_lengths=lengths)
    check(lambda *x: dpo_loss(*x, beta=0.5, kind=kind, label_smoothing=smoothing, **rpo)[0], *inputs)


def test_inputs_avoid_the_kinks():
    # guards the fixtures above: gradcheck across a kink would fail for the wrong reason
    for r in RATIOS[MASK].tolist():
        assert min(abs(r - 0.8), abs(r - 1.2), abs(r - 3.0)) > 1e-3 or math.isclose(r, 1.0)
