"""`get_config_from_yaml`: the name verl's documentation gives loading a recipe (verl.config.loader.load_config)."""

from __future__ import annotations

from typing import Sequence

from omegaconf import DictConfig

from verl.config.loader import load_config


def get_config_from_yaml(path: str, overrides: Sequence[str] = ()) -> DictConfig:
    """A recipe file with `key=value` overrides applied, checked against the schema: what `PPOTrainer` takes."""
    return load_config(path, list(overrides))
