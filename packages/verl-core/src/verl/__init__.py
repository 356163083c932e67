"""verl: reinforcement-learning post-training for large language models.

    from verl import RLTrainer, load_config
    with RLTrainer("recipes/grpo_tiny.yaml", overrides=["trainer.total_steps=20"]) as trainer:  # a PPOTrainer
        print(trainer.fit())

The core holds the data protocol, the run configuration and its plan, the controller, algorithms, rewards and
trainers; training and rollout engines live in separate packages, found by backend name.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

try:
    __version__ = importlib.metadata.version("verl-core")
except importlib.metadata.PackageNotFoundError:  # a source checkout that was not installed
    __version__ = "0.0.0+source"

# The public names, imported on first use: `import verl` stays light (no torch, no Ray) for the CLI.
_PUBLIC = {
    "PPOTrainer": "verl.trainer.ppo",
    "DPOTrainer": "verl.trainer.dpo",
    "OnlineDPOTrainer": "verl.trainer.dpo",
    "SFTTrainer": "verl.trainer.sft_trainer",
    "RLTrainer": "verl.trainer.registry",
    "format_summary": "verl.trainer.summary",
    "load_config": "verl.config.loader",
    "ConfigError": "verl.config.errors",
    "validate": "verl.config.validate",
    "build_plan": "verl.config.plan",
    "Plan": "verl.config.plan",
    "DataProto": "verl.protocol",
    "VerlConfig": "verl.config.schema",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'verl' has no attribute '{name}'")
