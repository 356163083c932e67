"""Worker groups on a real Ray cluster (2 CPUs) and in-process: dispatch, torch.distributed, errors, colocation.

Ray start-up and actor creation dominate the time here (each actor imports torch), so the Ray tests share
one pool and one 2-rank group where they can.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest
import ray
import torch
import torch.distributed as dist

from verl.controller import (
    Dispatch,
    ResourcePool,
    Worker,
    WorkerError,
    WorkerGroup,
    init_ray,
    local_group,
    make_worker_group,
    ray_group,
    register,
    shutdown_ray,
)
from verl.controller.worker_group import FAILURE_GRACE_S, LocalExecutor
from verl.protocol import DataProto

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

# Ray workers cannot import this test module (pytest puts its folder on the driver's sys.path only), so its
# worker classes travel by value. Worker classes of the packages are imported by name as usual.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class EchoWorker(Worker):
    """Reports what it was given and where it runs."""

    def __init__(self, tag: str = "echo") -> None:
        self.tag = tag
        self.seen: list[int] | None = None

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self, suffix: str) -> str:
        return f"{self.tag}:{self.rank}/{self.world_size}:{suffix}"

    def tag_of(self) -> str:  # not registered: reached through call_all
        return self.tag

    @register(Dispatch.ONE_TO_ALL)
    def set_layout(self, dp_ranks: list[int], dp_sizes: list[int], collects: list[bool]) -> None:
        """Entry r of each list is rank r's."""
        self.set_dispatch_info(dp_ranks[self.rank], dp_sizes[self.rank], collects[self.rank])

    @register(Dispatch.DP_COMPUTE)
    def tag_rows(self, data: DataProto, scale: int = 1) -> DataProto:
        """Each row's id times `scale`, and the rank that saw it."""
        self.seen = data.batch["ids"].tolist()
        out = data.select(tensor_keys=["ids"])
        out.batch["ids"] = out.batch["ids"] * scale
        out.batch["rank"] = torch.full((len(data),), self.rank)
        return out

    @register(Dispatch.DP_COMPUTE)
    def count_rows(self, data: DataProto) -> tuple[int, int]:
        return self.rank, len(data)

    @register(Dispatch.ONE_TO_ALL)
    def set_rollout_layout(self, dp_ranks: list[int], dp_sizes: list[int], collects: list[bool]) -> None:
        self.set_dispatch_info(dp_ranks[self.rank], dp_sizes[self.rank], collects[self.rank], mesh="rollout")

    @register(Dispatch.DP_COMPUTE, mesh="rollout")
    def count_rollout_rows(self, data: DataProto) -> tuple[int, int]:
        """Split by the "rollout" layout."""
        return self.rank, len(data)

    @register(Dispatch.DP_COMPUTE)
    def mutate(self, data: DataProto) -> int:
        data.batch["ids"].mul_(100)  # in place: must not reach the driver's batch
        return int(data.batch["ids"].sum())

    def last_seen(self) -> list[int] | None:
        return self.seen

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> str:
        if self.rank == rank:
            raise ValueError("boom")
        return "ok"

    @register(Dispatch.ONE_TO_ALL)
    def fail_everywhere(self) -> None:
        raise KeyError("missing")

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_ranks(self) -> list[float]:
        self.init_distributed("gloo")
        self.init_distributed("gloo")  # a second call is a no-op
        t = torch.tensor([self.rank + 1.0, 10.0 * (self.rank + 1)])
        dist.all_reduce(t)
        return t.tolist()

    @register(Dispatch.ONE_TO_ALL)
    def placement(self) -> dict:
        ctx = ray.get_runtime_context()
        return {
            "node": ctx.get_node_id(),
            "pg": ctx.get_placement_group_id(),
            "rank": self.rank,
            "local_rank": self.local_rank,
            "env": {k: os.environ.get(k) for k in ("LOCAL_WORLD_SIZE", "VERL_DEVICE", "RUN_TAG", "RAY_DEBUG")},
        }


class SleepyWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class BrokenWorker(Worker):
    def __init__(self, path: str) -> None:
        raise FileNotFoundError(f"no model at {path}")


def batch(n: int) -> DataProto:
    return DataProto.from_dict({"ids": torch.arange(n)}, meta_info={"step": 1})


# ---------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():  # left by another test module in this process
        ray.shutdown()
    assert init_ray(num_cpus=2, log_to_driver=False) is True  # started here
    assert init_ray() is False  # already running: kept
    yield
    shutdown_ray()


