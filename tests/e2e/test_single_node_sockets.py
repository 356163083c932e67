"""A run on one machine opens nothing beyond loopback: every socket the project listens on during a GRPO run is
bound to a loopback address, with the local controller and with Ray workers (the rollout on a pool of its own, so
the weight-transfer group forms too). Ray's own servers listen on the node's address (they cannot bind loopback;
its token auth guards them): those are told apart by comparing each worker process with a bare Ray actor's."""

from __future__ import annotations

import os
import sys

import pytest
import ray

from tests.support.processes import Listener, ListenerSampler, listeners
from tests.support.run_configs import fit, tiny_config

pytestmark = [
    pytest.mark.slow,  # the fast tier skips this file (tagged "slow" in tests/BUILD too)
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads sockets from /proc (Linux)"),
]


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def _outside_loopback(found: set[Listener]) -> list[Listener]:
    return sorted(listener for listener in found if not listener.loopback)


def test_a_local_run_listens_on_loopback_only(tmp_path):
    assert not _outside_loopback(listeners([os.getpid()])), "this test process listened outside loopback already"
    cfg = tiny_config("grpo_tiny", str(tmp_path), "trainer.controller=local")
    with ListenerSampler(os.getpid()) as sampler:
        summary, _ = fit(cfg)
    assert summary["steps"] == 2
    # The run did open listeners (its process group's store): the sampler saw them, all on loopback.
    assert sampler.seen, "no listener seen during the run: the sampler missed the process group's store"
    assert not _outside_loopback(sampler.seen), sampler.commands


@ray.remote(num_cpus=0)
class _BareActor:
    def pid(self) -> int:
        return os.getpid()


def test_a_ray_run_opens_nothing_beyond_ray_on_the_node_address(tmp_path, ray_three_cpus):  # noqa: F811
    # What Ray itself opens in an actor process, outside loopback: a bare actor's listeners.
    bare = _BareActor.remote()
    bare_pid = ray.get(bare.pid.remote())
    ray_own = len(_outside_loopback(listeners([bare_pid])))
    driver_before = set(_outside_loopback(listeners([os.getpid()])))

    cfg = tiny_config("grpo_tiny_async", str(tmp_path), "trainer.controller=ray")
    with ListenerSampler(os.getpid()) as sampler:
        summary, rows = fit(cfg)
    assert summary["steps"] == 2 and rows[-1]["perf/weight_sync_bytes"] > 0  # weights went over the transfer group

    # The project's worker processes (Ray names each after its actor's class, and "ray::Class.method" while a
    # call runs, which a sample can catch): the actor's and the rollout's.
    workers = {pid: command.split(".")[0] for pid, command in sampler.commands.items() if command.startswith("ray::")}
    workers = {pid: command for pid, command in workers.items() if command.endswith("Worker")}
    assert sorted(workers.values()) == ["ray::ActorRolloutRefWorker", "ray::RolloutWorker"], sampler.commands
    for pid in sorted(workers):
        outside = [listener for listener in _outside_loopback(sampler.seen) if listener.pid == pid]
        assert len(outside) <= ray_own, (sampler.commands[pid], outside, f"a bare Ray actor has {ray_own}")
        # The project's own listeners there (the process group's store, gloo's pairs) are on loopback.
        assert any(listener.loopback for listener in sampler.seen if listener.pid == pid), sampler.commands[pid]
    driver_after = {listener for listener in _outside_loopback(sampler.seen) if listener.pid == os.getpid()}
    assert driver_after <= driver_before, driver_after - driver_before
