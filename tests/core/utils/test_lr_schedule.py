"""LR schedule multipliers against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from verl.config.schema import OptimConfig
from verl.engine_protocol import EngineConfig
from verl.engine_skeleton import set_lr
from verl.utils.lr_schedule import lr_multiplier


def test_warmup_then_constant():
    m = [lr_multiplier(s, warmup_steps=4, total_steps=10, scheduler="constant", min_lr_ratio=0.0) for s in range(6)]
    assert m == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_with_floor():
    # warmup 2, then cosine over 8 steps from 1.0 to 0.1: step 2 -> 1.0, step 6 (halfway) -> 0.55, step 10 -> 0.1
    f = lambda s: lr_multiplier(s, warmup_steps=2, total_steps=10, scheduler="cosine", min_lr_ratio=0.1)  # noqa: E731
    assert f(2) == pytest.approx(1.0)
    assert f(6) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(6) == pytest.approx(0.55)
    assert f(10) == pytest.approx(0.1)
    assert f(50) == pytest.approx(0.1)  # past the end it stays at the floor


def test_unknown_scheduler_names_the_key():
    with pytest.raises(ValueError, match="optim.scheduler"):
        lr_multiplier(5, warmup_steps=0, total_steps=10, scheduler="linear", min_lr_ratio=0.0)


def test_set_lr_drives_the_optimizer_from_the_step_count():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.4)
    cfg = EngineConfig(model_path="m", optim=OptimConfig(lr=0.4, warmup_steps=2, scheduler="constant"), total_steps=5)
    seen = []
    for step in range(3):
        assert set_lr(opt, cfg, step) == opt.param_groups[0]["lr"]
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
    assert seen == pytest.approx([0.2, 0.4, 0.4])
