"""The losses the actor and critic minimise, assembled from the algorithm registries in `verl.algos`."""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from verl.algos import agg_loss, compute_policy_loss, compute_value_loss, kl_penalty, rollout_mismatch_metrics
from verl.algos.dpo import dpo_loss
from verl.engine_protocol import LossFn
from verl.protocol import DataProto


def _metric(v):
    """A metric as the engines' Accumulator takes it: a detached tensor (read back once per step) or a float."""
    return v.detach() if isinstance(v, torch.Tensor) else float(v)


def actor_loss_fn(actor_cfg) -> LossFn:
    """policy loss - entropy_coeff * entropy + kl_loss_coef * KL(actor || reference) on response tokens."""

    def loss_fn(out: Dict[str, torch.Tensor], mb: DataProto) -> Tuple[torch.Tensor, Dict[str, float]]:
        b = mb.batch
        log_prob = out["log_probs"]
        mask = b["response_mask"].to(log_prob.device)
        metrics: Dict[str, float] = {}
        if "old_log_probs" in b.keys():
            old_log_prob = b["old_log_probs"]
        else:  # an on-policy update (the plan): this forward is the policy the samples were scored under
            old_log_prob = log_prob.detach()
            if "rollout_log_probs" in b.keys():  # the mismatch the trainer measures otherwise (mean over micro-batches)
                mismatch = rollout_mismatch_metrics(old_log_prob, b["rollout_log_probs"].to(log_prob.device), mask)
                metrics.update(mismatch)  # type: ignore[arg-type]  # (0-d tensors: the engines average them)
        pg_loss, pg_metrics = compute_policy_loss(
            actor_cfg.policy_loss,
            old_log_prob,
            log_prob,
            b["advantages"],
            mask,
            loss_agg_mode=actor_cfg.loss_agg_mode,
            config=actor_cfg,
            rollout_log_probs=b.get("rollout_log_probs"),
        )
        loss = pg_loss
        metrics.update({"pg_loss": _metric(pg_loss), **{k: _metric(v) for k, v in pg_metrics.items()}})
        if "entropy" in out:
            entropy = agg_loss(out["entropy"], mask, actor_cfg.loss_agg_mode)
            metrics["entropy"] = _metric(entropy)
            if actor_cfg.entropy_coeff:
                loss = loss - actor_cfg.entropy_coeff * entropy
        if actor_cfg.use_kl_loss:
            kl = agg_loss(
                kl_penalty(log_prob, b["ref_log_probs"], actor_cfg.kl_loss_type), mask, actor_cfg.loss_agg_mode
            )
            loss = loss + actor_cfg.kl_loss_coef * kl
            metrics["kl_loss"] = _metric(kl)
        return loss, metrics

    loss_fn.weight_by = weight_by(actor_cfg.loss_agg_mode)  # type: ignore[attr-defined]  # (read by the engines)
    return loss_fn


def sft_loss(out: Dict[str, torch.Tensor], mb: DataProto) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Supervised fine-tuning: the token-mean negative log-likelihood of the tokens the response mask marks."""
    mask = mb.batch["response_mask"].to(out["log_probs"].dtype)
    loss = -(out["log_probs"] * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"loss": _metric(loss)}


sft_loss.weight_by = "tokens"  # type: ignore[attr-defined]  # a token mean: micro-batches weigh their tokens (engine_skeleton.Accumulator)


def preference_loss_fn(dpo_cfg) -> LossFn:
    """The DPO-family loss (algorithm.dpo) of each (chosen, rejected) row pair in the micro-batch: rows 2i and 2i+1,
    their summed response log-probs against the reference's (`ref_seq_log_probs`)."""

    def loss_fn(out: Dict[str, torch.Tensor], mb: DataProto) -> Tuple[torch.Tensor, Dict[str, float]]:
        b = mb.batch
        log_prob = out["log_probs"]
        mask = b["response_mask"].to(log_prob)
        seq = (log_prob * mask).sum(-1)
        ref = b["ref_seq_log_probs"].to(seq.device)
        if len(seq) % 2 or not bool(b["is_chosen"][0::2].all()) or bool(b["is_chosen"][1::2].any()):
            raise ValueError("a DPO micro-batch must hold whole (chosen, rejected) pairs, chosen first")
        loss, metrics = dpo_loss(
            seq[0::2],
            seq[1::2],
            ref[0::2],
            ref[1::2],
            beta=dpo_cfg.beta,
            kind=dpo_cfg.loss,
            label_smoothing=dpo_cfg.label_smoothing,
            nll_weight=dpo_cfg.nll_weight,
            chosen_lengths=mask[0::2].sum(-1),
        )
        preference = loss.detach() - dpo_cfg.nll_weight * metrics["nll_loss"] if "nll_loss" in metrics else loss
        metrics = {f"dpo/{k.replace('rewards/', 'reward_')}": _metric(v) for k, v in metrics.items()}
        return loss, {"dpo_loss": _metric(preference), **metrics}  # (dpo_loss: the preference term alone)

    loss_fn.weight_by = "rows"  # type: ignore[attr-defined]  # a mean over pairs: micro-batches weigh their rows
    return loss_fn


def weight_by(loss_agg_mode) -> str:
    """How an engine weighs micro-batches for this aggregation (engine_skeleton.Accumulator): token-mean averages
    over the batch's tokens, every other mode over its rows."""
    return "tokens" if loss_agg_mode == "token-mean" else "rows"


def critic_loss_fn(critic_cfg) -> LossFn:
    """Clipped value loss against the returns."""

    def loss_fn(out: Dict[str, torch.Tensor], mb: DataProto) -> Tuple[torch.Tensor, Dict[str, float]]:
        b = mb.batch
        loss, metrics = compute_value_loss(
            out["values"],
            b["returns"],
            b["values"],
            b["response_mask"],
            cliprange_value=critic_cfg.cliprange_value,
            loss_agg_mode=critic_cfg.loss_agg_mode,
        )
        return loss, {"vf_loss": _metric(loss), **{k: _metric(v) for k, v in metrics.items()}}

    loss_fn.weight_by = weight_by(critic_cfg.loss_agg_mode)  # type: ignore[attr-defined]
    return loss_fn
