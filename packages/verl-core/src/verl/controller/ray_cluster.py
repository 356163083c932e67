"""Starting and stopping Ray for a run: connect to a given cluster, or start a local one that is private to it."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from typing import Any

from verl.controller import reaper

# The process that cleans up after the local cluster init_ray started.
_local: dict[str, Any] = {"reaper": None}


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
      to another user's cluster by accident, and it is private to this process: Ray's servers listen on every
      interface, so it gets token authentication with a fresh token of its own (unless RAY_AUTH_MODE /
      RAY_AUTH_TOKEN are set, which are respected), and its processes end with this one, even when it is killed.
    The dashboard is off (it costs memory and startup time).
    """
    import ray  # pants: no-infer-dep (the ray extra); imported here: a run without Ray never pays for it

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        if num_cpus is not None or num_gpus is not None:
            raise ValueError(
                f"init_ray: num_cpus/num_gpus size a new local cluster, but address={address!r} connects to an "
                "existing one (its nodes set their resources); drop them or unset the address / RAY_ADDRESS"
            )
        ray.init(address=address, log_to_driver=log_to_driver, runtime_env=runtime_env)
        return True
    _private_cluster_env()
    try:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            log_to_driver=log_to_driver,
            runtime_env=runtime_env,
        )
    except BaseException:
        _end_local()
        raise
    return True


def shutdown_ray() -> None:
    """Disconnect from Ray (stopping the cluster if this process started it); a no-op when Ray is not running."""
    ray = sys.modules.get("ray")  # never imported: never started
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    _end_local()


def _private_cluster_env() -> None:
    """Token auth with a token of this process's own, and the tag its processes inherit (read by the reaper)."""
    auth_given = any(key in os.environ for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"))
    if not auth_given:
        # Ray turns token auth on for a new local cluster when RAY_AUTH_MODE is unset; the token is this
        # process's (Ray's loader caches it for the process), not ~/.ray/auth_token, which runs started side by
        # side would race to create.
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    _reload_ray_auth()
    tag = f"{os.getpid()}-{secrets.token_hex(6)}"
    if sys.platform.startswith("linux"):
        _local["reaper"] = subprocess.Popen(
            [sys.executable, reaper.__file__, str(os.getpid()), tag],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # outside the run's process group: a Ctrl-C or group kill must not stop it
            env={k: v for k, v in os.environ.items() if k != reaper.TAG_VAR},
        )
    os.environ[reaper.TAG_VAR] = tag


def _reload_ray_auth() -> None:
    """Have Ray re-read the auth mode and token from the environment: it caches both per process, so a second
    cluster in one process (a notebook, a test session) would otherwise talk to its GCS with the first's."""
    # (ray._raylet is compiled: the type checker sees no names in it)
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # pants: no-infer-dep

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _end_local() -> None:
    """Have the reaper end what Ray's shutdown left behind; later child processes are no longer the cluster's."""
    proc, _local["reaper"] = _local["reaper"], None
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    os.environ.pop(reaper.TAG_VAR, None)
