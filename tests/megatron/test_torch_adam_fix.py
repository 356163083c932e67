"""verl_megatron.torch_adam_fix: loading distributed-optimizer state into torch's AdamW."""

from __future__ import annotations

import types

import pytest
import torch


def _fake_optimizer(params):
    """What `_set_main_param_and_optimizer_states` reads of a DistributedOptimizer (one group)."""
    adam = torch.optim.AdamW(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    adam.step()  # state per parameter: step, exp_avg, exp_avg_sq
    return types.SimpleNamespace(
        config=types.SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=False),
        model_param_group_index_map={f"p{i}": (0, i) for i in range(len(params))},
        optimizer=adam,
    )


@pytest.fixture(scope="module")
def fixed():
    from verl_megatron import torch_adam_fix

    if not torch_adam_fix.needed():
        pytest.skip("megatron found apex or TransformerEngine: its fused Adam keeps no per-parameter step")
    assert torch_adam_fix.apply() is True and torch_adam_fix.apply() is True  # idempotent
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return DistributedOptimizer._set_main_param_and_optimizer_states


def test_loaded_keys_are_copied_and_step_is_left_alone(fixed):
    main = torch.nn.Parameter(torch.zeros(3))
    fake = _fake_optimizer([main])
    loaded = {"param": torch.full((3,), 2.0), "exp_avg": torch.full((3,), 3.0), "exp_avg_sq": torch.full((3,), 4.0)}
    fixed(fake, "p0", loaded)  # megatron's own version raises KeyError('step') here
    state = fake.optimizer.state[main]
    assert main.tolist() == [2.0] * 3
    assert state["exp_avg"].tolist() == [3.0] * 3 and state["exp_avg_sq"].tolist() == [4.0] * 3
    assert float(state["step"]) == 1.0


def test_each_parameter_gets_its_own_step_counter(fixed):
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    fake = _fake_optimizer([a, b])
    shared = torch.tensor(1.0)  # what megatron's load_state_dict puts into every parameter's state
    for p in (a, b):
        fake.optimizer.state[p]["step"] = shared
    for i in range(2):
        fixed(fake, f"p{i}", {"exp_avg": torch.zeros(2)})
    for p in (a, b):
        p.grad = torch.ones(2)
    fake.optimizer.step()  # AdamW increments each step in place: 1 -> 2 for both, not 1 -> 3 for a shared one
    assert [float(fake.optimizer.state[p]["step"]) for p in (a, b)] == [2.0, 2.0]
    assert float(shared) == 1.0
