"""A pool over two Ray nodes (a local test cluster: 2 nodes x 1 CPU): ranks on different nodes form one gloo group.

Its own module: the cluster replaces the single-node Ray of the other controller tests, so Ray must be down
before it starts and is shut down after it.
"""

from __future__ import annotations

import os
import sys

import pytest
import ray
import torch
import torch.distributed as dist
from ray.cluster_utils import Cluster

from verl.controller import Dispatch, ResourcePool, Worker, ray_group, register
from verl.controller.ray_executor import rendezvous_address

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module


class NodeWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def where(self) -> dict:
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "rank": self.rank,
            "local_rank": self.local_rank,
            "local_world_size": os.environ["LOCAL_WORLD_SIZE"],
            "master": (self.master_addr, self.master_port),
        }

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce(self) -> list[float]:
        self.init_distributed("gloo", timeout_s=60)
        t = torch.tensor([2.0**self.rank, float(self.rank)])
        dist.all_reduce(t)
        return t.tolist()


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # ray.cluster_utils nodes on this machine, for this test only
    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_pool_spans_two_nodes_and_ranks_share_a_gloo_group(two_nodes):
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    pool = ResourcePool("across", nnodes=2, devices_per_node=1, cpus_per_device=1.0)
    slots = pool.slots()
    assert slots[0].node_id != slots[1].node_id
    with ray_group(pool, NodeWorker, role="actor") as group:
        where = group.call("where")
        assert [w["rank"] for w in where] == [0, 1]
        assert where[0]["node"] != where[1]["node"]
        assert [w["node"] for w in where] == [s.node_id for s in slots]
        # each rank is alone on its node
        assert [(w["local_rank"], w["local_world_size"]) for w in where] == [(0, "1"), (0, "1")]
        assert where[0]["master"] == where[1]["master"] == (group.executor.master_addr, group.executor.master_port)
        # sum over ranks 0, 1 of [2**rank, rank] = [1 + 2, 0 + 1]
        assert group.call("all_reduce") == [[3.0, 1.0], [3.0, 1.0]]
    pool.remove()


def test_rendezvous_address_of_a_rank_zero_on_another_node(two_nodes):
    # The driver runs on the head node; for a slot on the other node a task there picks the address and port.
    pool = ResourcePool("rdv", nnodes=2, devices_per_node=1, cpus_per_device=1.0)
    driver_node = ray.get_runtime_context().get_node_id()
    (remote,) = [slot for slot in pool.slots() if slot.node_id != driver_node]
    addr, port = rendezvous_address(remote)
    node_ip = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}[remote.node_id]
    assert addr == node_ip and 1024 <= port <= 65535
    pool.remove()
