"""One sender or every trainer rank: what the busiest sender of a weight sync sends, and how long a sync takes.

    python benchmarks/weight_senders.py [--model qwen2.5-0.5b] [--worlds 1,2,4] [--out FILE]

A model's tensors (random values with the shapes of a Hugging Face checkpoint, benchmarks/gpu_weight_sync.py's
table, float32) go from a trainer of `world` ranks to one rollout rank over the transfer group
(verl.workers.weight_transfer, gloo on this machine's loopback), two ways:

- `one sender`: rank 0 holds every whole tensor and broadcasts it (what a megatron actor does after assembling
  them; an FSDP actor used to all-gather each tensor first, a cost not counted here);
- `row shards`: each rank broadcasts the dim-0 rows it holds (FSDP's shards, `send_weight_shards`), and the
  receiver joins them.

Every tensor is checked bitwise on the receiver once. Reported: the busiest sender's bytes and their share of the
model, and the median seconds of --repeats syncs (all processes share this machine's cores, so the seconds say
little about a cluster; the bytes are what scales).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "packages" / "verl-core" / "src")]

from gpu_weight_sync import MODELS, shapes  # noqa: E402
from machine import machine_line, write_report  # noqa: E402

MB = 1 << 20


def tensors(model: str) -> list[tuple[str, torch.Tensor]]:
    """The model's checkpoint tensors (gpu_weight_sync's shapes), random, float32."""
    g = torch.Generator().manual_seed(0)
    return [(name, torch.randn(shape, generator=g)) for name, shape in shapes(model)]


def rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    chunks = torch.chunk(t, world, dim=0)
    return chunks[rank] if rank < len(chunks) else t[:0]


def member(rank: int, world: int, ports: tuple, args, out) -> None:
    from verl.engine_protocol import Shard
    from verl.workers.weight_transfer import (
        TransferStats,
        join_transfer_group,
        receive_weights,
        send_weight_shards,
        send_weights,
    )

    torch.set_num_threads(1)
    receiver = rank == world
    # every rank in the row-shard group; rank 0 and the receiver alone in the one-sender group
    everyone = join_transfer_group("127.0.0.1", ports[0], rank, world + 1, "gloo", timeout_s=600)
    pair = join_transfer_group("127.0.0.1", ports[1], int(receiver), 2, "gloo", 600) if rank in (0, world) else None
    cpu, model, bucket = torch.device("cpu"), tensors(args.model), args.bucket_mb * MB
    result = {}
    for way, group, senders in (("one sender", pair, 1), ("row shards", everyone, world)):
        seconds, sent = [], 0
        for repeat in range(args.repeats + 1):  # the first is a warm-up, checked bitwise
            start = time.perf_counter()
            if receiver:
                stats = TransferStats()
                want = dict(model) if repeat == 0 else {}
                for name, t in receive_weights(group, cpu, stats, senders=senders):
                    assert name not in want or torch.equal(t, want[name]), name
            elif senders > 1:
                shards = (Shard(n, rows(t, rank, world), tuple(t.shape)) for n, t in model)
                sent = send_weight_shards(
                    group, shards, senders=world, version=repeat, device=cpu, bucket_bytes=bucket
                ).bytes
            elif rank == 0:
                sent = send_weights(group, iter(model), version=repeat, device=cpu, bucket_bytes=bucket).bytes
            seconds.append(time.perf_counter() - start)
        result[way] = (sent, statistics.median(seconds[1:]))
    out.put((rank, result))


def run(world: int, args) -> dict:
    from verl.controller.worker import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ports = (free_port(), free_port())
    procs = [ctx.Process(target=member, args=(r, world, ports, args, out)) for r in range(world + 1)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    p.add_argument("--worlds", default="1,2,4")
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "weight_senders_cpu.md"))
    args = p.parse_args(argv)
    total = sum(t.numel() * t.element_size() for _, t in tensors(args.model))
    rows_out = []
    for world in [int(w) for w in args.worlds.split(",")]:
        results = run(world, args)
        for way in ("one sender", "row shards"):
            busiest = max(results[r][way][0] for r in range(world))
            receiver_s = results[world][way][1]
            rows_out.append(f"| {world} | {way} | {busiest / MB:.1f} | {busiest / total:.2f} | {receiver_s:.2f} |")
            print(rows_out[-1], flush=True)
    lines = [
        "# Weight sync senders: one rank or every rank (benchmarks/weight_senders.py)",
        "",
        f"{time.strftime('%Y-%m-%d')}; {machine_line()}; {args.model}'s tensors in float32 "
        f"({total / MB:.0f} MiB), {args.bucket_mb} MiB buckets, gloo over loopback, one receiver; median of "
        f"{args.repeats} syncs after a warm-up checked bitwise.",
        "",
        "| trainer ranks | way | busiest sender MiB | share of the model | sync s (receiver) |",
        "|---|---|---|---|---|",
        *rows_out,
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
