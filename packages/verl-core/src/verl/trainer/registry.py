"""Which trainer runs a config: algorithm.name -> the trainer class, and `RLTrainer`, which builds it.

from verl import RLTrainer
with RLTrainer("recipes/dpo_tiny.yaml") as trainer:   # a DPOTrainer; grpo_tiny.yaml gives a PPOTrainer
    summary = trainer.fit()
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, cast

from verl.config.plan import Plan
from verl.registry import Registry

# the plan's `trainer` (from algorithm.name; ppo and grpo differ only in the advantage estimator) -> the class; each
# trainer's module registers its own (imported on the first lookup: `import verl` stays light)
TRAINERS = Registry("trainer", builtins=("verl.trainer.ppo", "verl.trainer.dpo", "verl.trainer.sft_trainer"))


def trainer_class(plan: Plan) -> type:
    """The class that trains a run with this plan."""
    return cast(type, TRAINERS.get(plan.trainer, key="algorithm.name"))


def RLTrainer(  # noqa: N802 (a class name to its users: it builds the trainer the config asks for)
    config: Any,
    reward_fn: Optional[Callable] = None,
    *,
    overrides: Sequence[str] = (),
    plan: Optional[Plan] = None,
) -> Any:
    """The trainer algorithm.name selects (ppo / grpo: PPOTrainer; dpo: DPOTrainer; online_dpo: OnlineDPOTrainer;
    sft: SFTTrainer),
    built from a recipe path, a loaded config or a dict of sections, validated as `verl train` validates it."""
    from verl.config.resolve import resolve_config

    if plan is None:
        config, plan = resolve_config(config, overrides, reward_given=reward_fn is not None)
    return trainer_class(plan)(config, reward_fn, plan=plan)