@pytest.fixture(scope="module")
def pool(cluster):
    # 2 slots of 0.5 CPU: room for two colocated groups, and 1 CPU left for the other tests' pools.
    pool = ResourcePool("shared", nnodes=1, devices_per_node=2, cpus_per_device=0.5)
    yield pool
    pool.remove()


@pytest.fixture(scope="module")
def module_group(pool):
    group = ray_group(pool, EchoWorker, "echo", role="echo", env={"RUN_TAG": "t1"}, resource_fraction=0.5)
    yield group
    group.shutdown()


@pytest.fixture
def group(module_group):
    module_group.call("set_layout", [0, 1], [2, 2], [True, True])  # the default layout, whatever a test set before
    module_group.refresh_dispatch_info()
    return module_group


def test_one_to_all_by_method_or_name(group):
    assert group.world_size == 2 and isinstance(group, WorkerGroup)
    assert group.call(EchoWorker.whoami, "x") == ["echo:0/2:x", "echo:1/2:x"]  # the method itself: go-to-definition
    assert group.call("whoami", suffix="y") == ["echo:0/2:y", "echo:1/2:y"]
    assert group.call_all(EchoWorker.tag_of) == ["echo", "echo"]  # any method, registered or not


def test_each_call_is_counted_with_the_tensor_bytes_it_ships(group):
    group.take_stats()
    out = group.call(EchoWorker.tag_rows, batch(6))  # int64 ids: 6 * 8 bytes out, 6 * 8 * 2 bytes back
    assert len(out) == 6
    stats = group.take_stats()
    assert (stats.calls, stats.bytes_sent, stats.bytes_received) == (1, 48, 96)
    assert group.take_stats().calls == 0  # taking resets


def test_dp_compute_splits_by_dp_rank_and_gathers_in_dp_order(group):
    out = group.call("tag_rows", batch(6), scale=2)
    assert out.batch["ids"].tolist() == [0, 2, 4, 6, 8, 10]
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1, 1]
    assert out.meta_info == {"step": 1}
    assert group.call_all("last_seen") == [[0, 1, 2], [3, 4, 5]]

    # Swap the dp ranks: rank 0 now holds the second half, and the gather still follows dp order.
    group.call("set_layout", [1, 0], [2, 2], [True, True])
    assert group.refresh_dispatch_info() == [
        {"dp_rank": 1, "dp_size": 2, "collect": True},
        {"dp_rank": 0, "dp_size": 2, "collect": True},
    ]
    out = group.call("tag_rows", batch(4))
    assert out.batch["ids"].tolist() == [0, 1, 2, 3]
    assert out.batch["rank"].tolist() == [1, 1, 0, 0]
    assert group.call_all("last_seen") == [[2, 3], [0, 1]]
    assert group.call("count_rows", batch(4)) == [(1, 2), (0, 2)]  # non-DataProto results: a list in dp order


def test_methods_split_by_their_own_mesh(group):
    # A megatron actor with TP=2 (one replica) beside a rollout with TP=1 (two replicas) in the same workers.
    group.call("set_layout", [0, 0], [1, 1], [True, False])
    group.refresh_dispatch_info()
    assert group.call("count_rows", batch(4)) == [(0, 4)]
    assert group.call("count_rollout_rows", batch(4)) == [(0, 4)]  # no "rollout" layout set: the train one
    group.call("set_rollout_layout", [0, 1], [2, 2], [True, True])
    group.refresh_dispatch_info()
    assert group.call("count_rollout_rows", batch(4)) == [(0, 2), (1, 2)]
    assert group.call("count_rows", batch(4)) == [(0, 4)]


def test_dp_size_below_world_models_tensor_parallel(group):
    # TP=2: both ranks are dp rank 0 and get the whole batch; only rank 0's result comes back.
    group.call("set_layout", [0, 0], [1, 1], [True, False])
    group.refresh_dispatch_info()
    out = group.call("tag_rows", batch(4))
    assert out.batch["ids"].tolist() == [0, 1, 2, 3] and out.batch["rank"].tolist() == [0, 0, 0, 0]
    assert group.call_all("last_seen") == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert group.call("count_rows", batch(3)) == [(0, 3)]


def test_dp_compute_batch_that_does_not_split(group):
    with pytest.raises(ValueError, match=r"echo\.tag_rows is DP_COMPUTE over dp_size=2: the batch has 5 rows"):
        group.call("tag_rows", batch(5))


