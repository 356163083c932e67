"""Policy losses: the actor's surrogate objective from old and new log-probs and advantages.

Every loss has the signature

    fn(old_log_prob [B, T], log_prob [B, T], advantages [B, T], response_mask [B, T], *,
       loss_agg_mode, config, rollout_log_probs=None) -> (loss 0-dim, metrics {name: 0-dim tensor})

`config` is the actor config (clip_ratio, clip_ratio_low/high, clip_ratio_c, tis_imp_ratio_cap,
loss_norm_length). Metrics are detached 0-dim tensors (no device sync per micro-batch): pg_clipfrac,
pg_clipfrac_lower, ppo_kl, plus tis_weight_mean and tis_clipfrac when truncated importance sampling is on.
Losses compute in float32 at least; the gradient flows back to `log_prob` in its own dtype.

Truncated importance sampling (TIS): the rollout engine samples with slightly different numerics than the
trainer, so tokens were drawn from pi_rollout, not pi_old. With `config.tis_imp_ratio_cap` set and
`rollout_log_probs` given, every per-token loss is weighted by min(pi_old / pi_rollout, cap), detached.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from verl.algos.aggregation import agg_loss
from verl.algos.utils import acc_dtype, accepted_kwargs, config_value, masked_mean, zero_padding
from verl.registry import Registry

__all__ = ["POLICY_LOSSES", "clip_range", "compute_policy_loss", "entropy_loss", "truncated_is_weights"]

POLICY_LOSSES = Registry(
    "policy loss",
    args=("old_log_prob", "log_prob", "advantages", "response_mask"),
    offered=("loss_agg_mode", "config", "rollout_log_probs"),
)

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: a larger log-ratio is a bug upstream, not a signal (as in verl)


def clip_range(config: Any) -> tuple[float, float]:
    """(low, high): the ratio is clipped to [1 - low, 1 + high]; each defaults to config.clip_ratio."""
    clip = config_value(config, "clip_ratio", 0.2)
    low = config_value(config, "clip_ratio_low", None)
    high = config_value(config, "clip_ratio_high", None)
    low, high = (clip if low is None else low), (clip if high is None else high)
    if not 0 <= low < 1:
        raise ValueError(f"actor.clip_ratio_low (or clip_ratio) must be in [0, 1), got {low}")
    if high < 0:
        raise ValueError(f"actor.clip_ratio_high (or clip_ratio) must be >= 0, got {high}")
    return float(low), float(high)


def truncated_is_weights(old_log_prob: Tensor, rollout_log_probs: Tensor, cap: float) -> Tensor:
    """min(pi_old / pi_rollout, cap) per token, detached: the trainer-vs-rollout mismatch correction."""
    if cap <= 0:
        raise ValueError(f"actor.tis_imp_ratio_cap must be > 0, got {cap}")
    dtype = acc_dtype(old_log_prob, rollout_log_probs)
    log_w = (old_log_prob.to(dtype) - rollout_log_probs.to(dtype)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return log_w.exp().clamp(max=cap).detach()


def _clipped_surrogate(adv: Tensor, ratio: Tensor, config: Any, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """PPO's max(-A r, -A clip(r, 1-low, 1+high)) per token, and pg_clipfrac: the share where the clipped term wins."""
    low, high = clip_range(config)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1 - low, 1 + high)
    clipfrac = masked_mean((loss_clipped > loss_unclipped).to(ratio.dtype), response_mask)
    return torch.maximum(loss_unclipped, loss_clipped), clipfrac


