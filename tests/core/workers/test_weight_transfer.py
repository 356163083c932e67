"""Weight transfer between pools: one sender and two receivers in a transfer group of their own (gloo, three
processes), as the actor's rank 0 and a rollout pool of two ranks. Every tensor arrives bitwise, whatever its
dtype and shape, across bucket boundaries and with tensors larger than a bucket."""

from __future__ import annotations

import io
import multiprocessing as mp
import queue

import pytest
import torch

from verl.controller.worker import free_port
from verl.workers.weight_transfer import TransferStats, join_transfer_group, receive_weights, send_weights

pytestmark = pytest.mark.slow  # a multi-process gloo world (the fast tier skips it; tests/BUILD tags it too)


def _weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(50, 8, generator=g)),
        ("norm.weight", torch.randn(8, generator=g).to(torch.bfloat16)),  # 16 bytes: alignment of what follows
        ("odd", torch.randn(3, generator=g).to(torch.float16)),  # 6 bytes
        ("big", torch.randn(300, generator=g)),  # 1200 bytes: larger than the 1 KiB buckets
        ("count", torch.tensor(7, dtype=torch.int64)),  # 0-dim
        ("transposed", torch.randn(4, 6, generator=g).t()),  # not contiguous
        ("flags", torch.tensor([True, False, True])),
    ]


def _member(rank: int, port: int, bucket: int, out: "mp.Queue") -> None:
    group = join_transfer_group("127.0.0.1", port, rank, 3, "gloo", timeout_s=60)
    if rank == 0:
        stats = send_weights(group, iter(_weights()), version=5, device=torch.device("cpu"), bucket_bytes=bucket)
        out.put((rank, stats.bytes, stats.buckets, None))
        return
    stats = TransferStats()
    got = {name: t.clone() for name, t in receive_weights(group, torch.device("cpu"), stats)}
    # Tensors put on a queue travel as shared-memory handles that the receiver opens through this process, which
    # may have exited by then: send them serialized, by value.
    buffer = io.BytesIO()
    torch.save(got, buffer)
    out.put((rank, stats.bytes, stats.buckets, (stats.version, buffer.getvalue())))


def test_every_tensor_arrives_bitwise_in_buckets(bucket=1024):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_member, args=(r, port, bucket, out)) for r in range(3)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in procs:
            rank, nbytes, buckets, got = out.get(timeout=120)
            results[rank] = (nbytes, buckets, got)
    except queue.Empty:
        pytest.fail(f"the transfer group did not finish within 120 s (results from ranks {sorted(results)})")
    finally:
        for p in procs:
            p.join(timeout=30)
    want = dict(_weights())
    total = sum(t.numel() * t.element_size() for t in want.values())
    sent_bytes, sent_buckets, _ = results[0]
    assert sent_bytes == total
    assert sent_buckets == 4  # 1 KiB buckets: embed | norm, odd | big (larger than a bucket) | the rest
    for rank in (1, 2):
        nbytes, buckets, (version, saved) = results[rank]
        got = torch.load(io.BytesIO(saved))
        assert (nbytes, buckets, version) == (total, sent_buckets, 5)
        assert list(got) == list(want)  # in the sender's order
        for name, tensor in want.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
            assert torch.equal(got[name], tensor), name