def test_workers_get_copies_of_the_batch(group):
    data = batch(4)
    # rank 0 gets [0, 1] -> 100 * 1 = 100; rank 1 gets [2, 3] -> 100 * 5 = 500
    assert group.call("mutate", data) == [100, 500]
    assert data.batch["ids"].tolist() == [0, 1, 2, 3]


def test_torch_distributed_all_reduce_across_actors(group):
    # sum over ranks 0, 1 of [rank + 1, 10 * (rank + 1)] = [1 + 2, 10 + 20]
    assert group.call("all_reduce_ranks") == [[3.0, 30.0], [3.0, 30.0]]


def test_error_on_one_rank_names_role_rank_method_and_traceback(group):
    with pytest.raises(WorkerError) as err:
        group.call("fail_on", 1)
    text = str(err.value)
    assert text.startswith("role 'echo': method 'fail_on' failed on rank 1 (of 2)")
    assert 'raise ValueError("boom")' in text and "ValueError: boom" in text
    assert "test_controller_groups.py" in text and ", in fail_on" in text
    assert err.value.ranks == [1] and isinstance(err.value.causes[1], ValueError)
    assert group.call("whoami", "after") == ["echo:0/2:after", "echo:1/2:after"]  # the workers live on

    with pytest.raises(WorkerError, match=r"(?s)failed on ranks 0, 1 \(of 2\).*--- ranks 0, 1: .*KeyError: 'missing'"):
        group.call(EchoWorker.fail_everywhere)


def test_calling_an_unregistered_method_says_how(group):
    with pytest.raises(AttributeError, match=r"EchoWorker.last_seen: it is not registered: decorate it with @register"):
        group.call(EchoWorker.last_seen)
    with pytest.raises(AttributeError, match="registered methods: all_reduce_ranks, count_rollout_rows, "):
        group.call("nope")


def test_constructor_error_is_a_worker_error(cluster):
    pool = ResourcePool("broken", nnodes=1, devices_per_node=1, cpus_per_device=0.25)
    try:
        with pytest.raises(WorkerError) as err:
            ray_group(pool, BrokenWorker, "/nowhere", role="ref")
        text = str(err.value)
        assert "role 'ref': method '__init__' failed on rank 0 (of 1)" in text
        assert "FileNotFoundError: no model at /nowhere" in text
    finally:
        pool.remove()


def test_a_killed_worker_stops_the_call_within_seconds_naming_role_and_rank(pool):
    """A rank killed mid-call (OOM killer, a crash): the driver raises at once, not when the others give up."""
    with ray_group(pool, SleepyWorker, role="rollout", resource_fraction=0.5) as sleepy:
        victim = sleepy.call(SleepyWorker.pid)[1]
        killer = threading.Timer(1.0, os.kill, (victim, signal.SIGKILL))
        start = time.monotonic()
        killer.start()
        with pytest.raises(WorkerError) as err:
            sleepy.call(SleepyWorker.sleep, 120.0)
        elapsed = time.monotonic() - start
        killer.join()
    text = str(err.value)
    assert "role 'rollout': method 'sleep' failed on rank 1 (of 2)" in text and "rank 0 had not finished" in text
    assert "ActorDiedError" in text and err.value.causes == {1: None}
    assert elapsed < 1.0 + FAILURE_GRACE_S + 10, elapsed


def free_bundle_cpus(pg_id: str, expected: list[float], timeout_s: float = 10.0) -> list[float]:
    """Free CPUs of bundles 0 and 1 of a placement group, polled until `expected` (Ray's view lags briefly)."""
    deadline = time.monotonic() + timeout_s
    while True:
        free = ray.available_resources()  # a full bundle's key is absent
        got = [free.get(f"CPU_group_{i}_{pg_id}", 0.0) for i in range(2)]
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_colocated_groups_share_each_bundle(group, pool):
    pg_id = pool.slots()[0].placement_group.id.hex()
    # each bundle: 0.5 CPU, of which the echo group (fraction 0.5) holds 0.25
    assert free_bundle_cpus(pg_id, [0.25, 0.25]) == [0.25, 0.25]
    with ray_group(pool, EchoWorker, "critic", role="critic", resource_fraction=0.5) as critic:
        assert critic.call(EchoWorker.whoami, "c") == ["critic:0/2:c", "critic:1/2:c"]
        a, b = group.call(EchoWorker.placement), critic.call(EchoWorker.placement)
        for rank in range(2):
            assert a[rank]["rank"] == b[rank]["rank"] == rank
            assert a[rank]["node"] == b[rank]["node"] and a[rank]["pg"] == b[rank]["pg"] == pg_id
            assert a[rank]["local_rank"] == rank and a[rank]["env"]["LOCAL_WORLD_SIZE"] == "2"
        assert a[0]["env"]["RUN_TAG"] == "t1" and b[0]["env"]["RUN_TAG"] is None and a[0]["env"]["VERL_DEVICE"] == "cpu"
        # both groups now hold all of every bundle: rank r of each group sits in bundle r
        assert free_bundle_cpus(pg_id, [0.0, 0.0]) == [0.0, 0.0]


