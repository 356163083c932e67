"""Experiment tracking: `Tracker` (console, jsonl, wandb, tensorboard, prometheus) and `Progress`."""

from verl.tracking.progress import Progress
from verl.tracking.tracker import LOGGERS, Tracker

__all__ = ["LOGGERS", "Progress", "Tracker"]
