"""Balanced data-parallel ranks (`trainer.balance_ranks`) against generation order, on long-tail GRPO batches.

Two measurements:
1. Rank imbalance (the busiest rank's tokens over the mean rank's) of `--batches` random GRPO batches, 32 prompts
   x 8 samples, prompts of 16-64 tokens, response lengths log-normal in [8, 1024], at DP 2, 4 and 8: in the order
   the samples came (a rank takes consecutive prompt groups) and after `balance_batch`. No model: counts only.
2. The actor update at DP 2: two processes (gloo, one torch thread each) each run the FSDP engine's
   train_step on its chunk of a long-tail batch (8 prompts x 4 samples, responses in [8, 512], a ~20M Llama,
   packed rows); FSDP's collectives make the faster rank wait for the slower one inside the step. Median of
   `--steps` after a warm-up step, for each of `--seeds` batches, in generation order and balanced.

    python benchmarks/balance_ranks.py [--batches 200] [--seeds 3] [--steps 2] [--out benchmarks/results/balance_ranks_cpu.md]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from machine import machine_line, write_report
from packing import make_batch as grpo_batch  # long-tail GRPO rows, a uid per prompt
from packing import make_model  # the same ~20M Llama

HERE = Path(__file__).resolve().parent


def imbalance_table(batches: int) -> list:
    from verl.trainer.balance import balance_batch

    rows = []
    for dp in (2, 4, 8):
        before, after = [], []
        for seed in range(batches):
            _, m = balance_batch(grpo_batch(seed, prompts=32, n=8, max_response=1024), dp, shared_prefix=True)
            before.append(m["perf/rank_imbalance_before"])
            after.append(m["perf/rank_imbalance"])
        rows.append((dp, statistics.mean(before), max(before), statistics.mean(after), max(after)))
    return rows


def _rank(rank: int, port: int, model: str, seed: int, balanced: bool, steps: int, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from verl.config.schema import ActorConfig, OptimConfig
    from verl.engine_protocol import EngineConfig
    from verl.trainer.balance import balance_batch
    from verl.workers.losses import actor_loss_fn
    from verl_fsdp.engine import FSDPEngine

    engine = FSDPEngine(EngineConfig(model_path=model, optim=OptimConfig(lr=1e-6), total_steps=100))
    batch = grpo_batch(seed, prompts=8, n=4, max_response=512)
    if balanced:
        batch, _ = balance_batch(batch, 2, shared_prefix=True)
    mine = batch.chunk(2)[rank]
    loss = actor_loss_fn(ActorConfig(ppo_mini_batch_size=1, loss_agg_mode="token-mean"))
    engine.train_step(mine, loss, micro_batch_size=len(mine))  # warm-up
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        engine.train_step(mine, loss, micro_batch_size=len(mine))
        times.append(time.perf_counter() - start)  # (FSDP's collectives make the faster rank wait inside)
    results[rank] = (statistics.median(times), int(mine.batch["attention_mask"].sum()))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_times(seeds: int, steps: int) -> list:
    model = os.path.join(tempfile.mkdtemp(prefix="verl-balance-"), "llama")
    make_model(model)
    rows = []
    for seed in range(seeds):
        for balanced in (False, True):
            results = mp.Manager().dict()
            mp.spawn(_rank, args=(_free_port(), model, seed, balanced, steps, results), nprocs=2)
            (t0, n0), (t1, n1) = results[0], results[1]
            rows.append((seed, balanced, n0, n1, t0, t1))
            print(f"balance_ranks: seed {seed} balanced={balanced}: tokens {n0}/{n1}, s {t0:.2f}/{t1:.2f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default=str(HERE / "results" / "balance_ranks_cpu.md"))
    args = parser.parse_args()
    table = imbalance_table(args.batches)
    timed = step_times(args.seeds, args.steps)
    lines = [
        "# Balanced data-parallel ranks vs generation order (CPU)",
        "",
        f"Measured {time.strftime('%Y-%m-%dT%H:%M:%S%z')} with `benchmarks/balance_ranks.py --batches "
        f"{args.batches} --seeds {args.seeds} --steps {args.steps}`.",
        "",
        f"- Machine: {machine_line()}",
        "",
        f"## Rank imbalance (busiest rank's tokens / mean), {args.batches} random batches",
        "",
        "32 prompts x 8 samples, prompts 16-64 tokens, responses log-normal in [8, 1024]; a group's prompt counted",
        "once (packed rows).",
        "",
        "| DP | generation order: mean | max | balanced: mean | max |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {dp} | {b:.3f} | {bm:.3f} | {a:.3f} | {am:.3f} |" for dp, b, bm, a, am in table]
    lines += [
        "",
        "## The actor update at DP 2 (FSDP engine, 2 processes, 1 thread each)",
        "",
        "~20M Llama, 8 prompts x 4 samples, responses log-normal in [8, 512]; each rank's train_step time",
        f"(median of {args.steps} after a warm-up; the faster rank waits for the slower in FSDP's collectives).",
        "",
        "| batch | order | tokens rank 0 / 1 | s rank 0 / 1 | step s (slower rank) |",
        "|---|---|---|---|---|",
    ]
    slow = {False: [], True: []}
    for seed, balanced, n0, n1, t0, t1 in timed:
        slow[balanced].append(max(t0, t1))
        order = "balanced" if balanced else "generation"
        lines.append(f"| {seed} | {order} | {n0:,} / {n1:,} | {t0:.2f} / {t1:.2f} | {max(t0, t1):.2f} |")
    ratio = statistics.mean(slow[False]) / statistics.mean(slow[True])
    lines += ["", f"Balanced ranks: **{ratio:.2f}x** the step rate in generation order (mean over the batches)."]
    lines += [
        "",
        "Token counts are balanced, step times need not be: the FSDP engine computes each rank's chunk as packed",
        "rows as wide as its longest prompt group's sequence (verl.utils.shared_prefix), so a rank's cost follows",
        "rows x that width (and attention over it), not its tokens. Token balance pays where an engine's cost",
        "follows tokens (variable-length attention without padded rows); `trainer.balance_ranks` is off by default.",
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
