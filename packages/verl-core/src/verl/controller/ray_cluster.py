"""Starting and stopping Ray for a run: connect to a given cluster, or start a local one."""

from __future__ import annotations

import os
from typing import Any

import ray


def init_ray(
    num_cpus: int | None = None,
    address: str | None = None,
    *,
    num_gpus: int | None = None,
    log_to_driver: bool = True,
    runtime_env: dict[str, Any] | None = None,
) -> bool:
    """Make sure Ray is running; True if this call started or connected it, False if it already was.

    - Ray already initialized in this process: kept as it is (the arguments are not applied).
    - `address`, else the RAY_ADDRESS environment variable: connect to that cluster ("auto" finds one started
      with `ray start` on this machine). `num_cpus`/`num_gpus` describe a new cluster and are refused here.
    - Neither: start a local cluster with `num_cpus`/`num_gpus` (None: what the machine has). It never attaches
      to another user's cluster by accident. RAY_AUTH_MODE defaults to "disabled" for it: Ray 2.60 turns token
      auth on by default, which a single-machine run does not need.
    The dashboard is off (it costs memory and startup time).
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        if num_cpus is not None or num_gpus is not None:
            raise ValueError(
                f"init_ray: num_cpus/num_gpus size a new local cluster, but address={address!r} connects to an "
                "existing one (its nodes set their resources); drop them or unset the address / RAY_ADDRESS"
            )
        new_cluster = {}
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        address, new_cluster = "local", {"num_cpus": num_cpus, "num_gpus": num_gpus, "include_dashboard": False}
    ray.init(address=address, log_to_driver=log_to_driver, runtime_env=runtime_env, **new_cluster)
    return True


def shutdown_ray() -> None:
    """Disconnect from Ray (stopping the cluster if this process started it); a no-op when Ray is not running."""
    if ray.is_initialized():
        ray.shutdown()
