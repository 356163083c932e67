"""Advantage estimators: per-token advantages and returns from rewards, masks and (for some) values or groups.

An estimator is fn(token_level_rewards [B, T], response_mask [B, T], *, ...) -> (advantages [B, T],
returns [B, T]), taking by keyword whichever of index, values, reward_baselines and config it uses, and
declaring the ones it needs with `register(..., requires=(...))`.

Conventions (shared by every built-in estimator):
- Outcome estimators score a response by the sum of its token rewards over the whole row (as verl does: the
  reward sits on the last response token; a row's padding carries no reward).
- Groups (samples of one prompt) are found by their uid label in `index`, wherever they sit in the batch.
- A group of one sample, or a group whose scores are all equal, has no signal to compare against: its
  advantages are exactly 0. Upstream verl gives a lone sample its raw score (baseline 0) instead; we do not,
  because a lone sample's raw reward is not an advantage and would bias its update by the reward's offset.
- Results are computed without gradient in float32 at least (bf16 rewards are upcast), and are exactly 0
  outside the response mask.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from verl.algos.utils import acc_dtype, accepted_kwargs, config_value, group_ids, masked_whiten
from verl.registry import Registry

__all__ = ["ADV_ESTIMATORS", "EPSILON", "compute_advantages", "estimator_needs_values"]

ADV_ESTIMATORS = Registry(
    "advantage estimator",
    args=("token_level_rewards", "response_mask"),
    offered=("config", "index", "values", "reward_baselines"),
)

EPSILON = 1e-6  # GRPO's std guard, as in verl

# What each optional input is, for the error raised when an estimator needs it and it is missing.
INPUTS = {
    "index": "index (one group uid per sample, e.g. the batch's 'uid' array)",
    "values": "values (the critic's per-token values, Tensor[B, T]; enable the critic)",
    "reward_baselines": "reward_baselines (the reward of each prompt's greedy response, Tensor[B])",
}


class _GroupStats(NamedTuple):
    """Each sample's outcome score and statistics of its group (each a tensor [B])."""

    score: Tensor  # the sample's token rewards summed
    gid: Tensor  # dense group number
    n_groups: int
    size: Tensor  # samples in the group
    mean: Tensor
    std: Tensor  # unbiased (Bessel), 0 for a group of one
    flat: Tensor  # bool: every score in the group is equal (true for a group of one)


def _group_stats(token_level_rewards: Tensor, index: Any) -> _GroupStats:
    scores = token_level_rewards.to(acc_dtype(token_level_rewards)).sum(dim=-1)
    gid, n = group_ids(index, scores.shape[0])
    gid = gid.to(scores.device)
    count = scores.new_zeros(n).index_add_(0, gid, torch.ones_like(scores))
    mean = scores.new_zeros(n).index_add_(0, gid, scores) / count
    sq_dev = scores.new_zeros(n).index_add_(0, gid, (scores - mean[gid]) ** 2)
    std = (sq_dev / (count - 1).clamp_min(1)).sqrt()
    # Exact equality, not std == 0: a mean that rounds leaves a tiny std that 1e-6 would blow up.
    hi = scores.new_full((n,), float("-inf")).scatter_reduce_(0, gid, scores, "amax")
    lo = scores.new_full((n,), float("inf")).scatter_reduce_(0, gid, scores, "amin")
    return _GroupStats(scores, gid, n, count[gid], mean[gid], std[gid], (hi == lo)[gid])


def _group_advantages(adv: Tensor, g: _GroupStats, response_mask: Tensor) -> Tensor:
    """Per-sample advantages spread over their response tokens; 0 for a group whose scores are all equal."""
    adv = torch.where(g.flat, torch.zeros_like(adv), adv)
    return _zero_outside(adv.unsqueeze(-1).expand(-1, response_mask.shape[-1]), response_mask)


