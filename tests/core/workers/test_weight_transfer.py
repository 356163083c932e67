"""Weight transfer between pools: one sender and two receivers in a transfer group of their own (gloo, three
processes), as the actor's rank 0 and a rollout pool of two ranks; and two senders each sending its block of every
tensor (an FSDP actor's dim-0 rows; megatron's column blocks of a row-parallel projection). Every tensor arrives bitwise, whatever its dtype and shape, across bucket boundaries and
with tensors larger than a bucket."""

from __future__ import annotations

import io
import multiprocessing as mp
import queue

import pytest
import torch

from verl.controller.worker import free_port
from verl.engine_protocol import Shard
from verl.workers.weight_transfer import (
    TransferStats,
    block_bytes,
    join_transfer_group,
    receive_weights,
    row_block_bytes,
    send_weight_shards,
    send_weights,
)

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


def _run(member, world: int, *args) -> dict:
    """Start `world` processes running member(rank, port, *args, out); each puts (rank, *result): {rank: result}."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=member, args=(r, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in procs:
            rank, *result = out.get(timeout=120)
            results[rank] = tuple(result)
    except queue.Empty:
        pytest.fail(f"the transfer group did not finish within 120 s (results from ranks {sorted(results)})")
    finally:
        for p in procs:
            p.join(timeout=30)
    return results


def test_every_tensor_arrives_bitwise_in_buckets(bucket=1024):
    results = _run(_member, 3, bucket)
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


def _rows(t: torch.Tensor, rank: int, senders: int) -> torch.Tensor:
    """This sender's rows as FSDP holds them (torch.chunk over dim 0; none for the last ranks of a short tensor)."""
    if t.dim() == 0:
        return t if rank == 0 else t.new_empty((0,))
    chunks = torch.chunk(t.contiguous(), senders, dim=0)
    return chunks[rank] if rank < len(chunks) else t.new_empty((0, *t.shape[1:]))


def _columns() -> list[tuple[str, torch.Tensor, list[int]]]:
    """Tensors the senders hold as column blocks (megatron's row-parallel projections), with each sender's columns;
    one held by the first sender alone (a norm on tp rank 0)."""
    g = torch.Generator().manual_seed(1)
    return [
        ("o_proj.weight", torch.randn(6, 10, generator=g), [7, 3]),
        ("down.weight", torch.randn(2, 3, 4, generator=g).to(torch.bfloat16), [3, 0]),
    ]


def _sharded_member(rank: int, port: int, senders: int, world: int, out: "mp.Queue") -> None:
    group = join_transfer_group("127.0.0.1", port, rank, world, "gloo", timeout_s=60)
    weights = _weights() + [("short", torch.randn(1, 5))]  # one row: the second sender holds none of it
    if rank < senders:
        shards = [Shard(name, _rows(t, rank, senders), tuple(t.shape)) for name, t in weights]
        for name, t, sizes in _columns():  # joined along dim 1
            start = sum(sizes[:rank])
            shards.append(Shard(name, t.narrow(1, start, sizes[rank]), tuple(t.shape), 1, sizes))
        stats = send_weight_shards(
            group, shards, senders=senders, version=2, device=torch.device("cpu"), bucket_bytes=1024
        )
        out.put((rank, stats.bytes, None))
        return
    stats = TransferStats()
    got = {name: t.clone() for name, t in receive_weights(group, torch.device("cpu"), stats, senders=senders)}
    buffer = io.BytesIO()
    torch.save(got, buffer)
    out.put((rank, stats.bytes, buffer.getvalue()))


def test_each_sender_sends_its_blocks_and_receivers_get_whole_tensors(senders=2, world=4):
    results = _run(_sharded_member, world, senders, world)
    torch.manual_seed(0)
    want = dict(_weights() + [("short", torch.zeros(1, 5))] + [(n, t) for n, t, _ in _columns()])
    total = sum(t.numel() * t.element_size() for t in want.values())
    sent = [results[r][0] for r in range(senders)]
    assert sum(sent) == total and max(sent) < 0.6 * total  # each sender about half
    for rank in range(senders, world):
        nbytes, saved = results[rank]
        got = torch.load(io.BytesIO(saved))
        assert nbytes == total and list(got) == list(want)
        for name, tensor in want.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
            if name != "short":  # (random in each sender process)
                assert torch.equal(got[name], tensor), name


def test_senders_blocks_must_make_up_the_tensor():
    assert block_bytes(Shard("o_proj.weight", torch.zeros(6, 7), (6, 10), 1, [7, 3]), 2) == [168, 72]
    with pytest.raises(RuntimeError, match=r"o_proj.weight: the senders' blocks \[7, 4\] along dim 1"):
        block_bytes(Shard("o_proj.weight", torch.zeros(6, 7), (6, 10), 1, [7, 4]), 2)


def test_row_blocks_follow_torch_chunk():
    assert row_block_bytes((5, 2), 2, 4) == [24, 16]  # rows 3 + 2
    assert row_block_bytes((1, 3), 4, 2) == [6, 0, 0, 0]
    assert row_block_bytes((), 3, 8) == [8, 0, 0]
    assert row_block_bytes((6,), 4, 1) == [2, 2, 2, 0]  # torch.chunk: 3 chunks of 2, the 4th rank none
