"""Experiment tracking: `Tracker` fans each step's metrics out to the loggers `tracking.loggers` names.

Metric names are "<group>/<name>" with groups reward, actor, critic, timing, perf and val. Values that are
not finite numbers (NaN, inf, strings, multi-element tensors) are skipped with one warning per key, so a
bad metric never stops a run.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl.config.errors import ConfigError, ConfigProblem
from verl.config.placement import to_dict
from verl.config.schema import TrackingConfig
from verl.registry import Registry
from verl.tracking.console import ConsoleLogger
from verl.tracking.jsonl import JsonlLogger
from verl.tracking.prometheus_logger import PrometheusLogger
from verl.tracking.tensorboard_logger import TensorboardLogger
from verl.tracking.values import to_float
from verl.tracking.wandb_logger import WandbLogger

__all__ = ["LOGGERS", "Tracker"]

logger = logging.getLogger(__name__)

# name in tracking.loggers -> class(cfg: TrackingConfig, *, run_config, log_dir) with log(metrics, step), close()
LOGGERS = Registry("logger")
for _name, _cls in (
    ("console", ConsoleLogger),
    ("jsonl", JsonlLogger),
    ("wandb", WandbLogger),
    ("tensorboard", TensorboardLogger),
    ("prometheus", PrometheusLogger),
):
    LOGGERS.register(_name)(_cls)


class Tracker:
    """Sends each step's metrics to every configured logger; a context manager, and close() is idempotent."""

    def __init__(self, cfg: Any, *, run_config: dict | None = None, log_dir: str):
        self.cfg = _tracking_config(cfg)
        self.log_dir = log_dir
        self.loggers: dict[str, Any] = {}
        self._warned: set[str] = set()
        self._closed = False
        for i, name in enumerate(self.cfg.loggers):
            if name not in LOGGERS:
                raise _unknown_logger(i, name)
        run_config = _plain_dict(run_config)
        try:
            for name in dict.fromkeys(self.cfg.loggers):  # a name listed twice logs once
                self.loggers[name] = LOGGERS[name](self.cfg, run_config=run_config, log_dir=log_dir)
        except BaseException:
            try:
                self.close()  # the loggers already started (a server, an open file) must not leak
            except Exception as e:  # noqa: BLE001 - the start failure is the error to raise
                logger.error("closing the loggers after a failed start also failed: %s", e)
            raise

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log one step's metrics to every logger."""
        if self._closed:
            raise RuntimeError("Tracker.log called after close()")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise TypeError(f"step must be an int, got {type(step).__name__} {step!r}")
        clean = self._clean(metrics, int(step))
        for backend in self.loggers.values():
            backend.log(clean, int(step))

    def resume_at(self, step: int) -> None:
        """A resumed run continues after `step`: loggers that keep a file drop what they logged past it."""
        for backend in self.loggers.values():
            if hasattr(backend, "resume_at"):
                backend.resume_at(step)

    def close(self) -> None:
        """Close every logger (each even if another fails); later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        first_error = None
        for name, backend in self.loggers.items():
            try:
                backend.close()
            except Exception as e:  # noqa: BLE001 - close the others, then raise the first failure
                logger.error("closing the %s logger failed: %s", name, e)
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _clean(self, metrics: Mapping[str, Any], step: int) -> dict[str, float]:
        clean = {}
        for key, value in metrics.items():
            number = to_float(value)
            if number is not None and math.isfinite(number):
                clean[str(key)] = number
            elif key not in self._warned:
                self._warned.add(key)
                reason = "is not finite" if number is not None else f"is a {type(value).__name__}, not a number"
                logger.warning(
                    "metric %r skipped at step %d: %r %s (warned once; later steps skip it silently)",
                    key,
                    step,
                    value,
                    reason,
                )
        return clean


def _plain_dict(run_config: Any) -> dict | None:
    """The run config as plain containers (wandb stores it), interpolations resolved where they resolve."""
    if run_config is None or not OmegaConf.is_config(run_config):
        return run_config
    try:
        return to_dict(run_config)
    except OmegaConfBaseException:  # an interpolation that cannot resolve yet: keep it as written
        return to_dict(run_config, resolve=False)


def _tracking_config(cfg: Any) -> TrackingConfig:
    """A TrackingConfig from a TrackingConfig, its DictConfig, or a plain dict (unknown keys are errors)."""
    if isinstance(cfg, TrackingConfig):
        return cfg
    try:
        return cast(TrackingConfig, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrackingConfig), cfg)))
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise ConfigError(
            [ConfigProblem("tracking", f"invalid tracking config: {e}", fix="see TrackingConfig")]
        ) from None


def _unknown_logger(i: int, name: Any) -> ConfigError:
    close = difflib.get_close_matches(str(name), LOGGERS.names(), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return ConfigError(
        [ConfigProblem(f"tracking.loggers[{i}]", f"unknown logger '{name}'", f"{hint}choose from {', '.join(LOGGERS)}")]
    )
