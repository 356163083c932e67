"""Metric values as plain floats: what every logger receives."""

from __future__ import annotations

from numbers import Real
from typing import Any

import numpy as np
import torch

__all__ = ["to_float"]


def to_float(value: Any) -> float | None:
    """A Python float for a real scalar (int, float, bool, numpy scalar, one-element tensor/array), else None."""
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 and not value.is_complex() else None
    if isinstance(value, np.ndarray):
        return float(value.item()) if value.size == 1 and value.dtype.kind in "biuf" else None
    if isinstance(value, (Real, np.integer, np.floating, np.bool_)):
        return float(value)
    return None
