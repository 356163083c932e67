"""DPO-family losses against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from verl.algos import dpo_loss

F64 = torch.float64


def pair(pc, pr, rc, rr):
    return [torch.tensor(v, dtype=F64) for v in (pc, pr, rc, rr)]


def test_sigmoid_dpo_by_hand():
    # chosen: -1 - (-1.5) = 0.5; rejected: -2 - (-1.5) = -0.5; h = 1; beta = 0.1 -> logit 0.1
    loss, metrics = dpo_loss(*pair([-1.0], [-2.0], [-1.5], [-1.5]), beta=0.1)
    assert float(loss) == pytest.approx(math.log1p(math.exp(-0.1)))  # -log sigmoid(0.1) = 0.644397
    assert float(metrics["rewards/chosen"]) == pytest.approx(0.05)
    assert float(metrics["rewards/rejected"]) == pytest.approx(-0.05)
    assert float(metrics["rewards/accuracies"]) == 1.0
    assert float(metrics["rewards/margins"]) == pytest.approx(0.1)


def test_label_smoothing_by_hand():
    # 0.9 * -log sigmoid(0.1) + 0.1 * -log sigmoid(-0.1)
    loss, _ = dpo_loss(*pair([-1.0], [-2.0], [-1.5], [-1.5]), beta=0.1, label_smoothing=0.1)
    assert float(loss) == pytest.approx(0.9 * math.log1p(math.exp(-0.1)) + 0.1 * math.log1p(math.exp(0.1)))


def test_ipo_by_hand():
    # (h - 1/(2 beta))^2 = (1 - 5)^2
    loss, _ = dpo_loss(*pair([-1.0], [-2.0], [-1.5], [-1.5]), beta=0.1, kind="ipo")
    assert float(loss) == pytest.approx(16.0)


def test_batch_mean_and_accuracy():
    # pair 1 as above (h = 1); pair 2 reversed (h = -1)
    loss, metrics = dpo_loss(*pair([-1.0, -2.0], [-2.0, -1.0], [-1.5, -1.5], [-1.5, -1.5]), beta=1.0)
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0))) / 2
    assert float(loss) == pytest.approx(expected)
    assert float(metrics["rewards/accuracies"]) == 0.5
    assert float(metrics["rewards/margins"]) == pytest.approx(0.0)


def test_gradient_pushes_chosen_up_and_rejected_down():
    pc, pr, rc, rr = pair([-1.0], [-2.0], [-1.5], [-1.5])
    pc.requires_grad_(), pr.requires_grad_()
    loss, _ = dpo_loss(pc, pr, rc, rr, beta=0.1)
    loss.backward()
    # d/dpc -log sigmoid(beta h) = -beta sigmoid(-beta h) = -0.1 * sigmoid(-0.1)
    g = 0.1 / (1 + math.exp(0.1))
    assert float(pc.grad) == pytest.approx(-g) and float(pr.grad) == pytest.approx(g)


def test_nll_term_by_hand():
    # RPO: the DPO loss + alpha * (-log pi(y_w) / |y_w|) averaged over pairs; chosen log-probs -1 (2 tokens), -3 (3)
    pc, pr, rc, rr = pair([-1.0, -3.0], [-2.0, -4.0], [-1.5, -3.5], [-1.5, -3.5])
    pc.requires_grad_()
    lengths = torch.tensor([2, 3])
    loss, metrics = dpo_loss(pc, pr, rc, rr, beta=0.1, nll_weight=0.5, chosen_lengths=lengths)
    plain, _ = dpo_loss(pc.detach(), pr, rc, rr, beta=0.1)
    nll = (1.0 / 2 + 3.0 / 3) / 2
    assert float(metrics["nll_loss"]) == pytest.approx(nll)
    assert float(loss.detach()) == pytest.approx(float(plain) + 0.5 * nll)
    loss.backward()
    # each chosen log-prob gets the DPO pull (-beta sigmoid(-beta h) / 2 pairs) and the NLL's -alpha / (|y_w| 2 pairs)
    g = 0.1 / (1 + math.exp(0.1)) / 2
    assert pc.grad.tolist() == pytest.approx([-g - 0.5 / 2 / 2, -g - 0.5 / 3 / 2])


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="ref_rejected_logps"):
        dpo_loss(*pair([-1.0], [-2.0], [-1.5], [-1.5, 0.0]), beta=0.1)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(*pair([-1.0], [-2.0], [-1.5], [-1.5]), beta=0.0)
    with pytest.raises(ValueError, match="no label smoothing"):
        dpo_loss(*pair([-1.0], [-2.0], [-1.5], [-1.5]), beta=0.1, kind="ipo", label_smoothing=0.1)
    with pytest.raises(KeyError, match="did you mean 'ipo'"):
        dpo_loss(*pair([-1.0], [-2.0], [-1.5], [-1.5]), beta=0.1, kind="ippo")
    with pytest.raises(ValueError, match="needs chosen_lengths"):
        dpo_loss(*pair([-1.0], [-2.0], [-1.5], [-1.5]), beta=0.1, nll_weight=1.0)
    with pytest.raises(ValueError, match="nll_weight must be >= 0"):
        dpo_loss(*pair([-1.0], [-2.0], [-1.5], [-1.5]), beta=0.1, nll_weight=-1.0)
