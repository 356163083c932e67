"""Errors the tracking backends raise, named after the config key a user would change."""

from __future__ import annotations

from verl.config.errors import ConfigError, ConfigProblem


def missing_package(logger: str, package: str) -> ConfigError:
    """tracking.loggers names a backend whose package is not installed."""
    message = f"the '{logger}' logger needs the '{package}' package, which is not installed"
    fix = f"pip install 'verl-core[{logger}]' (or {package}), or remove '{logger}' from tracking.loggers"
    return ConfigError([ConfigProblem("tracking.loggers", message, fix)])