def _finish(
    pg_losses: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str,
    config: Any,
    old_log_prob: Tensor,
    rollout_log_probs: Tensor | None,
    metrics: dict[str, Tensor],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Apply truncated importance sampling when configured, then aggregate."""
    cap = config_value(config, "tis_imp_ratio_cap", None)
    if cap is not None and rollout_log_probs is not None:
        old, rollout = zero_padding(response_mask, old_log_prob, rollout_log_probs)
        weights = truncated_is_weights(old, rollout, cap)
        pg_losses = pg_losses * weights
        metrics["tis_weight_mean"] = masked_mean(weights, response_mask)
        metrics["tis_clipfrac"] = masked_mean((weights >= cap).to(weights.dtype), response_mask)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, norm_length=config_value(config, "loss_norm_length", None))
    return loss, {k: v.detach() for k, v in metrics.items()}


@POLICY_LOSSES.register("vanilla", aliases=("dual_clip",))
def ppo_clip(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip with separate low/high bounds (DAPO clip-higher) and dual-clip for negative advantages.

    L = max(-A r, -A clip(r, 1-low, 1+high)); where A < 0 it is further capped at -A c (c = clip_ratio_c > 1),
    so a huge ratio on a bad token cannot produce an unbounded loss.
    pg_clipfrac: tokens where the clipped term wins; pg_clipfrac_lower: tokens where the dual clip binds.
    """
    c = float(config_value(config, "clip_ratio_c", 3.0))
    if c <= 1.0:
        raise ValueError(f"actor.clip_ratio_c (the dual-clip bound) must be > 1, got {c}")
    lp, old, adv = zero_padding(response_mask, log_prob, old_log_prob, advantages)
    log_ratio = (lp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    clip_loss, clipfrac = _clipped_surrogate(adv, log_ratio.exp(), config, response_mask)
    loss_dual = -adv * c
    pg_losses = torch.where(adv < 0, torch.minimum(clip_loss, loss_dual), clip_loss)
    metrics = {
        "pg_clipfrac": clipfrac,
        "pg_clipfrac_lower": masked_mean(((clip_loss > loss_dual) & (adv < 0)).to(lp.dtype), response_mask),
        "ppo_kl": masked_mean(-log_ratio, response_mask),
    }
    return _finish(pg_losses, response_mask, loss_agg_mode, config, old_log_prob, rollout_log_probs, metrics)


@POLICY_LOSSES.register("gspo")
def gspo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: PPO clip on the sequence-level ratio s_i = exp(mean_t log(pi/pi_old)) (the length-normalised ratio).

    Per token, s_it = sg(s_i) * pi_t / sg(pi_t): its value is s_i and its gradient is s_i * grad log pi_t,
    so with loss_agg_mode=seq-mean-token-mean the gradient is exactly that of the sequence objective
    mean_i max(-A_i s_i, -A_i clip(s_i)). verl forces that mode inside the loss; we use the configured one
    (config validation warns when it is not seq-mean-token-mean) so that no setting is silently ignored.
    """
    lp, old, adv = zero_padding(response_mask, log_prob, old_log_prob, advantages)
    token_log_ratio = lp - old  # 0 on padding
    lengths = response_mask.to(lp.dtype).sum(dim=-1).clamp_min(1)
    seq_log_ratio = token_log_ratio.sum(dim=-1) / lengths
    log_s = (lp - lp.detach() + seq_log_ratio.detach().unsqueeze(-1)).clamp(max=10.0)  # as verl, for stability
    pg_losses, clipfrac = _clipped_surrogate(adv, log_s.exp(), config, response_mask)
    metrics = {
        "pg_clipfrac": clipfrac,
        "pg_clipfrac_lower": torch.zeros((), dtype=lp.dtype, device=lp.device),
        "ppo_kl": masked_mean(-token_log_ratio, response_mask),
    }
    return _finish(pg_losses, response_mask, loss_agg_mode, config, old_log_prob, rollout_log_probs, metrics)


@POLICY_LOSSES.register("cispo")
def cispo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: L = -sg(clip(r, 1-low, 1+high)) * A * log pi. The importance weight is clipped, not the update.

    Unlike PPO, a token whose ratio left the clip range keeps its gradient (A * clip(r) * grad log pi); only
    its weight is bounded. pg_clipfrac / pg_clipfrac_lower: tokens whose weight was cut from above / below.
    """
    low, high = clip_range(config)
    lp, old, adv = zero_padding(response_mask, log_prob, old_log_prob, advantages)
    dtype = lp.dtype
    log_ratio = (lp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1 - low, 1 + high).detach()
    pg_losses = -weight * adv * lp
    metrics = {
        "pg_clipfrac": masked_mean((ratio > 1 + high).to(dtype), response_mask),
        "pg_clipfrac_lower": masked_mean((ratio < 1 - low).to(dtype), response_mask),
        "ppo_kl": masked_mean(-log_ratio, response_mask),
    }
    return _finish(pg_losses, response_mask, loss_agg_mode, config, old_log_prob, rollout_log_probs, metrics)


def compute_policy_loss(
    name_or_spec: Any,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str,
    config: Any,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """Run the policy loss `name_or_spec` selects (a name, a `_target_` mapping or a callable)."""
    fn = POLICY_LOSSES.get(name_or_spec, key="actor.policy_loss")
    label = name_or_spec if isinstance(name_or_spec, str) else getattr(fn, "__name__", repr(fn))
    shapes = {
        "old_log_prob": old_log_prob,
        "log_prob": log_prob,
        "advantages": advantages,
        "response_mask": response_mask,
        "rollout_log_probs": rollout_log_probs,
    }
    for name, t in shapes.items():
        if t is not None and (t.ndim != 2 or t.shape != log_prob.shape):
            raise ValueError(
                f"policy loss '{label}': {name} must be [batch, tokens] like log_prob {tuple(log_prob.shape)}, "
                f"got {tuple(t.shape)}"
            )
    kwargs = {"loss_agg_mode": loss_agg_mode, "config": config, "rollout_log_probs": rollout_log_probs}
    result = fn(old_log_prob, log_prob, advantages, response_mask, **accepted_kwargs(fn, kwargs))
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Tensor) and result[0].ndim == 0):
        raise TypeError(
            f"policy loss '{label}' must return (loss 0-dim tensor, metrics dict), got {type(result).__name__}"
        )
    if not isinstance(result[1], dict):
        raise TypeError(f"policy loss '{label}' must return its metrics as a dict, got {type(result[1]).__name__}")
    return result


def entropy_loss(
    entropy: Tensor, response_mask: Tensor, loss_agg_mode: str, *, norm_length: int | None = None
) -> Tensor:
    """The aggregated token entropy: the bonus the trainer subtracts from the loss, times actor.entropy_coeff."""
    return agg_loss(entropy, response_mask, loss_agg_mode, norm_length=norm_length)
