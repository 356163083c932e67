"""Masked reductions and small helpers shared by the algorithms.

Reductions accumulate in float32 at least (float64 stays float64) and return that dtype: a bf16 sum of a
mask is exact only up to 256 tokens, and a bf16 mean of log-ratios loses the digits the clip range needs.
Masked-out entries never reach the result, even when they hold inf or NaN (padding log-probs often do).
An empty mask gives 0, not NaN, so a batch that lost all its tokens cannot poison a run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "acc_dtype",
    "accepted_kwargs",
    "config_value",
    "group_ids",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "zero_padding",
]


def acc_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype to compute in: the widest of the inputs' floating dtypes, at least float32."""
    dtype = torch.float32
    for t in tensors:
        if t.is_floating_point():
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _masked(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """values with masked-out entries set to 0 (inf/NaN there cannot leak), and the mask as weights."""
    dtype = acc_dtype(values)
    weights = mask.to(dtype)
    return torch.where(mask.bool(), values.to(dtype) * weights, torch.zeros((), dtype=dtype)), weights


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of values where mask is set (mask may hold weights), over `dim` or everything."""
    v, _ = _masked(values, mask)
    return v.sum() if dim is None else v.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of values where mask is set; 0 where the mask is empty."""
    v, w = _masked(values, mask)
    total, count = (v.sum(), w.sum()) if dim is None else (v.sum(dim=dim), w.sum(dim=dim))
    return total / count.clamp_min(torch.finfo(count.dtype).tiny)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of values where mask is set (over everything).

    With `unbiased`, Bessel's correction n/(n-1). Fewer than two elements give 0 (upstream verl raises
    there; a batch reduced to one token is no reason to stop a run, and its whitened value is then 0).
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values.to(mean.dtype) - mean) ** 2, mask)
    if unbiased:
        n = mask.to(mean.dtype).sum()
        var = var * torch.where(n > 1, n / (n - 1).clamp_min(1), torch.ones_like(n))
    return var


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(values - mean) / sqrt(var + eps) with mean and unbiased var over the masked entries.

    Every entry is transformed, as in verl (callers multiply by the mask to zero the padding).
    With shift_mean=False the mean is added back: only the scale changes.
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values.to(mean.dtype) - mean) * torch.rsqrt(var + eps)
    return whitened + mean if not shift_mean else whitened


def zero_padding(mask: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """The tensors in one compute dtype (float32 at least) with 0 wherever mask is not set.

    For loss inputs: padding often holds -inf/NaN log-probs, and a 0 there keeps NaN out of the backward pass
    too (0 * NaN is NaN even where the forward masked the value away); padding gets exactly zero gradient.
    """
    dtype = acc_dtype(*tensors)
    keep, zero = mask.bool(), torch.zeros((), dtype=dtype, device=tensors[0].device)
    return tuple(torch.where(keep, t.to(dtype), zero) for t in tensors)


def masked_max(values: Tensor, mask: Tensor) -> Tensor:
    """Largest value where mask is set; 0 when the mask is empty. (No boolean indexing: it would wait for the
    device to count the selected elements.)"""
    return _masked_extreme(values, mask, torch.amax, float("-inf"))


def masked_min(values: Tensor, mask: Tensor) -> Tensor:
    """Smallest value where mask is set; 0 when the mask is empty."""
    return _masked_extreme(values, mask, torch.amin, float("inf"))


def _masked_extreme(values: Tensor, mask: Tensor, reduce, fill: float) -> Tensor:
    keep = mask.bool().expand_as(values)
    v = values.to(acc_dtype(values))
    if v.numel() == 0:  # (a shape, known without the device)
        return v.new_zeros(())
    out = reduce(torch.where(keep, v, torch.full((), fill, dtype=v.dtype, device=v.device)))
    return torch.where(keep.any(), out, torch.zeros((), dtype=v.dtype, device=v.device))


def group_ids(index: Any, batch_size: int, *, name: str = "index") -> tuple[Tensor, int]:
    """Dense group numbers (0..G-1, in order of first appearance) for per-sample group labels.

    `index` holds one hashable label per sample (verl's uid strings, ints, ...): samples of a prompt share
    a label wherever they sit in the batch, so groups are found by label, never by position.
    """
    if isinstance(index, Tensor):
        labels: Sequence[Any] = index.detach().cpu().reshape(-1).tolist()
    elif isinstance(index, np.ndarray):
        labels = index.reshape(-1).tolist() if index.ndim > 1 else index.tolist()
    elif isinstance(index, (list, tuple)):
        labels = index
    else:
        raise TypeError(f"{name} must be an array of one group label per sample, got {type(index).__name__}")
    if len(labels) != batch_size:
        raise ValueError(
            f"{name} has {len(labels)} labels but the batch has {batch_size} samples; pass one label per sample"
        )
    numbers: dict[Any, int] = {}
    try:
        ids = [numbers.setdefault(label, len(numbers)) for label in labels]
    except TypeError as e:
        raise TypeError(f"{name} labels must be hashable (str or int uids): {e}") from None
    return torch.tensor(ids, dtype=torch.long), len(numbers)


def config_value(config: Any, name: str, default: Any = None) -> Any:
    """`config.name` for a dataclass, DictConfig or dict config; `default` when absent or config is None."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def accepted_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments `fn` can take: all of them if it has **kwargs, else those its signature names.

    Lets a user's function leave out inputs it does not use (a custom estimator without `values`).
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read: pass everything
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    named = {
        p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    return {k: v for k, v in kwargs.items() if k in named}
