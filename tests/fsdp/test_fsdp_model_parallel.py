"""The fsdp engine split over two gloo ranks by tensor parallelism (parallel.tp=2: the model's declared plan on its
decoder layers) or Ulysses sequence parallelism (parallel.cp=2): log-probs, entropy and values within 1e-5 of one
rank, and one optimizer step within 1e-6, on packed (shared-prefix) and padded rows; each rank holds what the
memory model says."""

from __future__ import annotations

import io
import os
import queue

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from transformers import AutoConfig

from tests.support.engines import free_port, grouped_batch
from tests.support.megatron_workers import random_model_dir
from verl_fsdp.memory_model import state_bytes

pytestmark = pytest.mark.slow

VOCAB = 37


def _loss(out, mb):
    mask = mb.batch["response_mask"].float()
    value = -(out["log_probs"] * mb.batch["advantages"] * mask).sum() / mask.sum() - 0.01 * out["entropy"].mean()
    return value, {"loss": value.detach()}


def _member(rank: int, port: int, world: int, path: str, parallel: dict, packed: bool, out, device: str) -> None:
    import torch.distributed as dist

    from verl.config.schema import OptimConfig, ParallelConfig
    from verl.engine_protocol import EngineConfig
    from verl_fsdp.engine import FSDPEngine

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    # eps=1: Adam's first update ~ lr * g, so the weights compare gradients (no sign flips of rounding-level ones)
    optim = OptimConfig(lr=1e-2, eps=1.0, weight_decay=0.0)
    common = dict(model_path=path, total_steps=10, shared_prefix=packed, parallel=ParallelConfig(**parallel))
    common.update(device=device, dtype="float32")
    engine = FSDPEngine(EngineConfig(optim=optim, **common))
    critic = FSDPEngine(EngineConfig(kind="value", **common))
    batch = grouped_batch(prompts=3, n=4, vocab=VOCAB)
    infer = engine.infer(batch, micro_batch_size=6, temperature=0.7, entropy=True)
    values = critic.infer(batch, micro_batch_size=12)
    metrics = engine.train_step(batch, _loss, micro_batch_size=6, temperature=0.7, entropy=True)
    weights = {name: t.clone() for name, t in engine.weights()}
    result = dict(
        log_probs=infer.batch["log_probs"],
        entropy=infer.batch["entropy"],
        values=values.batch["values"],
        metrics=metrics,
        weights=weights,
        info=engine.data_parallel_info(),
        held=engine.held_bytes(),
        in_place=engine.gathered is not None,
    )
    buffer = io.BytesIO()  # by value: a queued tensor is a handle into this process, which may be gone
    torch.save(result, buffer)
    out.put((rank, buffer.getvalue()))
    dist.barrier()
    dist.destroy_process_group()


def run_ranks(world: int, path: str, parallel: dict, packed: bool, device: str = "cpu") -> dict:
    """Each rank's outputs, step and state ({rank: dict}) of an actor and a critic over `world` ranks."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    args = (port, world, path, parallel, packed, out, device)
    procs = [ctx.Process(target=_member, args=(r, *args)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in procs:
            rank, data = out.get(timeout=240)
            results[rank] = torch.load(io.BytesIO(data), weights_only=False)
    except queue.Empty:
        pytest.fail(f"the ranks did not finish within 240 s (results from ranks {sorted(results)})")
    finally:
        for p in procs:
            p.join(timeout=30)
    return results


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> str:
    """Qwen3: per-head q/k norms (replicated, gradients summed over tp ranks), a head_dim of its own."""
    return random_model_dir(str(tmp_path_factory.mktemp("qwen3")), "qwen3", tie=False, layers=2, vocab=VOCAB)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory) -> str:
    """Qwen2: q/k/v biases (split with their projections), tied embeddings."""
    return random_model_dir(str(tmp_path_factory.mktemp("qwen2")), "qwen2", tie=True, layers=2, vocab=VOCAB)


_REFERENCE: dict = {}


def _reference(path: str, packed: bool) -> dict:
    if (path, packed) not in _REFERENCE:
        _REFERENCE[path, packed] = run_ranks(1, path, {}, packed)[0]
    return _REFERENCE[path, packed]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize(
    "model, parallel",
    [("qwen3", dict(tp=2)), ("qwen2", dict(tp=2)), ("qwen3", dict(cp=2))],
    ids=["qwen3-tp2", "qwen2-tp2", "qwen3-cp2"],
)
def test_two_ranks_equal_one(request, model, parallel, packed):
    path = request.getfixturevalue(model)
    want = _reference(path, packed)
    got = run_ranks(2, path, parallel, packed)
    assert [got[r]["info"] for r in (0, 1)] == [(0, 1, True), (0, 1, False)]  # one data-parallel replica
    assert got[0]["in_place"] == ("tp" not in parallel)  # a tp module cannot generate rank by rank
    for rank in (0, 1):  # every rank computes the whole rows (the driver reads rank 0's)
        for key in ("log_probs", "entropy", "values"):
            torch.testing.assert_close(got[rank][key], want[key], rtol=0, atol=1e-5, msg=f"{key} on rank {rank}")
        m, w = got[rank]["metrics"], want["metrics"]
        assert m["loss"] == pytest.approx(w["loss"], rel=1e-6, abs=1e-7)
        assert m["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-5)
        assert got[rank]["weights"].keys() == want["weights"].keys()
        for name, expected in want["weights"].items():
            torch.testing.assert_close(got[rank]["weights"][name], expected, rtol=0, atol=1e-6, msg=name)
    # what rank 0 holds is what the memory model says before launch (tp: the plan's pieces; cp: FSDP over both)
    estimate = state_bytes(AutoConfig.from_pretrained(path), {**parallel, "dp": 1})[0].as_dict()
    assert got[0]["held"] == estimate
    assert estimate["params"] < state_bytes(AutoConfig.from_pretrained(path), {"dp": 1})[0].params * 0.75
    initial = load_file(os.path.join(path, "model.safetensors"))
    assert all(not torch.equal(want["weights"][name], t) for name, t in initial.items())  # the step moved them all
