"""A recipe placing its actor on two Ray nodes (a local 2-node test cluster) trains the step it trains on one node."""

from __future__ import annotations

import json
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
    cluster = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_grpo_on_two_nodes(two_nodes, tmp_path, embedded_cache, monkeypatch):  # noqa: F811
    """DP=2 with its ranks on two nodes, then on one: the same step (metrics and weights), since only where the
    ranks run differs."""
    from safetensors.torch import load_file

    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    common = (
        "trainer.controller=ray",
        "rollout.n=2",
        "actor.ppo_micro_batch_size_per_device=2",  # a mini-batch of 2 prompts x n=2 over DP 2: 2 rows a rank
        "checkpoint.save_hf=true",
        "reward.fn={_target_: tests.support.run_configs.odd_length_reward}",  # spread: the step moves the weights
    )
    runs = {}
    for nodes, per_node in ((2, 1), (1, 2)):
        out = tmp_path / f"{nodes}x{per_node}"
        layout = (f"placement.nnodes={nodes}", f"placement.devices_per_node={per_node}")
        cfg = tiny_config("grpo_tiny", str(out), *common, *layout, steps=1)
        with PPOTrainer(cfg) as trainer:
            slots = trainer.workers.actor_rollout.executor.slots
            assert len({s.node_id for s in slots}) == nodes  # two nodes: rank 0 and rank 1 on different ones
            summary = trainer.fit()
        assert summary["steps"] == 1
        assert (out / "checkpoints" / "step_1" / "COMPLETE").exists()
        with open(out / "logs" / "metrics.jsonl") as f:
            row = json.loads(f.readlines()[-1])
        runs[nodes] = (row, load_file(str(out / "hf" / "model.safetensors")))
    (two, two_weights), (one, one_weights) = runs[2], runs[1]
    for key in ("reward/score/mean", "actor/pg_loss", "actor/grad_norm", "rollout/logprob_diff_max"):
        assert two[key] == one[key], key
    assert two["actor/grad_norm"] > 0
    assert two_weights.keys() == one_weights.keys()
    for name, weight in one_weights.items():
        assert (two_weights[name] == weight).all(), name
