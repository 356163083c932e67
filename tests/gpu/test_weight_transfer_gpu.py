"""The transfer group between pools over NCCL: one sender and two receivers, each on a GPU of its own (NCCL puts
one rank on a device), every tensor bitwise across buckets, and the transfer's GB/s reported; and two senders each
sending its block of every tensor (an FSDP actor's dim-0 rows; megatron's column blocks of a row-parallel
projection) to one receiver.

Skipped without 3 CUDA devices (NCCL refuses two ranks on one GPU); the same protocol over gloo runs on CPU in
tests/core/workers/test_weight_transfer.py."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from verl.controller.worker import free_port
from verl.engine_protocol import Shard
from verl.workers.weight_transfer import (
    TransferStats,
    join_transfer_group,
    receive_weights,
    send_weight_shards,
    send_weights,
)

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 3, reason=f"needs 3 CUDA devices, found {torch.cuda.device_count()}"
)

MB = 1 << 20


def _weights(device: torch.device) -> list:
    g = torch.Generator().manual_seed(0)
    shapes = [(4096, 1024), (1024,), (1024, 4096), (333,), (4096, 4096)]
    return [(f"w{i}", torch.randn(s, generator=g).to(torch.bfloat16).to(device)) for i, s in enumerate(shapes)]


def _member(rank: int, port: int, out) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    group = join_transfer_group("127.0.0.1", port, rank, 3, "nccl", timeout_s=120)
    if rank == 0:
        stats = send_weights(group, iter(_weights(device)), version=3, device=device, bucket_bytes=16 * MB)
        out.put((rank, stats.metrics(), None))
        return
    stats = TransferStats()
    got = {n: t.cpu().clone() for n, t in receive_weights(group, device, stats)}
    want = {n: t.cpu() for n, t in _weights(torch.device("cpu"))}
    same = got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
    out.put((rank, stats.metrics(), (same, stats.version)))


def _run(member) -> dict:
    """Three processes (a GPU each) running member(rank, port, out); each puts (rank, metrics, check)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=member, args=(r, port, out)) for r in range(3)]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        rank, metrics, check = out.get(timeout=300)
        results[rank] = (metrics, check)
    for p in procs:
        p.join(timeout=60)
    return results


def test_nccl_transfer_is_bitwise_and_measured():
    results = _run(_member)
    sender = results[0][0]
    print(
        f"NCCL weight transfer: {sender['perf/weight_sync_bytes'] / 1e6:.1f} MB in {sender['timing/weight_sync_s']:.4f} s = "
        f"{sender['perf/weight_sync_gbps']:.2f} GB/s, {sender['perf/weight_sync_buckets']:.0f} buckets"
    )
    for rank in (1, 2):
        same, version = results[rank][1]
        assert same and version == 3, rank


def _sharded_member(rank: int, port: int, out) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    group = join_transfer_group("127.0.0.1", port, rank, 3, "nccl", timeout_s=120)
    if rank < 2:  # two senders, each its torch.chunk rows of every tensor, or its columns of (1024, 4096)
        shards = [
            Shard(n, t.chunk(2, 1)[rank], tuple(t.shape), 1, [t.shape[1] // 2] * 2)
            if tuple(t.shape) == (1024, 4096)
            else Shard(n, t.chunk(2)[rank], tuple(t.shape))
            for n, t in _weights(device)
        ]
        stats = send_weight_shards(group, shards, senders=2, version=4, device=device, bucket_bytes=16 * MB)
        out.put((rank, stats.metrics(), None))
        return
    stats = TransferStats()
    got = {n: t.cpu().clone() for n, t in receive_weights(group, device, stats, senders=2)}
    want = {n: t.cpu() for n, t in _weights(torch.device("cpu"))}
    same = got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
    out.put((rank, stats.metrics(), (same, stats.version)))


def test_nccl_blocks_from_two_senders_are_bitwise():
    results = _run(_sharded_member)
    total = sum(t.numel() * t.element_size() for _, t in _weights(torch.device("cpu")))
    sent = [results[r][0]["perf/weight_sync_bytes"] for r in (0, 1)]
    print(f"NCCL row shards: {sent[0] / 1e6:.1f} + {sent[1] / 1e6:.1f} MB of {total / 1e6:.1f} MB")
    assert sum(sent) == total and max(sent) < 0.6 * total
    same, version = results[2][1]
    assert same and version == 4
