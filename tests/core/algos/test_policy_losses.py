"""Policy, value and entropy losses against values worked out by hand, with padding and edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from verl.algos import POLICY_LOSSES, compute_policy_loss, compute_value_loss, entropy_loss
from verl.config.schema import ActorConfig

LN = math.log
F64 = torch.float64


def actor(**kw) -> ActorConfig:
    return ActorConfig(**{"clip_ratio": 0.2, **kw})


def ppo_batch():
    """Ratios and advantages covering every PPO case; row 1 has padding holding garbage log-probs.

    t  ratio  A    -A r   -A clip(r)   max    dual (A<0: min with -A c = 3)
    0  1.1    +1   -1.1   -1.1         -1.1   -
    1  1.5    +1   -1.5   -1.2         -1.2   -            (clipped)
    2  0.5    -1    0.5    0.8          0.8   min(0.8, 3) = 0.8  (clipped)
    3  4.0    -1    4.0    1.2          4.0   min(4.0, 3) = 3.0  (dual clip)
    row 1, t0: ratio 0.9, A = +2: -1.8 (inside the clip range)
    """
    ratios = [[1.1, 1.5, 0.5, 4.0], [0.9, 1.0, 1.0, 1.0]]
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.0, float("-inf"), float("nan"), 0.0]], dtype=F64)
    log_prob = old.clone()
    log_prob[0] = old[0] + torch.tensor(ratios[0], dtype=F64).log()
    log_prob[1, 0] = old[1, 0] + LN(0.9)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0], [2.0, 5.0, 5.0, 5.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    return old, log_prob.requires_grad_(), adv, mask


def test_ppo_clip_and_dual_clip_by_hand():
    old, log_prob, adv, mask = ppo_batch()
    loss, metrics = compute_policy_loss("vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean", config=actor())
    # token-mean over 5 tokens: (-1.1 - 1.2 + 0.8 + 3.0 - 1.8) / 5 = -0.3 / 5
    torch.testing.assert_close(loss, torch.tensor(-0.06, dtype=F64))
    assert float(metrics["pg_clipfrac"]) == pytest.approx(2 / 5)  # t1, t2
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(1 / 5)  # t3
    kl = -(LN(1.1) + LN(1.5) + LN(0.5) + LN(4.0) + LN(0.9)) / 5  # mean of log pi_old - log pi
    assert float(metrics["ppo_kl"]) == pytest.approx(kl)
    assert all(not v.requires_grad for v in metrics.values())

    loss.backward()
    # d/dlogp (-A r) = -A r where unclipped, 0 where a clip binds; divided by the 5 tokens; padding gets 0
    expected = torch.tensor([[-1.1 / 5, 0.0, 0.0, 0.0], [-2 * 0.9 / 5, 0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(log_prob.grad, expected)


def test_dual_clip_is_an_alias_of_vanilla():
    assert POLICY_LOSSES.get("dual_clip") is POLICY_LOSSES.get("vanilla")


def test_clip_higher_uses_its_own_upper_bound():
    old, log_prob, adv, mask = ppo_batch()
    config = actor(clip_ratio_low=0.2, clip_ratio_high=0.28)
    loss, _ = compute_policy_loss("vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean", config=config)
    # t1 now clips at 1.28: (-1.1 - 1.28 + 0.8 + 3.0 - 1.8) / 5; t2's lower clip is unchanged (0.8)
    torch.testing.assert_close(loss, torch.tensor((-1.1 - 1.28 + 0.8 + 3.0 - 1.8) / 5, dtype=F64))


def test_dual_clip_bound_from_config():
    old, log_prob, adv, mask = ppo_batch()
    loss, metrics = compute_policy_loss(
        "vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean", config=actor(clip_ratio_c=5.0)
    )
    # t3: min(4.0, 5) = 4.0 now: (-1.1 - 1.2 + 0.8 + 4.0 - 1.8) / 5
    torch.testing.assert_close(loss, torch.tensor(0.7 / 5, dtype=F64))
    assert float(metrics["pg_clipfrac_lower"]) == 0.0
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss(
            "vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean", config=actor(clip_ratio_c=1.0)
        )


@pytest.mark.parametrize(
    "mode, expected",
    [
        # row sums: row 0 = -1.1 - 1.2 + 0.8 + 3.0 = 1.5 (4 tokens); row 1 = -1.8 (1 token)
        ("seq-mean-token-sum", (1.5 - 1.8) / 2),
        ("seq-mean-token-mean", (1.5 / 4 - 1.8 / 1) / 2),
        ("seq-mean-token-sum-norm", (1.5 / 4 - 1.8 / 4) / 2),  # H = T = 4
    ],
)
def test_ppo_loss_under_each_aggregation(mode, expected):
    old, log_prob, adv, mask = ppo_batch()
    loss, _ = compute_policy_loss("vanilla", old, log_prob, adv, mask, loss_agg_mode=mode, config=actor())
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=F64))


def test_loss_norm_length_sets_the_dr_grpo_horizon():
    old, log_prob, adv, mask = ppo_batch()
    config = actor(loss_norm_length=10)
    loss, _ = compute_policy_loss(
        "vanilla", old, log_prob, adv, mask, loss_agg_mode="seq-mean-token-sum-norm", config=config
    )
    torch.testing.assert_close(loss, torch.tensor((1.5 / 10 - 1.8 / 10) / 2, dtype=F64))


def test_truncated_importance_sampling_by_hand():
    old, log_prob, adv, mask = ppo_batch()
    # pi_old / pi_rollout per token: row 0 [3, 0.5, 1, 1], row 1 [1.5, padding]; cap 2 -> [2, 0.5, 1, 1], [1.5]
    raw = torch.tensor([[3.0, 0.5, 1.0, 1.0], [1.5, 1.0, 1.0, 1.0]], dtype=F64)
    rollout = torch.nan_to_num(old, nan=0.0, neginf=0.0) - raw.log()
    loss, metrics = compute_policy_loss(
        "vanilla",
        old,
        log_prob,
        adv,
        mask,
        loss_agg_mode="token-mean",
        config=actor(tis_imp_ratio_cap=2.0),
        rollout_log_probs=rollout,
    )
    # (-1.1*2 - 1.2*0.5 + 0.8*1 + 3.0*1 - 1.8*1.5) / 5 = (-2.2 - 0.6 + 0.8 + 3.0 - 2.7) / 5 = -1.7 / 5
    torch.testing.assert_close(loss, torch.tensor(-0.34, dtype=F64))
    assert float(metrics["tis_weight_mean"]) == pytest.approx((2 + 0.5 + 1 + 1 + 1.5) / 5)
    assert float(metrics["tis_clipfrac"]) == pytest.approx(1 / 5)
    loss.backward()
    assert log_prob.grad[0, 0] == pytest.approx(-1.1 * 2 / 5)  # the weight scales the gradient, detached


def test_truncated_importance_sampling_needs_both_the_cap_and_rollout_log_probs():
    old, log_prob, adv, mask = ppo_batch()
    base, _ = compute_policy_loss("vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean", config=actor())
    rollout = torch.zeros_like(old)
    no_cap, m1 = compute_policy_loss(
        "vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean", config=actor(), rollout_log_probs=rollout
    )
    no_rollout, m2 = compute_policy_loss(
        "vanilla", old, log_prob, adv, mask, loss_agg_mode="token-mean", config=actor(tis_imp_ratio_cap=2.0)
    )
    assert no_cap.item() == base.item() == no_rollout.item()
    assert "tis_weight_mean" not in m1 and "tis_weight_mean" not in m2


def test_gspo_by_hand():
    old = torch.zeros(2, 3, dtype=F64)
    log_prob = torch.tensor([[LN(1.1), LN(1.3), 9.0], [LN(0.5), LN(0.8), LN(0.9)]], dtype=F64).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    # s_0 = (1.1 * 1.3)^(1/2) = sqrt(1.43) = 1.19583..., inside [0.8, 1.2]: loss -s_0 on each token
    # s_1 = (0.5 * 0.8 * 0.9)^(1/3) = 0.36^(1/3) = 0.71138..., A < 0: max(0.711, clip 0.8) = 0.8 (clipped)
    s0, s1 = math.sqrt(1.43), 0.36 ** (1 / 3)
    assert s1 < 0.8
    loss, metrics = compute_policy_loss(
        "gspo", old, log_prob, adv, mask, loss_agg_mode="seq-mean-token-mean", config=actor()
    )
    torch.testing.assert_close(loss, torch.tensor((-s0 + 0.8) / 2, dtype=F64))
    assert float(metrics["pg_clipfrac"]) == pytest.approx(3 / 5)
    loss.backward()
    # row 0: d/dlogp_t of -A s_0 = -s_0 / 2 per token (the ratio is a geometric mean over 2 tokens), /2 sequences
    expected = torch.tensor([[-s0 / 4, -s0 / 4, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(log_prob.grad, expected)


def test_cispo_by_hand_keeps_the_gradient_of_clipped_tokens():
    old = torch.zeros(1, 4, dtype=F64)
    log_prob = torch.tensor([[LN(1.5), LN(0.5), LN(1.0), 3.0]], dtype=F64).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -2.0, 1.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    # weights sg(clip(r, 0.8, 1.2)) = [1.2, 0.8, 1.0]; loss = mean(-w A log pi)
    loss, metrics = compute_policy_loss("cispo", old, log_prob, adv, mask, loss_agg_mode="token-mean", config=actor())
    expected = -(1.2 * 1 * LN(1.5) + 0.8 * 1 * LN(0.5) + 1.0 * -2 * 0.0) / 3
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=F64))
    assert float(metrics["pg_clipfrac"]) == pytest.approx(1 / 3)
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(1 / 3)
    loss.backward()
    # -w A / 3: PPO would give the first two tokens 0 here
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1.2 / 3, -0.8 / 3, 2.0 / 3, 0.0]], dtype=F64))


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo"])
def test_all_masked_rows_and_empty_batches_are_finite(name):
    old = torch.tensor([[0.0, -1.0], [float("nan"), float("-inf")]])
    log_prob = torch.tensor([[-0.1, -0.9], [float("inf"), float("nan")]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0], [float("nan"), 1.0]])
    mask = torch.tensor([[1, 1], [0, 0]], dtype=torch.bool)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss, metrics = compute_policy_loss(name, old, log_prob, adv, mask, loss_agg_mode=mode, config=actor())
        (grad,) = torch.autograd.grad(loss, log_prob)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), mode
        assert torch.equal(grad[1], torch.zeros(2)), mode
        assert all(torch.isfinite(v) for v in metrics.values()), mode
    nothing = torch.zeros(2, 2, dtype=torch.bool)
    loss, _ = compute_policy_loss(name, old, log_prob, adv, nothing, loss_agg_mode="token-mean", config=actor())
    assert loss.item() == 0.0


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo"])
def test_bf16_inputs(name):
    torch.manual_seed(0)
    old32 = -torch.rand(4, 6) * 3
    lp32 = old32 + torch.randn(4, 6) * 0.1
    adv = torch.randn(4, 6)
    mask = torch.rand(4, 6) > 0.3
    lp16 = lp32.bfloat16().requires_grad_()
    loss16, _ = compute_policy_loss(
        name, old32.bfloat16(), lp16, adv.bfloat16(), mask, loss_agg_mode="token-mean", config=actor()
    )
    loss32, _ = compute_policy_loss(
        name,
        old32.bfloat16().float(),
        lp16.detach().float(),
        adv.bfloat16().float(),
        mask,
        loss_agg_mode="token-mean",
        config=actor(),
    )
    assert loss16.dtype == torch.float32  # the ratio is formed in float32, not from two rounded bf16 numbers
    torch.testing.assert_close(loss16, loss32)
    loss16.backward()
    assert lp16.grad.dtype == torch.bfloat16 and torch.isfinite(lp16.grad.float()).all()


def test_shapes_and_names_are_checked():
    old, log_prob, adv, mask = ppo_batch()
    with pytest.raises(ValueError, match="advantages must be"):
        compute_policy_loss("vanilla", old, log_prob, adv[:, :2], mask, loss_agg_mode="token-mean", config=actor())
    with pytest.raises(KeyError, match="did you mean 'gspo'"):
        compute_policy_loss("gpso", old, log_prob, adv, mask, loss_agg_mode="token-mean", config=actor())
    with pytest.raises(KeyError, match="did you mean 'token-mean'"):
        compute_policy_loss("vanilla", old, log_prob, adv, mask, loss_agg_mode="token_mean", config=actor())


def test_a_loss_by_target_is_the_same_function():
    old, log_prob, adv, mask = ppo_batch()
    spec = {"_target_": "verl.algos.policy_losses.cispo"}
    by_target, _ = compute_policy_loss(spec, old, log_prob, adv, mask, loss_agg_mode="token-mean", config=actor())
    by_name, _ = compute_policy_loss("cispo", old, log_prob, adv, mask, loss_agg_mode="token-mean", config=actor())
    assert by_target.item() == by_name.item()


# --------------------------------------------------------------------------- value and entropy


def test_value_loss_by_hand():
    vpreds = torch.tensor([[1.0, 2.0, 0.0, 50.0]], dtype=F64, requires_grad=True)
    values = torch.tensor([[0.5, 0.5, 0.5, 0.0]], dtype=F64)
    returns = torch.tensor([[1.5, 0.0, 1.0, -50.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    # cliprange 0.2 -> predictions clip to [0.3, 0.7]
    # t0: clip 0.7; (1 - 1.5)^2 = 0.25, (0.7 - 1.5)^2 = 0.64 -> 0.64 (clipped one wins)
    # t1: clip 0.7; (2 - 0)^2 = 4,      (0.7 - 0)^2 = 0.49   -> 4
    # t2: clip 0.3; (0 - 1)^2 = 1,      (0.3 - 1)^2 = 0.49   -> 1
    loss, metrics = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2, loss_agg_mode="token-mean")
    torch.testing.assert_close(loss, torch.tensor(0.5 * (0.64 + 4 + 1) / 3, dtype=F64))
    assert float(metrics["vf_clipfrac"]) == pytest.approx(1 / 3)
    assert float(metrics["vpred_mean"]) == pytest.approx(1.0)
    loss.backward()
    # 0.5 * d/dv (v - R)^2 / 3 = (v - R) / 3 where unclipped; 0 at t0 (clipped prediction is constant)
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, 2.0 / 3, -1.0 / 3, 0.0]], dtype=F64))


def test_entropy_bonus_is_the_aggregated_entropy():
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(entropy_loss(entropy, mask, "token-mean"), torch.tensor(7 / 3))  # (1 + 2 + 4) / 3
    torch.testing.assert_close(entropy_loss(entropy, mask, "seq-mean-token-mean"), torch.tensor((1.5 + 4) / 2))


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo"])
def test_empty_responses_width_zero(name):
    empty = torch.zeros(2, 0)
    log_prob = empty.clone().requires_grad_()
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss, metrics = compute_policy_loss(
            name, empty, log_prob, empty, empty.bool(), loss_agg_mode=mode, config=actor()
        )
        assert loss.item() == 0.0 and all(float(v) == 0.0 for v in metrics.values())
        (grad,) = torch.autograd.grad(loss, log_prob)
        assert grad.shape == (2, 0)


def test_value_loss_with_bf16_predictions():
    vpreds = torch.tensor([[1.0, 2.0, 0.0]]).bfloat16().requires_grad_()
    values, returns = torch.full((1, 3), 0.5).bfloat16(), torch.tensor([[1.5, 0.0, 1.0]]).bfloat16()
    loss, _ = compute_value_loss(
        vpreds, returns, values, torch.ones(1, 3, dtype=torch.bool), cliprange_value=0.2, loss_agg_mode="token-mean"
    )
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(0.94)  # as in the float64 case above
    loss.backward()
    assert vpreds.grad.dtype == torch.bfloat16
