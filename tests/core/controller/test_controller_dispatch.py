"""The dispatch rules without Ray: split / gather, dispatch infos, @register, WorkerError text, pools from a plan."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fixtures import make_cfg, make_plan
from verl.controller import Dispatch, ResourcePool, Worker, WorkerError, init_ray, pools_from_plan, register
from verl.controller.dispatch import (
    DispatchInfo,
    gather,
    read_dispatch_infos,
    registered_methods,
    split,
)
from verl.protocol import DataProto


def rows(n: int) -> DataProto:
    return DataProto.from_dict({"ids": torch.arange(n), "x": torch.arange(n * 2).view(n, 2)}, meta_info={"step": 3})


def tp_layout(dp: int, tp: int, dp_order: list[int]) -> list[DispatchInfo]:
    """Ranks in TP groups of `tp` (tp fastest); TP group g is dp rank dp_order[g]; tp rank 0 collects."""
    return [DispatchInfo(dp_order[rank // tp], dp, rank % tp == 0) for rank in range(dp * tp)]


# ---------------------------------------------------------------------------------------------
# DP_COMPUTE
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    dp=st.integers(1, 4),
    tp=st.integers(1, 3),
    per_dp=st.integers(0, 4),
    data=st.data(),
)
def test_dp_compute_round_trip(dp, tp, per_dp, data):
    order = data.draw(st.permutations(range(dp)))
    infos = tp_layout(dp, tp, order)
    batch = rows(dp * per_dp)
    calls = split(Dispatch.DP_COMPUTE, "actor.f", (batch, "extra"), {"k": 1}, dp * tp, infos)
    assert len(calls) == dp * tp
    results = []
    for rank, (args, kwargs) in enumerate(calls):
        chunk = args[0]
        # dp rank d holds rows d*per_dp .. (d+1)*per_dp - 1, whichever rank it sits on
        d = infos[rank].dp_rank
        assert len(chunk) == per_dp and chunk.batch["ids"].tolist() == list(range(d * per_dp, (d + 1) * per_dp))
        assert args[1:] == ("extra",) and kwargs == {"k": 1}
        assert chunk.meta_info == {"step": 3}
        out = chunk.select(tensor_keys=["ids"])
        out.batch["rank"] = torch.full((len(chunk),), rank)
        results.append(out)
    merged = gather(Dispatch.DP_COMPUTE, "actor.f", results, infos)
    assert merged.batch["ids"].tolist() == list(range(dp * per_dp))  # back in dp order = the input order
    # the rows of dp rank d come from the collecting rank of that dp rank: tp * order.index(d)
    expected_rank = [tp * order.index(d) for d in range(dp) for _ in range(per_dp)]
    assert merged.batch["rank"].tolist() == expected_rank


def test_dp_compute_gathers_plain_results_as_a_list_in_dp_order():
    # Two ranks, rank 0 holds dp rank 1 and rank 1 holds dp rank 0: the list follows dp ranks.
    infos = [DispatchInfo(1, 2, True), DispatchInfo(0, 2, True)]
    assert gather(Dispatch.DP_COMPUTE, "a.f", ["from rank 0", "from rank 1"], infos) == ["from rank 1", "from rank 0"]


def test_dp_compute_with_dp_smaller_than_world_sends_the_whole_batch_to_each_tp_rank():
    infos = tp_layout(dp=1, tp=2, dp_order=[0])  # TP=2: one dp rank over both ranks, rank 0 collects
    batch = rows(4)
    calls = split(Dispatch.DP_COMPUTE, "a.f", (batch,), {}, 2, infos)
    assert [c[0][0].batch["ids"].tolist() for c in calls] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert gather(Dispatch.DP_COMPUTE, "a.f", ["rank0", "rank1"], infos) == ["rank0"]


def test_dp_compute_refuses_a_batch_that_does_not_split():
    with pytest.raises(ValueError) as err:
        split(Dispatch.DP_COMPUTE, "actor.compute_log_prob", (rows(5),), {}, 2, tp_layout(2, 1, [0, 1]))
    message = str(err.value)
    assert "actor.compute_log_prob" in message and "dp_size=2" in message and "5 rows" in message
    assert "5 % 2 = 1" in message


def test_dp_compute_needs_a_dataproto_first():
    with pytest.raises(TypeError, match=r"actor\.update.*first positional argument must be a DataProto, got dict"):
        split(Dispatch.DP_COMPUTE, "actor.update", ({"ids": [1]},), {}, 1, [DispatchInfo(0, 1, True)])
    with pytest.raises(TypeError, match="got no positional argument"):
        split(Dispatch.DP_COMPUTE, "actor.update", (), {"data": rows(2)}, 1, [DispatchInfo(0, 1, True)])


def test_dp_compute_names_dataprotos_that_do_not_concatenate():
    infos = [DispatchInfo(0, 2, True), DispatchInfo(1, 2, True)]
    a, b = rows(1), rows(1)
    b.meta_info["step"] = 4
    with pytest.raises(ValueError, match=r"actor\.f: the dp ranks' DataProtos cannot be concatenated.*step"):
        gather(Dispatch.DP_COMPUTE, "actor.f", [a, b], infos)


# ---------------------------------------------------------------------------------------------
# The other modes
# ---------------------------------------------------------------------------------------------


def test_one_to_all():
    args, kwargs = (1, [2]), {"k": "v"}
    assert split(Dispatch.ONE_TO_ALL, "r.f", args, kwargs, 3) == [(args, kwargs)] * 3
    assert gather(Dispatch.ONE_TO_ALL, "r.f", ["a", "b", "c"]) == ["a", "b", "c"]


# ---------------------------------------------------------------------------------------------
# Dispatch infos
# ---------------------------------------------------------------------------------------------


def info(dp_rank: int, dp_size: int, collect: bool = True) -> dict:
    return {"dp_rank": dp_rank, "dp_size": dp_size, "collect": collect}


def test_read_dispatch_infos_accepts_a_tp_layout():
    got = read_dispatch_infos("actor", [info(0, 2), info(0, 2, False), info(1, 2), info(1, 2, False)])
    assert got == [
        DispatchInfo(0, 2, True),
        DispatchInfo(0, 2, False),
        DispatchInfo(1, 2, True),
        DispatchInfo(1, 2, False),
    ]


@pytest.mark.parametrize(
    "infos, message",
    [
        ([info(0, 2), info(1, 1)], "ranks disagree on dp_size (rank 0: 2, rank 1: 1)"),
        ([info(0, 2), info(2, 2)], "rank 1 reports dp_rank=2 outside 0..1"),
        ([info(0, 2), info(0, 2, False)], "no rank has dp_rank=1"),
        ([info(0, 1), info(0, 1)], "dp_rank 0 (ranks [0, 1]) must have exactly one rank with collect=True, found 2"),
        ([info(0, 1, False), info(0, 1, False)], "found 0"),
        ([info(0, 3), info(1, 3)], "dp_size=3 must be between 1 and the world size 2"),
        ([{"dp_rank": 0, "dp_size": 1}], "rank 0's dispatch_info() lacks collect"),
    ],
)
def test_read_dispatch_infos_errors(infos, message):
    with pytest.raises(ValueError) as err:
        read_dispatch_infos("critic", infos)
    assert "role 'critic'" in str(err.value) and message in str(err.value)


def test_worker_dispatch_info_default_and_set():
    worker = Worker()  # outside a group: rank 0 of 1
    assert worker.dispatch_info() == info(0, 1)
    worker.set_dispatch_info(0, 1, False)
    assert worker.dispatch_info() == info(0, 1, False)
    with pytest.raises(ValueError, match="dp_rank=2 must be in 0..dp_size-1"):
        worker.set_dispatch_info(2, 2, True)


def test_worker_dispatch_info_per_mesh_falls_back_to_train():
    worker = Worker()
    assert worker.dispatch_info("rollout") == info(0, 1)
    worker.set_dispatch_info(0, 1, False)  # train
    assert worker.dispatch_info("rollout") == info(0, 1, False)  # unset: the train layout
    worker.set_dispatch_info(0, 1, True, mesh="rollout")
    assert worker.dispatch_info("rollout") == info(0, 1) and worker.dispatch_info() == info(0, 1, False)


def test_register_records_the_mesh():
    class W(Worker):
        @register(Dispatch.DP_COMPUTE, mesh="rollout")
        def gen(self, data):
            return data

        @register(Dispatch.DP_COMPUTE)
        def train(self, data):
            return data

    specs = registered_methods(W)
    assert specs["gen"].mesh == "rollout" and specs["train"].mesh == "train"
    with pytest.raises(TypeError, match="register\\(mesh=...\\) takes a layout name"):
        register(Dispatch.DP_COMPUTE, mesh="")


# ---------------------------------------------------------------------------------------------
# @register
# ---------------------------------------------------------------------------------------------


class Base(Worker):
    @register(Dispatch.DP_COMPUTE)
    def compute(self, data):
        return data

    @register
    def setup(self):
        return "base"

    @register(Dispatch.DP_COMPUTE, mesh="rollout")
    def save(self):
        return None

    def helper(self):
        return None


class Child(Base):
    def compute(self, data):  # an undecorated override keeps DP_COMPUTE
        return data

    @register(Dispatch.ONE_TO_ALL)
    def save(self):  # a decorated override wins
        return None


def test_registered_methods_follow_the_mro():
    base = registered_methods(Base)
    assert {n: (s.dispatch, s.mesh) for n, s in base.items()} == {
        "compute": (Dispatch.DP_COMPUTE, "train"),
        "setup": (Dispatch.ONE_TO_ALL, "train"),
        "save": (Dispatch.DP_COMPUTE, "rollout"),
    }
    child = registered_methods(Child)
    assert child["compute"].dispatch is Dispatch.DP_COMPUTE
    assert (child["save"].dispatch, child["save"].mesh) == (Dispatch.ONE_TO_ALL, "train")
    assert "helper" not in child and "dispatch_info" not in child


def test_register_rejects_a_non_dispatch():
    with pytest.raises(TypeError, match="takes a Dispatch .*Dispatch.DP_COMPUTE.* got 'dp_compute'"):
        register("dp_compute")
    with pytest.raises(TypeError, match="decorates a plain method"):
        register(Dispatch.ONE_TO_ALL)(staticmethod(lambda: None))


# ---------------------------------------------------------------------------------------------
# WorkerError
# ---------------------------------------------------------------------------------------------


def test_worker_error_groups_ranks_with_the_same_traceback_and_pickles():
    tb = 'ray::A.f() (pid={pid}, ip=1.2.3.4, actor_id=ab)\n  File "w.py", line 3, in f\nValueError: boom'
    err = WorkerError(
        "actor",
        "f",
        {2: tb.format(pid=12), 0: tb.format(pid=10), 1: "KeyError: 'x'"},
        {0: ValueError("boom")},
        world_size=4,
        unfinished=[3],
    )
    text = str(err)
    assert text.startswith("role 'actor': method 'f' failed on ranks 0, 1, 2 (of 4)")
    assert "rank 3 had not finished" in text
    assert "--- ranks 0, 2: worker traceback ---" in text and "--- rank 1: worker traceback ---" in text
    assert text.count("ValueError: boom") == 1
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == text and again.ranks == [0, 1, 2] and isinstance(again.causes[0], ValueError)


# ---------------------------------------------------------------------------------------------
# Pools and Ray start-up arguments
# ---------------------------------------------------------------------------------------------


def test_pools_from_plan_splits_runs_of_ranks_by_node():
    # 2 nodes x 4 devices; pool 'train' takes ranks 0..5 (node 0: 4, node 1: 2), 'gen' ranks 6..7 (node 1: 2).
    cfg = make_cfg(
        {
            "placement": {
                "nnodes": 2,
                "devices_per_node": 4,
                "pools": [
                    {"name": "train", "roles": ["actor"], "devices": 6},
                    {"name": "gen", "roles": ["rollout"]},
                ],
            },
            "actor": {"parallel": {"tp": 1}},
            "rollout": {"parallel": {"tp": 1}},
        }
    )
    plan, problems = make_plan(cfg)
    assert plan is not None, problems
    pools = pools_from_plan(plan, cpus_per_device=2.0)
    assert sorted(pools) == ["gen", "train"]
    assert (pools["train"].nnodes, pools["train"].node_sizes, pools["train"].world_size) == (2, (4, 2), 6)
    assert (pools["gen"].nnodes, pools["gen"].node_sizes, pools["gen"].world_size) == (1, (2,), 2)
    assert pools["train"].bundle() == {"CPU": 2.0}


def test_pools_from_plan_whole_nodes():
    cfg = make_cfg({"placement": {"nnodes": 2, "devices_per_node": 2, "device": "cuda"}})
    plan, problems = make_plan(cfg)
    assert plan is not None, problems
    (pool,) = pools_from_plan(plan).values()
    assert (pool.name, pool.nnodes, pool.devices_per_node, pool.node_devices) == ("hybrid", 2, 2, None)
    assert pool.world_size == 4 and pool.bundle() == {"GPU": 1.0, "CPU": 1.0}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nnodes": 0, "devices_per_node": 1}, "nnodes must be an int >= 1, got 0"),
        ({"nnodes": 1, "devices_per_node": 1, "device": "tpu"}, "device must be one of cpu, cuda, got 'tpu'"),
        ({"nnodes": 1, "devices_per_node": 1, "cpus_per_device": 0}, "cpus_per_device must be > 0 on a cpu pool"),
        ({"nnodes": 2, "devices_per_node": 2, "node_devices": (2,)}, "node_devices=(2,) must have nnodes=2 entries"),
    ],
)
def test_resource_pool_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError) as err:
        ResourcePool("p", **kwargs)
    assert "ResourcePool 'p'" in str(err.value) and message in str(err.value)


def test_init_ray_refuses_sizes_for_an_existing_cluster(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    with pytest.raises(ValueError, match=r"num_cpus/num_gpus size a new local cluster, but address='10.0.0.1:6379'"):
        init_ray(num_cpus=2)


def test_a_call_counts_the_tensors_inside_an_object_column():
    """perf/worker_bytes_sent: an image run's rows carry their pixels in a non-tensor column (a dict of tensors per
    row); those bytes count, as the batch's tensors do."""
    import numpy as np

    from verl.controller.worker_group import payload_bytes

    pixels = [{"pixel_values": torch.zeros(16, 1176), "image_grid_thw": torch.ones(1, 3, dtype=torch.long)}, {}]
    column = np.empty(2, dtype=object)
    column[:] = pixels
    batch = DataProto.from_dict({"input_ids": torch.zeros(2, 5, dtype=torch.long)}, {"multi_modal_inputs": column})
    assert payload_bytes(batch) == 2 * 5 * 8 + 16 * 1176 * 4 + 3 * 8
