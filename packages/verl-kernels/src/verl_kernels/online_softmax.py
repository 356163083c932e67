"""Online softmax statistics: per-row partial states over slices of the vocabulary, merged exactly.

For one row and a slice of its (temperature-scaled) logits z_j, the partial state is

    m = max_j z_j,   s = sum_j exp(z_j - m),   t = sum_j exp(z_j - m) * (z_j - m),
    y = z_label if the label falls in the slice, else 0.

States of disjoint slices merge exactly (t is rebased to the common max), so vocabulary chunks, Triton programs
and tensor-parallel ranks all produce states that combine into

    logsumexp = m + log s,   entropy = -sum_j p_j log p_j = log s - t / s,   logprob = y - logsumexp.

The gradient of a loss L = sum_i g_i * logprob_i + e_i * entropy_i with respect to z_ij is

    dL/dz_ij = g_i * (1[j = label_i] - p_ij) - e_i * p_ij * (z_ij - logsumexp_i + entropy_i).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Partials(NamedTuple):
    m: torch.Tensor  # [N] max logit in the slice
    s: torch.Tensor  # [N] sum of exp(z - m)
    t: torch.Tensor  # [N] sum of exp(z - m) * (z - m)
    label_logit: torch.Tensor  # [N] z[label] where the label is in the slice, else 0


def _labels_in_block(local_labels: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rows have their label in [0, width), and a column index for every row ([n, 1], clamped into range).

    Masks rather than row lists: no data-dependent shapes, so no host-device synchronisation on a GPU.
    """
    inside = (local_labels >= 0) & (local_labels < width)
    return inside, local_labels.clamp(0, width - 1).unsqueeze(1)


def block_partials_(z: torch.Tensor, local_labels: torch.Tensor, scratch: torch.Tensor) -> Partials:
    """Partial state of a [n, v] logits block; `z` is overwritten, `scratch` (same shape) is workspace.

    `local_labels` are the labels minus the block's first vocabulary id (anything outside [0, v) is not here).
    """
    inside, cols = _labels_in_block(local_labels, z.shape[1])
    label_logit = torch.where(inside, z.gather(1, cols).squeeze(1), 0.0)
    m = z.amax(dim=1)
    z.sub_(m.unsqueeze(1))  # z - m <= 0: exp cannot overflow
    e = torch.exp(z, out=scratch)
    # In place with out= buffers: on CPU a fresh block-sized tensor per op costs more in page faults than the math.
    return Partials(m, e.sum(dim=1), torch.linalg.vecdot(e, z), label_logit)


def merge(a: Partials, b: Partials) -> Partials:
    """State of the union of two disjoint slices."""
    m = torch.maximum(a.m, b.m)
    wa, wb = torch.exp(a.m - m), torch.exp(b.m - m)
    s = wa * a.s + wb * b.s
    # sum exp(z - m)(z - m) over a's slice = wa * (t_a + s_a * (m_a - m))
    t = wa * (a.t + a.s * (a.m - m)) + wb * (b.t + b.s * (b.m - m))
    return Partials(m, s, t, a.label_logit + b.label_logit)


def merge_stacked(p: Partials) -> Partials:
    """Merge states stacked along dim 0 ([k, N] each) into one [N] state."""
    m = p.m.amax(dim=0)
    w = torch.exp(p.m - m)
    s = (w * p.s).sum(dim=0)
    t = (w * (p.t + p.s * (p.m - m))).sum(dim=0)
    return Partials(m, s, t, p.label_logit.sum(dim=0))


def finish(p: Partials, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprob, entropy, logsumexp) of full-vocabulary states; rows where `valid` is False get logprob 0, entropy 0."""
    log_s = torch.log(p.s)
    lse = p.m + log_s
    zero = torch.zeros((), dtype=lse.dtype, device=lse.device)
    logprob = torch.where(valid, p.label_logit - lse, zero)
    entropy = torch.where(valid, log_s - p.t / p.s, zero)
    return logprob, entropy, lse


def grad_logits_(
    z: torch.Tensor,
    local_labels: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    g_logprob: torch.Tensor,
    g_entropy: torch.Tensor | None,
    scratch: torch.Tensor,
) -> torch.Tensor:
    """dL/dz for a [n, v] logits block, written over `z` and returned; `scratch` (same shape) is workspace.

    Row vectors are [n]; `g_entropy` None means the loss does not depend on the entropy.
    """
    z.sub_(lse.unsqueeze(1))  # log p
    if g_entropy is None:
        z.exp_().mul_(-g_logprob.unsqueeze(1))  # -g p
    else:
        p = torch.exp(z, out=scratch)
        # -p * (g + e * (log p + entropy))
        z.add_(entropy.unsqueeze(1)).mul_(g_entropy.unsqueeze(1)).add_(g_logprob.unsqueeze(1)).mul_(p).neg_()
    inside, cols = _labels_in_block(local_labels, z.shape[1])
    z.scatter_add_(1, cols, torch.where(inside, g_logprob, 0.0).unsqueeze(1))
    return z
