"""The Weights & Biases logger: one run per Tracker; `wandb_mode: offline` writes the run locally only."""

from __future__ import annotations

import os
from typing import Any

from verl.config.schema import TrackingConfig
from verl.tracking.errors import missing_package

__all__ = ["WandbLogger"]


class WandbLogger:
    def __init__(self, cfg: TrackingConfig, *, run_config: dict | None = None, log_dir: str):
        try:
            # An optional extra (pip install verl-core[wandb]), so the wheel does not require it.
            import wandb  # pants: no-infer-dep
        except ImportError as e:
            raise missing_package("wandb", "wandb") from e
        os.makedirs(log_dir, exist_ok=True)
        mode: Any = cfg.wandb_mode  # (one of online, offline, disabled: the schema checks it)
        self.run = wandb.init(project=cfg.project, name=cfg.experiment, mode=mode, dir=log_dir, config=run_config or {})

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()
