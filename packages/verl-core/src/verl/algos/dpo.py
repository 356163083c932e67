"""DPO-family preference losses on sequence log-probs of chosen/rejected responses, against a reference model.

With h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l)) per pair:

    sigmoid (DPO)  -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)   (eps: label smoothing, cDPO)
    ipo            (h - 1 / (2 beta))^2

Inputs are [B] sequence log-probs (token log-probs summed over each response); the loss is the batch mean.
A loss kind is a DPO_LOSSES entry: fn(h [B], *, beta, label_smoothing) -> per-pair losses [B].

nll_weight alpha > 0 adds alpha * NLL(y_w) / |y_w|, the chosen response's per-token negative log-likelihood (RPO,
Pang et al. 2024, arXiv:2404.19733; TRL's rpo_alpha). The preference term alone only widens the margin, and on
pairs that share most tokens (a right answer against a near miss) it lowers the chosen response's likelihood too;
the NLL term holds it up.
"""

from __future__ import annotations

from typing import Any, Optional

import torch.nn.functional as F
from torch import Tensor

from verl.algos.utils import acc_dtype
from verl.registry import Registry

__all__ = ["DPO_LOSSES", "dpo_loss"]

DPO_LOSSES = Registry("DPO loss", args=("logits",), always=("beta", "label_smoothing"))


@DPO_LOSSES.register("sigmoid", aliases=("dpo",))
def sigmoid_loss(h: Tensor, *, beta: float, label_smoothing: float) -> Tensor:
    return -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)


@DPO_LOSSES.register("ipo")
def ipo_loss(h: Tensor, *, beta: float, label_smoothing: float) -> Tensor:
    if label_smoothing:
        raise ValueError(f"the ipo loss has no label smoothing; got label_smoothing={label_smoothing}, set it to 0")
    return (h - 1 / (2 * beta)) ** 2


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float,
    kind: Any = "sigmoid",
    label_smoothing: float = 0.0,
    nll_weight: float = 0.0,
    chosen_lengths: Optional[Tensor] = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean preference loss and metrics: rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins
    (and nll_loss, the chosen responses' mean per-token NLL, when nll_weight > 0).

    The implicit rewards are beta * (log pi - log pi_ref) of each response, detached. chosen_lengths [B]: the
    chosen responses' token counts, which nll_weight > 0 needs.
    """
    inputs = {
        "policy_chosen_logps": policy_chosen_logps,
        "policy_rejected_logps": policy_rejected_logps,
        "ref_chosen_logps": ref_chosen_logps,
        "ref_rejected_logps": ref_rejected_logps,
    }
    for name, t in inputs.items():
        if t.ndim != 1 or t.shape != policy_chosen_logps.shape:
            raise ValueError(
                f"dpo_loss takes one sequence log-prob per pair, shape [batch]; {name} has {tuple(t.shape)}, "
                f"policy_chosen_logps {tuple(policy_chosen_logps.shape)}"
            )
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if nll_weight < 0:
        raise ValueError(f"nll_weight must be >= 0, got {nll_weight}")
    if nll_weight and (chosen_lengths is None or chosen_lengths.shape != policy_chosen_logps.shape):
        got = None if chosen_lengths is None else tuple(chosen_lengths.shape)
        raise ValueError(
            f"nll_weight > 0 needs chosen_lengths, one token count per pair of shape "
            f"{tuple(policy_chosen_logps.shape)}; got {got}"
        )
    dtype = acc_dtype(*inputs.values())
    chosen = policy_chosen_logps.to(dtype) - ref_chosen_logps.to(dtype)
    rejected = policy_rejected_logps.to(dtype) - ref_rejected_logps.to(dtype)
    fn = DPO_LOSSES.get(kind, key="kind")
    loss = fn(chosen - rejected, beta=beta, label_smoothing=label_smoothing).mean()
    chosen_rewards, rejected_rewards = (beta * chosen).detach(), (beta * rejected).detach()
    metrics = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).to(dtype).mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
    }
    if nll_weight:
        assert chosen_lengths is not None  # (checked above)
        nll = (-policy_chosen_logps.to(dtype) / chosen_lengths.to(dtype).clamp(min=1)).mean()
        loss = loss + nll_weight * nll
        metrics["nll_loss"] = nll.detach()
    return loss, metrics
