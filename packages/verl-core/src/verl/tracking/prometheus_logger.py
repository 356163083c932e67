"""The Prometheus logger: each metric as a gauge (actor/pg_loss -> verl_actor_pg_loss) served over HTTP.

The gauges live in a private registry, so several trackers in one process (or other libraries' metrics)
never collide. `tracking.prometheus_port: 0` lets the OS pick a free port; the chosen port is logged. It listens
on `tracking.prometheus_host`, loopback unless configured (0.0.0.0 exposes the metrics to the network).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from verl.config.errors import ConfigError, ConfigProblem
from verl.config.schema import TrackingConfig
from verl.tracking.errors import missing_package

__all__ = ["PrometheusLogger", "prometheus_name"]

logger = logging.getLogger(__name__)

PREFIX = "verl_"
# The names verl's documentation gives a few headline metrics, exported beside the native ones (each from the
# first of its native keys logged): verl_ppo_kl_divergence, verl_ppo_reward_mean, verl_actor_generation_time.
DOCUMENTED = {
    "ppo/kl_divergence": ("actor/kl", "actor/ppo_kl"),
    "ppo/reward_mean": ("reward/score/mean",),
    "actor/generation_time": ("timing/gen_s",),
}


def prometheus_name(key: str) -> str:
    """A valid Prometheus metric name for a metric key: verl_ + the key with every other character as "_"."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class PrometheusLogger:
    def __init__(self, cfg: TrackingConfig, *, run_config: dict | None = None, log_dir: str | None = None):
        try:
            # An optional extra (pip install verl-core[prometheus]), so the wheel does not require it.
            import prometheus_client  # pants: no-infer-dep
        except ImportError as e:
            raise missing_package("prometheus", "prometheus-client") from e
        self._client = prometheus_client
        self.registry = prometheus_client.CollectorRegistry()
        self._gauges: dict[str, Any] = {}  # metric key -> gauge
        self._owners: dict[str, str] = {}  # prometheus name -> the metric key that has it
        self._step = prometheus_client.Gauge(
            PREFIX + "step", "the step of the last metrics logged", registry=self.registry
        )
        self.host = getattr(cfg, "prometheus_host", "127.0.0.1")
        self.port = self._serve(cfg.prometheus_port)

    def _serve(self, port: Any) -> int:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise _port_error(f"expected a port number 0-65535, got {port!r}", "set it to a free port, or 0 for any")
        try:
            self._server, self._thread = self._client.start_http_server(port, addr=self.host, registry=self.registry)
        except OSError as e:
            raise _port_error(
                f"cannot serve Prometheus metrics on {self.host} port {port} ({e.strerror or e})",
                "set tracking.prometheus_port to a free port, or 0 to let the system pick one",
            ) from None
        chosen = self._server.server_port
        logger.info("serving Prometheus metrics at http://%s:%d/metrics", self.host, chosen)
        return chosen

    def log(self, metrics: dict[str, float], step: int) -> None:
        documented = {}
        for alias, keys in DOCUMENTED.items():
            found = next((k for k in keys if k in metrics), None)
            if found is not None:
                documented[alias] = metrics[found]
        for key, value in {**metrics, **documented}.items():
            gauge = self._gauges[key] if key in self._gauges else self._new_gauge(key)
            if gauge is not None:
                gauge.set(value)
        self._step.set(step)

    def _new_gauge(self, key: str) -> Any:
        name = prometheus_name(key)
        if name in self._owners or name == PREFIX + "step":  # (never this key's own: it would have its gauge)
            owner = self._owners.get(name, "the step gauge")
            logger.warning("metric %r is not exported to Prometheus: its name %s is taken by %r", key, name, owner)
            self._gauges[key] = None  # warned once; skipped from now on
            return None
        self._owners[name] = key
        gauge = self._client.Gauge(name, key, registry=self.registry)
        self._gauges[key] = gauge
        return gauge

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _port_error(message: str, fix: str) -> ConfigError:
    return ConfigError([ConfigProblem("tracking.prometheus_port", message, fix=fix)])
