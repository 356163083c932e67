"""Shared test fixtures: configs built on the schema without a recipe file."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from verl.config.schema import VerlConfig

# The smallest valid run: every required key set, everything else at its default.
MINIMAL = {
    "model": {"path": "m"},
    "data": {"train_files": ["t.parquet"], "train_batch_size": 16},
    "actor": {"ppo_mini_batch_size": 4},
    "rollout": {"n": 4},
}


def make_cfg(*updates: dict) -> DictConfig:
    """The minimal config with `updates` merged on top, in order."""
    return OmegaConf.merge(OmegaConf.structured(VerlConfig), MINIMAL, *updates)
