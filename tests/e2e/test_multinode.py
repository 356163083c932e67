"""A recipe placing its actor on two Ray nodes (a local 2-node test cluster, 1 CPU each) trains a step."""

from __future__ import annotations

import os

import pytest
import ray
from ray.cluster_utils import Cluster

from tests.support.run_configs import tiny_config
from verl.trainer.ppo import PPOTrainer

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # ray.cluster_utils nodes on this machine, for this test only
    cluster = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_grpo_on_two_nodes(two_nodes, tmp_path, embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path),
        "trainer.controller=ray",
        "placement.nnodes=2",
        "placement.devices_per_node=1",
        "rollout.n=2",
        "actor.ppo_micro_batch_size_per_device=2",  # a mini-batch of 2 prompts x n=2 over DP 2: 2 rows a rank
        steps=1,
    )
    with PPOTrainer(cfg) as trainer:
        slots = trainer.workers.actor_rollout.executor.slots
        assert len({s.node_id for s in slots}) == 2  # rank 0 and rank 1 on different nodes
        summary = trainer.fit()
    assert summary["steps"] == 1
    assert (tmp_path / "checkpoints" / "step_1" / "COMPLETE").exists()
