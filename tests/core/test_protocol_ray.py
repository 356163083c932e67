"""DataProto through a real Ray cluster: the object store and actor calls return it intact."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

from verl.controller import init_ray
from verl.protocol import DataProto

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


@pytest.fixture(scope="module")
def cluster():
    # a private local cluster: a bare ray.init() would join a cluster another test started with `ray start`
    init_ray(num_cpus=2, log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote
class Worker:
    """Stands where a model worker will: receives a shard, computes on it, returns a new DataProto."""

    def double(self, data: DataProto) -> DataProto:
        out = data.select(tensor_keys=["ids"], non_tensor_keys=["uid"])
        out.batch["ids"] = out.batch["ids"] * 2
        out.meta_info["worker_saw"] = len(data)
        return out


def sample(n: int) -> DataProto:
    return DataProto.from_dict(
        {"ids": torch.arange(n * 4).view(n, 4), "mask": torch.ones(n, 4, dtype=torch.bool)},
        {"uid": np.array([f"u{i // 2}" for i in range(n)], dtype=object), "gt": [{"answer": i} for i in range(n)]},
        {"step": 7},
    )


def test_object_store_round_trip(cluster):
    data = sample(6)
    out = ray.get(ray.put(data))
    assert torch.equal(out.batch["ids"], data.batch["ids"]) and out.batch["mask"].dtype == torch.bool
    assert out.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()
    assert out.non_tensor_batch["gt"].tolist() == [{"answer": i} for i in range(6)]
    assert out.meta_info == {"step": 7}


def test_chunks_dispatched_to_actors_and_concatenated_back(cluster):
    data = sample(8)
    workers = [Worker.remote() for _ in range(2)]
    shards = ray.get([w.double.remote(shard) for w, shard in zip(workers, data.chunk(2))])
    out = DataProto.concat(shards)
    assert torch.equal(out.batch["ids"], data.batch["ids"] * 2)
    assert out.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()
    assert [s.meta_info["worker_saw"] for s in shards] == [4, 4]
