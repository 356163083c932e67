"""Learning-rate schedules: linear warmup, then constant or cosine decay to min_lr_ratio.

Engines apply it through `verl.engine_skeleton.set_lr` (from their step count)."""

from __future__ import annotations

import math


def lr_multiplier(step: int, *, warmup_steps: int, total_steps: int, scheduler: str, min_lr_ratio: float) -> float:
    """The factor applied to the base learning rate at optimizer step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if scheduler == "constant":
        return 1.0
    if scheduler == "cosine":
        decay_steps = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown scheduler '{scheduler}' (optim.scheduler): use constant or cosine")
