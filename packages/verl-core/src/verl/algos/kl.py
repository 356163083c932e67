"""KL between the policy and the reference: per-token estimators, the reward penalty, the loss term, controllers.

Estimators of KL(pi || pi_ref) from the log-probs of the sampled tokens (x ~ pi), with
log r = log pi_ref(x) - log pi(x) (Schulman, "Approximating KL divergence", 2020):

    k1 | kl          log pi - log pi_ref                unbiased, high variance, can be negative
    abs              |log pi - log pi_ref|
    mse | k2         0.5 (log pi - log pi_ref)^2        low variance, biased
    low_var_kl | k3  r - log r - 1, clamped to [-10, 10] unbiased, low variance, >= 0
    full             sum_v pi(v) (log pi(v) - log pi_ref(v)) over the whole vocabulary: exact, needs the
                     full distributions: tensors [B, T, V] of logits or log-probs (normalised here with
                     log_softmax), not the [B, T] log-probs of the sampled tokens

Used two ways: `apply_kl_penalty` subtracts beta * KL from the token rewards (algorithm.use_kl_in_reward, beta
from a KL controller), and `kl_loss` adds an aggregated KL term to the actor loss (actor.use_kl_loss).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from verl.algos.aggregation import agg_loss
from verl.algos.utils import acc_dtype, config_value, masked_mean, zero_padding
from verl.config.schema import KLControlConfig
from verl.registry import Registry

__all__ = [
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "kl_loss",
    "kl_penalty",
    "make_kl_controller",
]

KL_ESTIMATORS = Registry("KL estimator", args=("log_prob", "ref_log_prob"))
KL_CONTROLLERS = Registry("KL controller", args=("config",))


def _diff(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    dtype = acc_dtype(log_prob, ref_log_prob)
    return log_prob.to(dtype) - ref_log_prob.to(dtype)


@KL_ESTIMATORS.register("k1", aliases=("kl",))
def k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    return _diff(log_prob, ref_log_prob)


@KL_ESTIMATORS.register("abs")
def abs_kl(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    return _diff(log_prob, ref_log_prob).abs()


@KL_ESTIMATORS.register("mse", aliases=("k2",))
def k2(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    return 0.5 * _diff(log_prob, ref_log_prob).square()


@KL_ESTIMATORS.register("low_var_kl", aliases=("k3",))
def k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """r - log r - 1 with log r = log pi_ref - log pi; log r clamped to +-20 and the result to [-10, 10] (verl)."""
    log_r = (-_diff(log_prob, ref_log_prob)).clamp(-20, 20)
    return (log_r.exp() - log_r - 1).clamp(-10, 10)


@KL_ESTIMATORS.register("full")
def full_kl(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """Exact KL(pi || pi_ref) per token from [B, T, V] logits or log-probs; returns [B, T]."""
    if log_prob.ndim < 3:
        raise ValueError(
            f"kl 'full' needs the whole distributions, [batch, tokens, vocab] logits or log-probs; got shape "
            f"{tuple(log_prob.shape)} (the sampled tokens' log-probs suit k1/abs/mse/low_var_kl)"
        )
    dtype = acc_dtype(log_prob, ref_log_prob)
    logp = F.log_softmax(log_prob.to(dtype), dim=-1)
    logq = F.log_softmax(ref_log_prob.to(dtype), dim=-1)
    p = logp.exp()
    # Where pi(v) = 0 the term is 0 (x log x -> 0); `where` keeps a -inf logit from making 0 * inf = NaN.
    return (p * torch.where(p > 0, logp - logq, torch.zeros((), dtype=dtype))).sum(dim=-1)


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kind: Any) -> Tensor:
    """Per-token KL estimate [B, T] by `kind` (a KL_ESTIMATORS name, `_target_` mapping or callable)."""
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)} and ref_log_prob {tuple(ref_log_prob.shape)} differ in shape"
        )
    return KL_ESTIMATORS.get(kind, key="kl_penalty")(log_prob, ref_log_prob)


def kl_loss(
    log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    *,
    kind: Any,
    loss_agg_mode: str,
    norm_length: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The KL loss term (actor.use_kl_loss): agg(kl_penalty(log_prob, ref_log_prob)); the trainer scales it by kl_loss_coef.

    Padding is zeroed before the estimator, so -inf/NaN log-probs there cannot reach the gradient.
    """
    mask = response_mask if log_prob.ndim == response_mask.ndim else response_mask.unsqueeze(-1).expand(log_prob.shape)
    log_prob, ref_log_prob = zero_padding(mask, log_prob, ref_log_prob)
    loss = agg_loss(kl_penalty(log_prob, ref_log_prob, kind), response_mask, loss_agg_mode, norm_length=norm_length)
    return loss, {"kl_loss": loss.detach()}


def apply_kl_penalty(
    token_level_scores: Tensor,
    old_log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    *,
    kl_ctrl: Any,
    kind: Any,
    update_controller: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """token_level_rewards = scores - beta * KL on response tokens (algorithm.use_kl_in_reward), beta = kl_ctrl.value.

    metrics: kl, the batch mean of each sequence's mean token KL, and kl_coef, the beta used. As in verl,
    the controller is then updated with that KL and n_steps = batch size (update_controller=False leaves
    it to the caller); the next call uses the new beta.
    """
    if token_level_scores.shape != response_mask.shape:
        raise ValueError(
            f"token_level_scores {tuple(token_level_scores.shape)} must match response_mask {tuple(response_mask.shape)}"
        )
    kld = kl_penalty(old_log_prob, ref_log_prob, kind)
    kld = torch.where(response_mask.bool(), kld, torch.zeros((), dtype=kld.dtype, device=kld.device))
    beta = float(kl_ctrl.value)
    dtype = acc_dtype(token_level_scores, kld)
    rewards = token_level_scores.to(dtype) - beta * kld.to(dtype)
    current_kl = float(masked_mean(kld, response_mask, dim=-1).mean()) if kld.shape[0] else 0.0
    if update_controller:
        kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"kl": current_kl, "kl_coef": beta}


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al., 2019): beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl must be > 0 for the adaptive controller, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + proportional_error * n_steps / self.horizon


@KL_CONTROLLERS.register("fixed")
def _fixed(cfg: KLControlConfig) -> FixedKLController:
    return FixedKLController(config_value(cfg, "kl_coef", 0.001))


@KL_CONTROLLERS.register("adaptive")
def _adaptive(cfg: KLControlConfig) -> AdaptiveKLController:
    return AdaptiveKLController(
        config_value(cfg, "kl_coef", 0.001), config_value(cfg, "target_kl", 0.1), config_value(cfg, "horizon", 10000)
    )


def make_kl_controller(cfg: KLControlConfig) -> FixedKLController | AdaptiveKLController:
    """The controller algorithm.kl_ctrl describes (type: fixed | adaptive, or any KL_CONTROLLERS entry)."""
    return KL_CONTROLLERS.get(config_value(cfg, "type", "fixed"), key="algorithm.kl_ctrl.type")(cfg)
