"""KL estimators, the reward penalty, the loss term and the controllers, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from verl.algos import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)
from verl.config.schema import KLControlConfig

LN2 = math.log(2.0)
F64 = torch.float64


@pytest.mark.parametrize(
    "kind, above, below",
    [
        # log pi = ln 0.5 and log pi_ref = ln 0.25 (diff +ln 2), then swapped (diff -ln 2)
        ("k1", LN2, -LN2),
        ("kl", LN2, -LN2),
        ("abs", LN2, LN2),
        ("mse", 0.5 * LN2**2, 0.5 * LN2**2),
        ("k2", 0.5 * LN2**2, 0.5 * LN2**2),
        # k3 = r - log r - 1 with log r = log pi_ref - log pi:
        #   r = 0.5: 0.5 + ln 2 - 1 = 0.19315;   r = 2: 2 - ln 2 - 1 = 0.30685
        ("low_var_kl", 0.5 + LN2 - 1, 2 - LN2 - 1),
        ("k3", 0.5 + LN2 - 1, 2 - LN2 - 1),
    ],
)
def test_estimators_by_hand(kind, above, below):
    lp = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=F64)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=F64)
    torch.testing.assert_close(kl_penalty(lp, ref, kind), torch.tensor([[above, below]], dtype=F64))


def test_low_var_kl_is_clamped_like_verl():
    # log r = 30 is clamped to 20: exp(20) - 20 - 1 ~ 4.9e8, then the estimate to 10
    assert float(kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "low_var_kl")) == 10.0


def test_full_kl_by_hand_from_logits():
    # p = [0.5, 0.5], q = [0.25, 0.75]: KL = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3)
    logits_p = torch.log(torch.tensor([[[0.5, 0.5]]], dtype=F64)) + 3.0  # any shift: normalised inside
    logits_q = torch.log(torch.tensor([[[0.25, 0.75]]], dtype=F64)) - 1.0
    torch.testing.assert_close(
        kl_penalty(logits_p, logits_q, "full"), torch.tensor([[0.5 * math.log(4 / 3)]], dtype=F64)
    )


def test_full_kl_with_a_masked_out_vocabulary_entry():
    # p = [1, 0] (a -inf logit), q = [0.5, 0.5]: KL = 1 * ln(1/0.5) = ln 2; the 0 * (-inf) term is 0, not NaN
    logits_p = torch.tensor([[[0.0, float("-inf")]]], dtype=F64, requires_grad=True)
    logits_q = torch.zeros(1, 1, 2, dtype=F64)
    kl = kl_penalty(logits_p, logits_q, "full")
    torch.testing.assert_close(kl, torch.tensor([[LN2]], dtype=F64))
    kl.sum().backward()
    assert torch.isfinite(logits_p.grad).all()


def test_full_kl_needs_a_vocabulary_dimension():
    with pytest.raises(ValueError, match="whole distributions"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), "full")


def test_unknown_kind_lists_the_registered_ones():
    with pytest.raises(KeyError, match="did you mean 'low_var_kl'") as info:
        kl_penalty(torch.zeros(1), torch.zeros(1), "low_var")
    assert "k1" in str(info.value) and "full" in str(info.value)
    assert {"k1", "kl", "abs", "mse", "k2", "low_var_kl", "k3", "full"} <= set(KL_ESTIMATORS.names())


def test_apply_kl_penalty_by_hand():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    ref = torch.zeros(2, 3)
    old = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])  # 9.0 sits on padding
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    ctrl = FixedKLController(0.1)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, kl_ctrl=ctrl, kind="k1")
    # scores - 0.1 * (old - ref) on response tokens; padding untouched (0)
    expected = torch.tensor([[-0.01, -0.02, 0.97], [-0.04, 1.95, 0.0]])
    torch.testing.assert_close(rewards, expected)
    # per-sequence mean KL: (0.1+0.2+0.3)/3 = 0.2 and (0.4+0.5)/2 = 0.45 -> batch mean 0.325
    assert metrics["kl"] == pytest.approx(0.325)
    assert metrics["kl_coef"] == pytest.approx(0.1)


def test_apply_kl_penalty_updates_an_adaptive_controller():
    scores, ref = torch.zeros(4, 2), torch.zeros(4, 2)
    old = torch.full((4, 2), 0.15)
    mask = torch.ones(4, 2, dtype=torch.bool)
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    _, metrics = apply_kl_penalty(scores, old, ref, mask, kl_ctrl=ctrl, kind="k1")
    # the penalty used the coefficient before the update
    assert metrics["kl_coef"] == pytest.approx(0.2)
    # KL 0.15 vs target 0.1: error clip(0.5, -0.2, 0.2) = 0.2; n_steps = batch size 4: 0.2 * (1 + 0.2 * 4/100)
    assert ctrl.value == pytest.approx(0.2 * 1.008)
    _, _ = apply_kl_penalty(scores, old, ref, mask, kl_ctrl=ctrl, kind="k1", update_controller=False)
    assert ctrl.value == pytest.approx(0.2 * 1.008)


def test_adaptive_controller_by_hand():
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.15, n_steps=10)  # error clip(0.5) = 0.2 -> * (1 + 0.2 * 10/100) = * 1.02
    assert ctrl.value == pytest.approx(0.204)
    ctrl.update(current_kl=0.09, n_steps=10)  # error 0.9 - 1 = -0.1 -> * (1 - 0.01)
    assert ctrl.value == pytest.approx(0.204 * 0.99)


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=10.0, n_steps=1000)
    assert ctrl.value == 0.05


def test_make_kl_controller_from_the_config():
    assert isinstance(make_kl_controller(KLControlConfig()), FixedKLController)
    ctrl = make_kl_controller(KLControlConfig(type="adaptive", kl_coef=0.3, target_kl=0.2, horizon=50))
    assert isinstance(ctrl, AdaptiveKLController) and (ctrl.value, ctrl.target, ctrl.horizon) == (0.3, 0.2, 50)
    with pytest.raises(
        KeyError, match="algorithm.kl_ctrl.type: unknown KL controller 'adaptiv'; did you mean 'adaptive'"
    ):
        make_kl_controller(KLControlConfig(type="adaptiv"))
    with pytest.raises(ValueError, match="horizon"):
        make_kl_controller(KLControlConfig(type="adaptive", horizon=0))


def test_kl_loss_term_ignores_padding_even_when_it_is_nan():
    lp = torch.tensor([[math.log(0.5), float("nan")]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), float("-inf")]])
    mask = torch.tensor([[1, 0]], dtype=torch.bool)
    loss, metrics = kl_loss(lp, ref, mask, kind="low_var_kl", loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(0.5 + LN2 - 1)
    assert float(metrics["kl_loss"]) == pytest.approx(0.5 + LN2 - 1)
    loss.backward()
    # d/dlogp (r - log r - 1) with log r = ref - logp: -r + 1 = 0.5; padding: exactly 0
    torch.testing.assert_close(lp.grad, torch.tensor([[0.5, 0.0]]))


def test_kl_loss_with_full_distributions():
    logits = torch.randn(2, 3, 5, dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    loss, _ = kl_loss(logits, logits.clone(), mask, kind="full", loss_agg_mode="token-mean")
    assert float(loss) == pytest.approx(0.0, abs=1e-12)


def test_bf16_inputs_are_estimated_in_float32():
    lp = torch.tensor([-1.0, -2.0]).bfloat16()
    ref = torch.tensor([-1.5, -1.0]).bfloat16()
    for kind in ("k1", "abs", "mse", "low_var_kl"):
        out = kl_penalty(lp, ref, kind)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, kl_penalty(lp.float(), ref.float(), kind))
