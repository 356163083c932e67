"""A megatron actor's weight sync to a rollout pool of its own: rank 0 sending assembled tensors, or every rank its
own pieces.

    python benchmarks/megatron_weight_senders.py [--layouts tp2,pp2,tp2pp2] [--repeats 2] [--out FILE]

A random Llama (`SHAPE`, float32) is loaded by the megatron engine in each layout on gloo processes, and its
weights go to one rollout rank over the transfer group (verl.workers.weight_transfer, loopback), two ways:

- `rank 0 sends`: the ranks assemble each whole tensor (`weights()`: tensor-parallel all-gathers, pipeline
  broadcasts) and rank 0 broadcasts it;
- `every rank its pieces`: each rank sends its tensor-parallel piece of its own stage's tensors
  (`weight_shards()`), the receiver joins them; nothing is gathered on the actor's side.

The receiver checks every tensor of the second way bitwise against the first. Reported per layout and way: the
busiest sender's bytes and their share of the model, the bytes that moved between the actor's own ranks to
assemble tensors, and the receiver's seconds per sync (median of --repeats after a warm-up). All processes share
this machine's cores: the bytes are what carries over to a cluster, the seconds say little.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [str(ROOT / "packages" / p / "src") for p in ("verl-core", "verl-kernels", "verl-megatron")]
sys.path[:0] = SOURCES

from machine import machine_line, write_report  # noqa: E402

from verl.controller.worker import free_port  # noqa: E402

MB = 1 << 20
SHAPE = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
LAYOUTS = {"tp2": dict(tp=2), "pp2": dict(pp=2), "tp2pp2": dict(tp=2, pp=2)}
WAYS = ("rank 0 sends", "every rank its pieces")


def _model(path: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SHAPE)).save_pretrained(path)
    return path


def _member(rank: int, world: int, ports: tuple, parallel: dict, model: str, repeats: int, results) -> None:
    from verl.workers.weight_transfer import (
        TransferStats,
        join_transfer_group,
        receive_weights,
        send_weight_shards,
        send_weights,
    )

    torch.set_num_threads(1)
    receiver, cpu = rank == world, torch.device("cpu")
    groups = {}
    engine = None
    if not receiver:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank, world_size=world)
        from verl.engine_protocol import EngineConfig
        from verl_megatron.engine import MegatronEngine

        sizes = {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": None, "sequence_parallel": None, **parallel}
        cfg = EngineConfig(model_path=model, dtype="float32", parallel=types.SimpleNamespace(**sizes))
        engine = MegatronEngine(cfg)
    # the one-sender group holds rank 0 and the receiver; the pieces group every rank
    if rank in (0, world):
        groups[WAYS[0]] = join_transfer_group("127.0.0.1", ports[1], int(receiver), 2, "gloo", 600)
    groups[WAYS[1]] = join_transfer_group("127.0.0.1", ports[2], rank, world + 1, "gloo", 600)
    want: dict = {}
    out = {}
    for way in WAYS:
        seconds, sent, gathered = [], 0, 0
        for repeat in range(repeats + 1):  # the first is a warm-up, checked bitwise
            start = time.perf_counter()
            if receiver:
                stats = TransferStats()
                for name, t in receive_weights(groups[way], cpu, stats, senders=1 if way == WAYS[0] else world):
                    if repeat == 0 and way == WAYS[0]:
                        want[name] = t.clone()
                    elif repeat == 0:
                        assert torch.equal(t, want.pop(name)), name
                if repeat == 0 and way == WAYS[1]:
                    assert not want, f"never sent: {sorted(want)}"
                sent = stats.bytes  # the receiver's: the whole model
            elif way == WAYS[0]:
                # every rank takes part in assembling the tensors; rank 0 alone is in the group and sends them
                sent = send_weights(groups.get(way), engine.weights(), version=repeat, device=cpu).bytes
                gathered = engine.sync_received_bytes()
            else:
                shards = engine.weight_shards()
                sent = send_weight_shards(groups[way], shards, senders=world, version=repeat, device=cpu).bytes
                gathered = engine.sync_received_bytes()
            seconds.append(time.perf_counter() - start)
        out[way] = (sent, gathered, statistics.median(seconds[1:]))
    results[rank] = out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "megatron_weight_senders_cpu.md"))
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([*SOURCES, os.environ.get("PYTHONPATH", "")])
    rows, total = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        model = _model(os.path.join(tmp, "llama"))
        for name in args.layouts.split(","):
            parallel = LAYOUTS[name]
            world = parallel.get("tp", 1) * parallel.get("pp", 1)
            results = mp.Manager().dict()
            ports = (free_port(), free_port(), free_port())
            mp.spawn(_member, args=(world, ports, parallel, model, args.repeats, results), nprocs=world + 1)
            total = results[world][WAYS[0]][0]
            for way in WAYS:
                busiest = max(results[r][way][0] for r in range(world))
                gathered = sum(results[r][way][1] for r in range(world))
                seconds = results[world][way][2]
                rows.append(
                    f"| {name} | {world} | {way} | {busiest / MB:.1f} | {busiest / total:.2f} | "
                    f"{gathered / MB:.1f} | {seconds:.2f} |"
                )
                print(rows[-1], flush=True)
    lines = [
        "# Megatron weight sync: rank 0 sending assembled tensors, or every rank its pieces "
        "(benchmarks/megatron_weight_senders.py)",
        "",
        f"{time.strftime('%Y-%m-%d')}; {machine_line()}; a random Llama {SHAPE} in float32 ({total / MB:.0f} MiB), "
        f"256 MiB buckets, gloo over loopback, one receiver; the pieces checked bitwise against the assembled "
        f"tensors; seconds: the receiver's, median of {args.repeats} syncs after a warm-up.",
        "",
        "| layout | actor ranks | way | busiest sender MiB | share of the model | gathered on the actor MiB | sync s |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