def _zero_outside(x: Tensor, response_mask: Tensor) -> Tensor:
    return torch.where(response_mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _whiten(x: Tensor, response_mask: Tensor) -> Tensor:
    return _zero_outside(masked_whiten(x, response_mask), response_mask)


@ADV_ESTIMATORS.register("gae", requires=("values",))
@torch.no_grad()
def gae(
    token_level_rewards: Tensor, response_mask: Tensor, *, values: Tensor, config: Any = None
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation: A_t = sum_l (gamma*lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t.

    Masked-out tokens (padding, or observation tokens inside a multi-turn response) are skipped: the
    recursion carries over them. Returns are the raw advantages plus values; advantages are then whitened
    over the mask (as in verl).
    """
    gamma, lam = config_value(config, "gamma", 1.0), config_value(config, "lam", 1.0)
    dtype = acc_dtype(token_level_rewards, values)
    rewards, values, keep = token_level_rewards.to(dtype), values.to(dtype), response_mask.bool()
    batch, length = rewards.shape
    next_value = rewards.new_zeros(batch)
    last_gae = rewards.new_zeros(batch)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * last_gae
        next_value = torch.where(keep[:, t], values[:, t], next_value)
        last_gae = torch.where(keep[:, t], candidate, last_gae)
        advantages[:, t] = last_gae
    returns = _zero_outside(advantages + values, response_mask)
    advantages = _whiten(advantages, response_mask)
    return advantages, returns


def _grpo(token_level_rewards: Tensor, response_mask: Tensor, index: Any, norm_by_std: bool) -> tuple[Tensor, Tensor]:
    g = _group_stats(token_level_rewards, index)
    adv = g.score - g.mean
    if norm_by_std:
        adv = adv / (g.std + EPSILON)
    adv = _group_advantages(adv, g, response_mask)
    return adv, adv


@ADV_ESTIMATORS.register("grpo", requires=("index",))
@torch.no_grad()
def grpo(
    token_level_rewards: Tensor, response_mask: Tensor, *, index: Any, config: Any = None
) -> tuple[Tensor, Tensor]:
    """GRPO: A_i = (r_i - mean_group) / (std_group + 1e-6); without the std (norm_adv_by_std_in_grpo=False): Dr.GRPO."""
    return _grpo(token_level_rewards, response_mask, index, config_value(config, "norm_adv_by_std_in_grpo", True))


@ADV_ESTIMATORS.register("drgrpo", requires=("index",))
@torch.no_grad()
def drgrpo(token_level_rewards: Tensor, response_mask: Tensor, *, index: Any) -> tuple[Tensor, Tensor]:
    """Dr.GRPO: A_i = r_i - mean_group, whatever norm_adv_by_std_in_grpo says."""
    return _grpo(token_level_rewards, response_mask, index, norm_by_std=False)


@ADV_ESTIMATORS.register("rloo", requires=("index",))
@torch.no_grad()
def rloo(token_level_rewards: Tensor, response_mask: Tensor, *, index: Any) -> tuple[Tensor, Tensor]:
    """RLOO: A_i = r_i - mean of the other samples of the group = n/(n-1) (r_i - mean_group)."""
    g = _group_stats(token_level_rewards, index)
    adv = _group_advantages((g.score - g.mean) * g.size / (g.size - 1).clamp_min(1), g, response_mask)
    return adv, adv


@ADV_ESTIMATORS.register("opo", requires=("index",))
@torch.no_grad()
def opo(token_level_rewards: Tensor, response_mask: Tensor, *, index: Any) -> tuple[Tensor, Tensor]:
    """OPO: A_i = r_i - b, with the length-weighted optimal baseline b = sum_j |o_j| r_j / sum_j |o_j| of the group.

    A group whose responses are all empty (total length 0) falls back to the plain mean (its advantages are
    masked to 0 anyway).
    """
    g = _group_stats(token_level_rewards, index)
    lengths = response_mask.to(g.score.dtype).sum(dim=-1)
    weighted = g.score.new_zeros(g.n_groups).index_add_(0, g.gid, lengths * g.score)[g.gid]
    total_length = g.score.new_zeros(g.n_groups).index_add_(0, g.gid, lengths)[g.gid]
    baseline = torch.where(total_length > 0, weighted / total_length.clamp_min(1e-30), g.mean)
    adv = _group_advantages(g.score - baseline, g, response_mask)
    return adv, adv


@ADV_ESTIMATORS.register("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(
    token_level_rewards: Tensor, response_mask: Tensor, *, config: Any = None
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted returns G_t (gamma from config), whitened over every response token of the batch.

    G_t = r_t + gamma G_{t'} over the response's tokens, t' the next token in the mask: masked-out tokens (padding,
    or a tool's output inside a multi-turn response) are skipped, as in gae, so an outcome reward reaches every
    earlier turn (mask 1 1 0 0 1, reward 1 at the end, gamma 1: returns 1 1 0 0 1).
    """
    rewards, keep = token_level_rewards.to(acc_dtype(token_level_rewards)), response_mask.bool()
    gamma = config_value(config, "gamma", 1.0)
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(keep[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    returns = _zero_outside(returns, response_mask)
    return _whiten(returns, response_mask), returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline", requires=("index",))
@torch.no_grad()
def reinforce_plus_plus_baseline(
    token_level_rewards: Tensor, response_mask: Tensor, *, index: Any
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline: r_i - mean_group on every token, then whitened over every response token of the batch."""
    g = _group_stats(token_level_rewards, index)
    adv = _whiten(_group_advantages(g.score - g.mean, g, response_mask), response_mask)
    return adv, adv


@ADV_ESTIMATORS.register("remax", requires=("reward_baselines",))
@torch.no_grad()
def remax(token_level_rewards: Tensor, response_mask: Tensor, *, reward_baselines: Tensor) -> tuple[Tensor, Tensor]:
    """ReMax: A_t = G_t - b with G_t the undiscounted reward-to-go and b the greedy response's reward (trainer-supplied)."""
    dtype = acc_dtype(token_level_rewards, reward_baselines)
    rewards = _zero_outside(token_level_rewards.to(dtype), response_mask)
    returns = rewards.flip(-1).cumsum(dim=-1).flip(-1)
    advantages = _zero_outside(returns - reward_baselines.to(dtype).reshape(-1, 1), response_mask)
    return advantages, _zero_outside(returns, response_mask)


def estimator_requires(name_or_spec: Any) -> tuple[str, ...]:
    """The optional inputs (index, values, reward_baselines) the estimator needs."""
    # Registry.attr looks through the functools.partial a _target_ spec with kwargs gives.
    return tuple(ADV_ESTIMATORS.attr(name_or_spec, "requires", (), key="algorithm.adv_estimator"))


def estimator_needs_values(name_or_spec: Any) -> bool:
    """Whether the estimator needs a critic's values (the trainer runs a critic exactly when this is true)."""
    return "values" in estimator_requires(name_or_spec)


def compute_advantages(
    name_or_spec: Any,
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    config: Any,
    index: Any = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Run the estimator `name_or_spec` selects (a name, a `_target_` mapping or a callable) on one batch.

    Inputs it declares in `requires` must not be None. A custom estimator receives only the keyword
    arguments its signature names (all of them if it takes **kwargs).
    """
    fn = ADV_ESTIMATORS.get(name_or_spec, key="algorithm.adv_estimator")
    label = name_or_spec if isinstance(name_or_spec, str) else getattr(fn, "__name__", repr(fn))
    _check_inputs(token_level_rewards, response_mask, values, reward_baselines)
    inputs = {"index": index, "values": values, "reward_baselines": reward_baselines}
    for name in estimator_requires(fn):
        if name not in INPUTS:
            raise ValueError(
                f"advantage estimator '{label}' requires unknown input '{name}'; known: {', '.join(INPUTS)}"
            )
        if inputs[name] is None:
            raise ValueError(f"advantage estimator '{label}' needs {INPUTS[name]}; got None")
    result = fn(token_level_rewards, response_mask, **accepted_kwargs(fn, {**inputs, "config": config}))
    if not (
        isinstance(result, tuple)
        and len(result) == 2
        and all(isinstance(r, Tensor) and r.shape == token_level_rewards.shape for r in result)
    ):
        raise TypeError(
            f"advantage estimator '{label}' must return (advantages, returns), two tensors of shape "
            f"{tuple(token_level_rewards.shape)}; got {_shapes(result)}"
        )
    return result


def _check_inputs(rewards: Tensor, mask: Tensor, values: Tensor | None, baselines: Tensor | None) -> None:
    if rewards.ndim != 2:
        raise ValueError(f"token_level_rewards must be [batch, tokens], got shape {tuple(rewards.shape)}")
    if mask.shape != rewards.shape:
        raise ValueError(f"response_mask {tuple(mask.shape)} must match token_level_rewards {tuple(rewards.shape)}")
    if values is not None and values.shape != rewards.shape:
        raise ValueError(f"values {tuple(values.shape)} must match token_level_rewards {tuple(rewards.shape)}")
    if baselines is not None and tuple(baselines.shape) not in ((rewards.shape[0],), (rewards.shape[0], 1)):
        raise ValueError(f"reward_baselines must be [batch] = [{rewards.shape[0]}], got {tuple(baselines.shape)}")


def _shapes(result: Any) -> str:
    if isinstance(result, tuple):
        return "(" + ", ".join(str(tuple(r.shape)) if isinstance(r, Tensor) else type(r).__name__ for r in result) + ")"
    return type(result).__name__
