"""FSDP engines split over several processes (tp, cp, dp): each rank's outputs, step and state, by value, for the
parity tests (tests/fsdp/test_fsdp_model_parallel.py on gloo, tests/gpu/test_fsdp_parallel_gpu.py on NCCL)."""

from __future__ import annotations

import io
import os
import queue

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.engines import free_port, grouped_batch

VOCAB = 37  # the vocabulary of the models these tests build


def _loss(out, mb):
    """A policy-gradient term and an entropy bonus: both outputs' gradients exercised."""
    mask = mb.batch["response_mask"].float()
    value = -(out["log_probs"] * mb.batch["advantages"] * mask).sum() / mask.sum() - 0.01 * out["entropy"].mean()
    return value, {"loss": value.detach()}


def _member(
    rank: int, port: int, world: int, path: str, parallel: dict, packed: bool, out, device: str, ckpt: str
) -> None:
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
    resumed = None
    if ckpt:  # a checkpoint of the split engine resumes exactly: the next step equal bit for bit
        engine.save_checkpoint(ckpt)
        again = FSDPEngine(EngineConfig(optim=optim, **common))
        again.load_checkpoint(ckpt)
        for e in (engine, again):
            e.train_step(batch, _loss, micro_batch_size=6, temperature=0.7, entropy=True)
        resumed = all(torch.equal(a, b) for (_, a), (_, b) in zip(engine.weights(), again.weights()))
    result = dict(
        log_probs=infer.batch["log_probs"],
        entropy=infer.batch["entropy"],
        values=values.batch["values"],
        metrics=metrics,
        weights=weights,
        info=engine.data_parallel_info(),
        held=engine.held_bytes(),
        in_place=engine.gathered is not None,
        resumed=resumed,
    )
    buffer = io.BytesIO()  # by value: a queued tensor is a handle into this process, which may be gone
    torch.save(result, buffer)
    out.put((rank, buffer.getvalue()))
    dist.barrier()
    dist.destroy_process_group()


def _image_member(rank: int, port: int, world: int, path: str, batch_bytes: bytes, out) -> None:
    """Data parallel over `world` ranks on image prompts: rank r takes the r-th equal share of the rows."""
    import torch.distributed as dist

    from verl.config.schema import OptimConfig
    from verl.engine_protocol import EngineConfig
    from verl_fsdp.engine import FSDPEngine

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    batch = torch.load(io.BytesIO(batch_bytes), weights_only=False)
    mine = batch.chunk(world)[rank]
    engine = FSDPEngine(
        EngineConfig(model_path=path, total_steps=10, optim=OptimConfig(lr=1e-2, eps=1.0, weight_decay=0.0))
    )
    infer = engine.infer(mine, micro_batch_size=2, temperature=0.7, entropy=True)
    metrics = engine.train_step(mine, _loss, micro_batch_size=2, temperature=0.7, entropy=True)
    result = dict(log_probs=infer.batch["log_probs"], metrics=metrics, weights=dict(engine.weights()))
    buffer = io.BytesIO()
    torch.save(result, buffer)
    out.put((rank, buffer.getvalue()))
    dist.barrier()
    dist.destroy_process_group()


def run_image_ranks(world: int, path: str, batch) -> dict:
    """Each rank's log-probs, step metrics and weights ({rank: dict}) of an FSDP actor over `world` data-parallel
    ranks on `batch` (rows with images: a vision-language model)."""
    buffer = io.BytesIO()
    torch.save(batch, buffer)
    return _spawn(world, _image_member, (path, buffer.getvalue()))


def run_ranks(world: int, path: str, parallel: dict, packed: bool, device: str = "cpu", ckpt: str = "") -> dict:
    """Each rank's outputs, step and state ({rank: dict}) of an actor and a critic over `world` ranks (`ckpt`: also
    save a checkpoint there, resume it in a new engine and say whether the next steps agree bitwise)."""
    return _spawn(world, _member, (path, parallel, packed), (device, ckpt))


def _spawn(world: int, target, args: tuple, after: tuple = ()) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, world, *args, out, *after)) for r in range(world)]
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
