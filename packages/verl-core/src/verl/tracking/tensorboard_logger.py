"""The TensorBoard logger: scalars under <log_dir>/tensorboard, one tag per metric name."""

from __future__ import annotations

import os
from typing import Optional

from verl.config.schema import TrackingConfig
from verl.tracking.errors import missing_package

__all__ = ["TensorboardLogger"]

SUBDIR = "tensorboard"


class TensorboardLogger:
    def __init__(self, cfg: Optional[TrackingConfig] = None, *, run_config: dict | None = None, log_dir: str):
        try:
            # torch's writer needs the tensorboard package (an optional extra: pip install verl-core[tensorboard]);
            # importing it first also catches a missing package when torch.utils.tensorboard is already loaded.
            import tensorboard  # pants: no-infer-dep  # noqa: F401
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise missing_package("tensorboard", "tensorboard") from e
        self.path = os.path.join(log_dir, SUBDIR)
        self.writer = SummaryWriter(log_dir=self.path)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
