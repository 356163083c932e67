"""A local cluster is private to the run that started it: token auth on its ports (Ray's servers listen on every
interface), and none of its processes outlives the driver, killed or not.

The kill test starts a real driver process (`init_ray`, two actors) and looks at it from outside.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from verl.controller import reaper

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

DRIVER = """
import json, os, sys, time
import ray
from verl.controller import init_ray, shutdown_ray

init_ray(num_cpus=2, log_to_driver=False)

@ray.remote(num_cpus=0.5)
class Idle:
    def pid(self):
        return os.getpid()

actors = [Idle.remote() for _ in range(2)]
pids = ray.get([a.pid.remote() for a in actors])
info = {"gcs": ray.get_runtime_context().gcs_address, "token": os.environ.get("RAY_AUTH_TOKEN"),
        "tag": os.environ["VERL_RUN"], "actors": pids}
print(json.dumps(info), flush=True)
if sys.argv[1] == "exit":
    shutdown_ray()
else:
    time.sleep(600)
"""


def start_driver(mode: str) -> tuple[subprocess.Popen, dict]:
    """A driver with the default auth settings (none given), and what it printed once its actors were up."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        pytest.fail(
            f"the driver ended (status {proc.returncode}) before its actors were up:\n{proc.stderr.read()[-3000:]}"
        )
    return proc, json.loads(line)


def wait_until_gone(tag: str, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := reaper.tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def gcs_call(address: str, token: str | None):
    """GetClusterId on the GCS over plain gRPC: 'ok', or the status code it was refused with."""
    import grpc  # pants: no-infer-dep (grpcio comes with ray)
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=10, metadata=metadata)
        except grpc.RpcError as e:
            return e.code()
    return "ok"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc (Linux only)")
def test_a_local_cluster_needs_its_token_and_dies_with_its_killed_driver():
    import grpc  # pants: no-infer-dep (grpcio comes with ray)

    proc, info = start_driver("sleep")
    try:
        host = info["gcs"].rsplit(":", 1)[0]
        if ipaddress.ip_address(host).is_loopback:
            pytest.skip(f"Ray chose the loopback address {host}: this machine has no other interface to test")
        # The GCS answers on a non-loopback address, so only the token keeps other machines out.
        assert gcs_call(info["gcs"], None) == grpc.StatusCode.UNAUTHENTICATED
        assert gcs_call(info["gcs"], "0" * 64) == grpc.StatusCode.UNAUTHENTICATED
        assert gcs_call(info["gcs"], info["token"]) == "ok"  # the check can pass: the run's own token works
        assert (
            not os.path.exists(os.path.expanduser("~/.ray/auth_token"))
            or info["token"] != open(os.path.expanduser("~/.ray/auth_token")).read().strip()
        )  # a token of the run's own, not the shared file

        running = reaper.tagged(info["tag"])
        assert set(info["actors"]) <= set(running) and len(running) >= 4  # gcs, raylet, agents, the actors
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # Ray's own agents would retry the dead GCS for about a minute; nothing of the run may be left.
    assert wait_until_gone(info["tag"], timeout_s=15) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc (Linux only)")
def test_a_normal_shutdown_leaves_no_process_behind(monkeypatch):
    import ray

    from verl.controller import init_ray, shutdown_ray

    for key in [k for k in os.environ if k.startswith("RAY_AUTH")]:
        monkeypatch.delenv(key)
    if ray.is_initialized():
        ray.shutdown()
    init_ray(num_cpus=1, log_to_driver=False)
    tag = os.environ[reaper.TAG_VAR]
    assert len(reaper.tagged(tag)) >= 2  # gcs and raylet at least
    shutdown_ray()
    assert reaper.TAG_VAR not in os.environ  # processes started from now on are not the cluster's
    assert wait_until_gone(tag, timeout_s=5) == []
