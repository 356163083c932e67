"""Logging helpers: flat {name: float} dicts of policy and batch statistics, over response tokens only.

Names follow verl's ("actor/pg_clipfrac", "critic/advantages/mean", "response_length/mean", ...). Token
statistics use only tokens inside the mask; max/min of an empty selection is reported as 0.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from verl.algos.policy_losses import LOG_RATIO_CLAMP, clip_range
from verl.algos.utils import acc_dtype, masked_max, masked_mean, masked_min, masked_var

__all__ = ["compute_policy_metrics", "data_metrics", "ratio_stats", "rollout_mismatch_metrics", "token_stats"]


def token_stats(values: Tensor, mask: Tensor, prefix: str) -> dict[str, float]:
    """{prefix}mean / max / min over the tokens inside the mask."""
    return {
        f"{prefix}mean": float(masked_mean(values, mask)),
        f"{prefix}max": float(masked_max(values, mask)),
        f"{prefix}min": float(masked_min(values, mask)),
    }


def _seq_stats(per_seq: Tensor, prefix: str) -> dict[str, float]:
    per_seq = per_seq.to(acc_dtype(per_seq))
    stats = (per_seq.mean(), per_seq.max(), per_seq.min()) if per_seq.numel() else (0.0, 0.0, 0.0)
    return {f"{prefix}{name}": float(value) for name, value in zip(("mean", "max", "min"), stats)}  # type: ignore[arg-type]


def _log_ratio(old_log_prob: Tensor, log_prob: Tensor) -> Tensor:
    dtype = acc_dtype(old_log_prob, log_prob)
    return (log_prob.detach().to(dtype) - old_log_prob.detach().to(dtype)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def ratio_stats(
    old_log_prob: Tensor, log_prob: Tensor, response_mask: Tensor, prefix: str = "actor/"
) -> dict[str, float]:
    """Mean / max / min of the importance ratio pi / pi_old over response tokens."""
    return token_stats(_log_ratio(old_log_prob, log_prob).exp(), response_mask, f"{prefix}ratio/")


def compute_policy_metrics(
    old_log_prob: Tensor,
    log_prob: Tensor,
    response_mask: Tensor,
    *,
    advantages: Tensor | None = None,
    config: Any = None,
    prefix: str = "actor/",
) -> dict[str, float]:
    """How far the policy moved from pi_old on response tokens.

    approx_kl: mean of log pi_old - log pi (k1 estimate of KL(pi_old || pi)); approx_kl_k3: mean of
    r - 1 - log r with r = pi / pi_old (non-negative, low variance). clipfrac: with advantages, the tokens
    where PPO's clip binds (A > 0 and r > 1 + high, or A < 0 and r < 1 - low); without, the tokens whose
    ratio lies outside [1 - low, 1 + high]. Clip bounds come from the actor config.
    """
    low, high = clip_range(config)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = log_ratio.exp()
    above, below = ratio > 1 + high, ratio < 1 - low
    if advantages is not None:
        adv = advantages.detach()
        clipped = (above & (adv > 0)) | (below & (adv < 0))
    else:
        clipped = above | below
    return {
        f"{prefix}approx_kl": float(masked_mean(-log_ratio, response_mask)),
        f"{prefix}approx_kl_k3": float(masked_mean(ratio - 1 - log_ratio, response_mask)),
        f"{prefix}clipfrac": float(masked_mean(clipped.to(ratio.dtype), response_mask)),
        **token_stats(ratio, response_mask, f"{prefix}ratio/"),
    }


def data_metrics(
    *,
    response_mask: Tensor,
    token_level_scores: Tensor | None = None,
    token_level_rewards: Tensor | None = None,
    advantages: Tensor | None = None,
    returns: Tensor | None = None,
    values: Tensor | None = None,
    max_response_length: int | None = None,
) -> dict[str, float]:
    """Batch statistics for logging: scores and rewards per sequence, advantages/returns/values per token,
    the critic's explained variance, and response lengths (clip_ratio: share that hit max_response_length).
    """
    out: dict[str, float] = {}
    if token_level_scores is not None:
        out.update(_seq_stats(token_level_scores.detach().sum(dim=-1), "critic/score/"))
    if token_level_rewards is not None:
        out.update(_seq_stats(token_level_rewards.detach().sum(dim=-1), "critic/rewards/"))
    for name, t in (("advantages", advantages), ("returns", returns), ("values", values)):
        if t is not None:
            out.update(token_stats(t.detach(), response_mask, f"critic/{name}/"))
    if returns is not None and values is not None:
        dtype = acc_dtype(returns, values)
        ret, val = returns.detach().to(dtype), values.detach().to(dtype)
        explained = 1.0 - masked_var(ret - val, response_mask) / (masked_var(ret, response_mask) + 1e-5)
        out["critic/vf_explained_var"] = float(explained)
    lengths = response_mask.to(torch.float32).sum(dim=-1)
    out.update(_seq_stats(lengths, "response_length/"))
    if max_response_length is not None:
        hit = (lengths >= max_response_length).to(torch.float32)
        out["response_length/clip_ratio"] = float(hit.mean()) if hit.numel() else 0.0
    return out


def rollout_mismatch_metrics(
    old_log_prob: Tensor, rollout_log_probs: Tensor, response_mask: Tensor
) -> dict[str, Tensor]:
    """How far the rollout engine's log-probs are from the trainer's on the generated tokens, as 0-d tensors on
    their device (an update's micro-batch loop reads them back once, with its other metrics).

    rollout/logprob_diff_max and _mean: |log pi_old - log pi_rollout| over masked tokens (numerics, kernels and
    precision differ between engines; a large value means the rollout samples from another policy).
    rollout/prob_ratio_max: max pi_old/pi_rollout, what a truncated importance-sampling cap would clip."""
    dtype = acc_dtype(old_log_prob, rollout_log_probs)
    diff = old_log_prob.detach().to(dtype) - rollout_log_probs.detach().to(dtype)
    return {
        "rollout/logprob_diff_max": masked_max(diff.abs(), response_mask),
        "rollout/logprob_diff_mean": masked_mean(diff.abs(), response_mask),
        "rollout/prob_ratio_max": masked_max(diff.clamp(max=LOG_RATIO_CLAMP).exp(), response_mask),
    }
