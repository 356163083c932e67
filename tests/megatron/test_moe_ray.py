"""A mixture of experts split over two Ray worker processes (gloo): expert parallelism EP=2 (each rank holds two
of the four experts, tokens sent to them all-to-all), tensor parallelism with the experts split too (TP=ETP=2),
TP=2 attention with whole experts spread over EP=2 (ETP=1), and PP=2. Each gives HF's log-probs and gradient norm,
and streams the model back to HF names bit for bit (experts gathered over ETP and sent from their EP rank)."""

from __future__ import annotations

import contextlib
import sys

import pytest
import ray
import torch
from safetensors.torch import load_file

from tests.support.megatron_workers import (
    EngineWorker,
    check_log_probs,
    check_recorded_routes,
    grouped_batch,
    hf_grad_norm,
    parity_batch,
    random_model_dir,
)
from verl.config.schema import OptimConfig
from verl.controller import ResourcePool, make_worker_group
from verl.protocol import DataProto

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(sys.modules["tests.support.megatron_workers"])


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return random_model_dir(str(tmp_path_factory.mktemp("qwen3_moe")), "qwen3_moe", tie=False, seed=3)


@pytest.fixture(scope="module")
def workers(ray_two_cpus):  # noqa: F811
    """Two EngineWorkers, laid out anew per test (one start-up for the file)."""
    # Half of the two CPUs: the four-worker test below asks for the other half while this group lives (module scope)
    pool = ResourcePool("megatron", nnodes=1, devices_per_node=2, cpus_per_device=0.5)
    group = make_worker_group("ray", pool, EngineWorker, {}, role="megatron", env={"OMP_NUM_THREADS": "1"})

    @contextlib.contextmanager
    def layout(parallel: dict):
        group.call("relayout", parallel)
        yield group

    yield layout
    group.shutdown()
    pool.remove()


@pytest.mark.parametrize(
    "parallel",
    [{"ep": 2}, {"tp": 2}, {"tp": 2, "etp": 1, "ep": 2}, {"pp": 2}],
    ids=["ep2", "tp2_etp2", "tp2_etp1_ep2", "pp2"],
)
def test_log_probs_gradient_and_round_trip_match_hf(workers, model, parallel):
    with workers(parallel) as group:
        group.call("load", "policy", model, OptimConfig(lr=1e-3))
        batch = parity_batch(vocab=37)
        worst = check_log_probs(group.call("infer", "policy", batch), model, batch)
        saved = load_file(f"{model}/model.safetensors")
        for streamed in group.call("hf_weights", "policy"):  # every rank receives the whole model
            assert streamed.keys() == saved.keys()
            assert all(torch.equal(streamed[k], saved[k]) for k in saved)
        short = parity_batch(vocab=37, prompt=4, response=3, padded=False)
        norms = [m["grad_norm"] for m in group.call("train", "policy", short)]
        want = hf_grad_norm(model, short)
        assert all(n == norms[0] for n in norms) and norms[0] == pytest.approx(want, rel=1e-5)
        print(f"qwen3_moe {parallel}: max |log-prob - HF| = {worst:.2e}, grad norm {norms[0]:.6f} vs HF {want:.6f}")


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_tp2_etp1_ep2_pp2_over_four_workers_matches_hf_and_round_trips(ray_two_cpus, tmp_path, family):
    """Every axis at once: attention split over TP=2, whole experts over EP=2 (ETP=1), layers over PP=2."""
    path = random_model_dir(str(tmp_path / family), family, tie=False, seed=5)
    pool = ResourcePool("megatron", nnodes=1, devices_per_node=4, cpus_per_device=0.25)  # (beside `workers`' half)
    parallel = {"tp": 2, "etp": 1, "ep": 2, "pp": 2}
    group = make_worker_group("ray", pool, EngineWorker, parallel, role="megatron", env={"OMP_NUM_THREADS": "1"})
    try:
        group.call("load", "policy", path)
        batch = parity_batch(vocab=37)
        worst = check_log_probs(group.call("infer", "policy", batch), path, batch)
        saved = load_file(f"{path}/model.safetensors")
        for streamed in group.call("hf_weights", "policy"):  # names equal the original safetensors keys, bit for bit
            assert streamed.keys() == saved.keys()
            assert all(torch.equal(streamed[k], saved[k]) for k in saved)
        print(f"{family} {parallel}: max |log-prob - HF| = {worst:.2e}")
    finally:
        group.shutdown()
        pool.remove()


@pytest.mark.parametrize(
    "parallel, load, layout",
    [
        ({"tp": 2}, {}, "packed"),  # sequence parallel: each rank routes half of every pack
        ({"cp": 2}, {}, "packed"),  # each rank routes two chunks of every sequence
        ({"pp": 2}, {"gradient_checkpointing": True}, "packed"),  # routers on both stages; recompute in backward
        ({"pp": 2, "vpp": 2}, {"shared_prefix": False}, "padded"),  # interleaved stages, rotated padded rows
        ({"tp": 2, "etp": 1, "ep": 2}, {"thd": True}, "thd"),  # one stream of real tokens, split by SP
    ],
    ids=["tp2_sp", "cp2", "pp2_recompute", "pp2_vpp2_padded", "tp2_etp1_ep2_thd"],
)
def test_routing_replay_where_ranks_hold_parts_of_sequences_or_layers(workers, model, parallel, load, layout):
    """R2 when no rank holds a whole sequence or every layer: the recorded column, put together on every rank, is
    HF's choice at every position the layout computes, and an update replaying it is the plain update bit for bit
    (tensor, context, pipeline and interleaved stages, recompute, padded rows, packs and THD); other experts give
    another."""
    batch = grouped_batch()
    with workers(parallel) as group:
        group.call("load", "policy", model, OptimConfig(lr=1e-3), **load)
        recorded = group.call("infer", "policy", batch, routes=True)
        for out in recorded:
            check_recorded_routes(out["routed_experts"], model, batch, layout)
        routes = recorded[0]["routed_experts"]
        assert all(torch.equal(out["routed_experts"], routes) for out in recorded)
        plain = group.call("train", "policy", batch)
        group.call("load", "policy", model, OptimConfig(lr=1e-3), **load)
        replayed = group.call("train", "policy", batch.union(DataProto.from_dict({"routed_experts": routes})))
        assert [(m["nll"], m["grad_norm"]) for m in replayed] == [(m["nll"], m["grad_norm"]) for m in plain]
        assert all(m["moe/routes_replayed"] == 1.0 and m["moe/routing_agreement"] == 1.0 for m in replayed)
        group.call("load", "policy", model, OptimConfig(lr=1e-3), **load)
        other = torch.where(routes >= 0, (routes + 1) % 4, routes)
        shifted = group.call("train", "policy", batch.union(DataProto.from_dict({"routed_experts": other})))
        assert abs(shifted[0]["nll"] - plain[0]["nll"]) > 1e-5
