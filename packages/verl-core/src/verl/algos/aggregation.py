"""Loss aggregation: how a per-token loss matrix [B, T] becomes the scalar that is backpropagated.

    token-mean               sum of all token losses / number of tokens          (DAPO; long answers weigh more)
    seq-mean-token-mean      mean over sequences of each sequence's token mean   (GRPO paper; GSPO)
    seq-mean-token-sum       mean over sequences of each sequence's token sum
    seq-mean-token-sum-norm  mean over sequences of token sum / H, H a constant  (Dr.GRPO: no length bias)

The seq-mean modes divide by the number of rows B, so a row without tokens counts as a zero-loss sequence
and every sequence of a micro-batch weighs 1/B (as verl does with its local batch size). H is `norm_length`
or, when not given, the padded response length T; keep it constant across steps (data.max_response_length)
to reproduce Dr.GRPO. verl's older `seq-mean-token-sum-norm` returned sum/H without dividing by B; we divide,
so the modes agree with each other when every sequence has length H.
"""

from __future__ import annotations

from torch import Tensor

from verl.algos.utils import masked_mean, masked_sum
from verl.registry import Registry

__all__ = ["AGG_MODES", "agg_loss"]

AGG_MODES = Registry("loss aggregation mode", args=("loss_mat", "loss_mask"), always=("norm_length",))


def _seq_mean(per_seq: Tensor) -> Tensor:
    return per_seq.sum() / max(per_seq.shape[0], 1)  # an empty batch gives 0, not NaN


@AGG_MODES.register("token-mean")
def token_mean(loss_mat: Tensor, loss_mask: Tensor, *, norm_length: int | None = None) -> Tensor:
    return masked_mean(loss_mat, loss_mask)


@AGG_MODES.register("seq-mean-token-mean")
def seq_mean_token_mean(loss_mat: Tensor, loss_mask: Tensor, *, norm_length: int | None = None) -> Tensor:
    return _seq_mean(masked_mean(loss_mat, loss_mask, dim=-1))


@AGG_MODES.register("seq-mean-token-sum")
def seq_mean_token_sum(loss_mat: Tensor, loss_mask: Tensor, *, norm_length: int | None = None) -> Tensor:
    return _seq_mean(masked_sum(loss_mat, loss_mask, dim=-1))


@AGG_MODES.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss_mat: Tensor, loss_mask: Tensor, *, norm_length: int | None = None) -> Tensor:
    horizon = norm_length if norm_length is not None else loss_mask.shape[-1]
    return _seq_mean(masked_sum(loss_mat, loss_mask, dim=-1) / max(horizon, 1))


def agg_loss(loss_mat: Tensor, loss_mask: Tensor, loss_agg_mode: str, *, norm_length: int | None = None) -> Tensor:
    """The scalar loss for a [B, T] per-token loss and its [B, T] mask, by `loss_agg_mode` (an AGG_MODES entry).

    norm_length: the constant H of seq-mean-token-sum-norm (default: T). Computed in float32 at least.
    """
    if loss_mat.ndim != 2 or loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"agg_loss takes loss_mat and loss_mask of the same shape [batch, tokens]; "
            f"got loss_mat {tuple(loss_mat.shape)} and loss_mask {tuple(loss_mask.shape)}"
        )
    if norm_length is not None and (
        isinstance(norm_length, bool) or not isinstance(norm_length, int) or norm_length < 1
    ):
        raise ValueError(f"norm_length must be a positive integer (the Dr.GRPO horizon), got {norm_length!r}")
    fn = AGG_MODES.get(loss_agg_mode, key="loss_agg_mode")
    loss = fn(loss_mat, loss_mask, norm_length=norm_length)
    if not isinstance(loss, Tensor) or loss.ndim != 0:
        raise TypeError(f"loss aggregation mode {loss_agg_mode!r} must return a 0-dim tensor, got {loss!r}")
    return loss