def test_the_distributed_debuggers_switches_reach_the_workers(pool, monkeypatch):
    monkeypatch.setenv("RAY_DEBUG", "1")  # Ray's distributed debugger: breakpoint() in a worker waits for it
    with ray_group(pool, EchoWorker, "debugged", role="debugged", resource_fraction=0.5) as g:
        assert [p["env"]["RAY_DEBUG"] for p in g.call(EchoWorker.placement)] == ["1", "1"]


def test_a_pool_that_does_not_fit_says_what_the_cluster_has(cluster):
    pool = ResourcePool("big", nnodes=1, devices_per_node=3, cpus_per_device=1.0)
    with pytest.raises(RuntimeError, match=r"ResourcePool 'big': could not reserve 1 node\(s\) with \[3\] bundles"):
        pool.slots(timeout_s=1.0)


def test_group_argument_errors(pool):
    with pytest.raises(TypeError, match="worker_cls must be a subclass of verl.controller.Worker"):
        ray_group(pool, object, role="x")
    with pytest.raises(ValueError, match="resource_fraction must be in"):
        ray_group(pool, EchoWorker, role="x", resource_fraction=1.5)
    with pytest.raises(ValueError, match="env may not set RANK"):
        ray_group(pool, EchoWorker, role="x", env={"RANK": "3"})
    with pytest.raises(ValueError, match="unknown controller mode 'slurm'; choose one of local, ray"):
        make_worker_group("slurm", pool, EchoWorker, role="x")


# ---------------------------------------------------------------------------------------------
# In-process (no Ray)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def local_env():
    """Local groups write the rank variables into this process's environment: put it back afterwards."""
    saved = dict(os.environ)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def test_local_group_same_calls(local_env):
    group = make_worker_group("local", ResourcePool("one", 1, 1), EchoWorker, "loc", role="actor", env={"RUN_TAG": "l"})
    assert isinstance(group.executor, LocalExecutor) and group.world_size == 1
    assert group.call(EchoWorker.whoami, "x") == ["loc:0/1:x"]
    assert group.call_all(EchoWorker.tag_of) == ["loc"]
    out = group.call("tag_rows", batch(3), scale=3)
    assert out.batch["ids"].tolist() == [0, 3, 6] and out.batch["rank"].tolist() == [0, 0, 0]
    assert group.call("count_rows", batch(3)) == [(0, 3)]
    data = batch(2)
    assert group.call("mutate", data) == [100] and data.batch["ids"].tolist() == [0, 1]  # by value, as through Ray
    assert group.call("all_reduce_ranks") == [[1.0, 10.0]]  # a world of one: the sum is its own tensor
    assert os.environ["RUN_TAG"] == "l" and os.environ["VERL_DEVICE"] == "cpu"


def test_local_group_errors(local_env):
    group = local_group(None, EchoWorker, role="critic")
    with pytest.raises(WorkerError) as err:
        group.call("fail_on", 0)
    text = str(err.value)
    assert text.startswith("role 'critic': method 'fail_on' failed on rank 0 (of 1)")
    assert 'raise ValueError("boom")' in text and "test_controller_groups.py" in text
    assert isinstance(err.value.__cause__, ValueError)  # the live exception, for pdb.post_mortem
    with pytest.raises(WorkerError, match="KeyError: 'missing'"):
        group.call(EchoWorker.fail_everywhere)
    with pytest.raises(AttributeError, match="runs EchoWorker, which does not define BrokenWorker.__init__"):
        group.call(BrokenWorker.__init__)  # a method of another worker class: refused, not run by name
    with pytest.raises(TypeError, match=r"critic\.tag_rows is DP_COMPUTE: its first positional argument must be a Da"):
        group.call("tag_rows", [1, 2])
    with pytest.raises(WorkerError, match=r"(?s)role 'ref': method '__init__' failed on rank 0.*no model at /x"):
        local_group(None, BrokenWorker, "/x", role="ref")
    with pytest.raises(ValueError, match="local mode runs one in-process worker, but pool 'two' has 2 devices"):
        local_group(ResourcePool("two", 1, 2), EchoWorker, role="actor")
