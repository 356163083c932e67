"""megatron-core 0.16's distributed-optimizer checkpoints with torch's AdamW (no apex, no TransformerEngine).

Without apex or TransformerEngine megatron steps with `torch.optim.AdamW`, which keeps a per-parameter `step`
tensor. Loading a fully reshardable optimizer checkpoint then goes wrong twice in
`DistributedOptimizer._set_main_param_and_optimizer_states`:
1. it copies every state key of the live optimizer from the loaded tensors, which have no `step`: KeyError;
2. megatron restores `step` just before by putting one tensor object into every parameter's state, and AdamW
   increments `step` in place once per parameter, so after a load the parameters' bias corrections drift apart.
`apply()` replaces that method: the loaded keys are copied, and each parameter gets its own copy of `step`.
Applied only when megatron runs without apex/TransformerEngine (their fused Adam keeps no per-parameter step).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch


def _set_loaded_states(original: Callable) -> Callable:
    @functools.wraps(original)
    def set_states(self: Any, model_param: torch.Tensor, tensors: dict) -> None:
        if self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            return original(self, model_param, tensors)
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        state = self.optimizer.state[main_param]
        if isinstance(state.get("step"), torch.Tensor):
            state["step"] = state["step"].detach().clone()  # one step counter per parameter, as AdamW expects
        dst = {"param": main_param, **state}
        with torch.no_grad():
            for key, value in tensors.items():
                dst[key].copy_(value)

    set_states.__verl_fix__ = True
    return set_states


def needed() -> bool:
    from megatron.core.optimizer import distrib_optimizer

    return not distrib_optimizer.HAVE_APEX_OR_TE


def apply() -> bool:
    """Install the fix when megatron uses torch's AdamW; idempotent. Returns whether it is in effect."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    setter = DistributedOptimizer._set_main_param_and_optimizer_states
    if getattr(setter, "__verl_fix__", False):
        return True
    if not needed():
        return False
    DistributedOptimizer._set_main_param_and_optimizer_states = _set_loaded_states(setter)
    return True
