"""Overlapping generation with training: the same GRPO workload in each trainer.mode, on the same cores.

- `sync_colocated`: grpo_tiny as it ships: one worker holding the actor and the hf rollout (the hybrid engine),
  every core's threads in it; each step generates, then trains.
- `sync_colocated_1t`: the same with one thread: each phase as fast as on one pool of the disaggregated modes,
  so it shows what the overlap itself buys.
- `sync_apart`: grpo_tiny_async with trainer.mode=sync: the rollout on a CPU worker of its own, the actor on
  another (one thread each, the same two cores), weights streamed over the transfer group after each update;
  still one phase at a time, so each pool idles while the other works.
- `one_step_off`: grpo_tiny_async as it ships: the rollout generates step k+1's batch while the actor trains on
  step k's.
- `async`: grpo_tiny_async with trainer.mode=async trainer.max_staleness=2: the rollout service runs up to two
  batches ahead, taking new weights between its 4-token turns.

Each run is the real recipe through the real CLI (warm start cached beforehand), validated every
`--val-every` steps, so the learning curve (held-out greedy accuracy against wall time since the first step
started) comes from the same runs as the throughput. Steps/s and tokens/s are medians over the steps after the
first two (start-up); idle fractions are the pools' busy fractions' complements.

    python benchmarks/async_overlap.py [--steps 150] [--val-every 25] [--out benchmarks/results/async_overlap_cpu.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import machine_line, write_report

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "sync_colocated": ("grpo_tiny", [], "2"),
    "sync_colocated_1t": ("grpo_tiny", [], "1"),
    "sync_apart": ("grpo_tiny_async", ["trainer.mode=sync"], "1"),
    "one_step_off": ("grpo_tiny_async", [], "1"),
    "async": ("grpo_tiny_async", ["trainer.mode=async", "trainer.max_staleness=2"], "1"),
}


def run(mode: str, steps: int, val_every: int, out_dir: str) -> tuple[list[dict], float]:
    recipe, overrides, threads = MODES[mode]
    cmd = [
        sys.executable,
        "-m",
        "verl.cli",
        "train",
        str(ROOT / "recipes" / f"{recipe}.yaml"),
        f"trainer.total_steps={steps}",
        f"trainer.val_every={val_every}",
        "trainer.resume=disable",
        "checkpoint.save_last=false",
        f"trainer.output_dir={out_dir}",
        "tracking.loggers=[jsonl]",
        "tracking.curves=false",
        *overrides,
    ]
    start = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    with open(os.path.join(out_dir, "logs", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f], time.time() - start


def summarize(rows: list[dict]) -> dict:
    steps = [r for r in rows if "timing/step_s" in r]
    later = steps[2:] or steps
    step_s = statistics.median(r["timing/step_s"] for r in later)
    # wall time of the training steps: from the end of the first step (its start is not logged) to the last one's,
    # validation passes excluded
    val_s = sum(r.get("timing/val_s", 0.0) for r in steps)
    first = steps[0]["time"] - steps[0]["timing/step_s"]
    curve = [(r["time"] - first, r["step"], r["val/accuracy"]) for r in rows if "val/accuracy" in r and r["step"] > 0]
    before = next((r["val/accuracy"] for r in rows if r["step"] == 0 and "val/accuracy" in r), None)
    return {
        "step_s": step_s,
        "steps_per_s": 1.0 / step_s,
        "tokens_per_s": statistics.median(r["perf/tokens_per_s"] for r in later),
        "train_idle": 1 - statistics.mean(r.get("perf/train_busy_fraction", float("nan")) for r in later),
        "rollout_idle": 1 - statistics.mean(r.get("perf/rollout_busy_fraction", float("nan")) for r in later),
        "staleness": statistics.mean(r.get("async/staleness_mean", 0.0) for r in steps),
        "sync_s": statistics.median(r.get("timing/weight_sync_s", 0.0) for r in later),
        "curve": curve,
        "before": before,
        "after": curve[-1][2] if curve else None,
        "train_wall_s": steps[-1]["time"] - first - val_s,
    }


def time_to(curve: list[tuple], accuracy: float) -> float | None:
    """Wall seconds (from the first step's start) until held-out accuracy first reached `accuracy`."""
    return next((t for t, _, acc in curve if acc >= accuracy - 1e-9), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--val-every", type=int, default=25)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "async_overlap_cpu.md"))
    parser.add_argument("--work", default="/tmp/verl-async-overlap")
    args = parser.parse_args()

    load = os.getloadavg()[0]
    results, walls = {}, {}
    for mode in args.modes:
        rows, wall = run(mode, args.steps, args.val_every, os.path.join(args.work, mode))
        results[mode], walls[mode] = summarize(rows), wall
    base = results[args.modes[0]]
    lines = [
        "# Overlapping generation with training (trainer.mode) on CPU",
        "",
        f"Measured {time.strftime('%Y-%m-%dT%H:%M:%S%z')} with `benchmarks/async_overlap.py --steps {args.steps} "
        f"--val-every {args.val_every}`.",
        "",
        f"- Machine: {machine_line()}",
        f"- Workload: grpo_tiny's (32 prompts x 8 samples, <= 8 new tokens, 2 mini-batches), {args.steps} steps, "
        f"held-out greedy accuracy every {args.val_every}; `sync_colocated`: 1 worker with 2 threads "
        "(`_1t`: 1 thread); the others: a rollout worker and an actor worker, 1 thread each (the same 2 cores)",
        f"- Load average before: {load:.2f}; wall time per run incl. start-up: "
        + ", ".join(f"{m} {walls[m]:.0f} s" for m in args.modes),
        f"- Ratios against `{args.modes[0]}`, the baseline of the same run",
        "",
        "| mode | s/step | steps/s | tokens/s | x baseline | train idle | rollout idle | staleness | sync s "
        "| accuracy before -> after | training wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in args.modes:
        r = results[mode]
        acc = f"{100 * r['before']:.1f} -> {100 * r['after']:.1f}" if r["before"] is not None else "-"
        lines.append(
            f"| {mode} | {r['step_s']:.3f} | {r['steps_per_s']:.2f} | {r['tokens_per_s']:.0f} | "
            f"**{r['tokens_per_s'] / base['tokens_per_s']:.2f}x** | {_pct(r['train_idle'])} | "
            f"{_pct(r['rollout_idle'])} | {r['staleness']:.2f} | {r['sync_s']:.4f} | {acc} | {r['train_wall_s']:.0f} |"
        )
    target = base["after"]
    lines += [
        "",
        "Learning curve (held-out greedy accuracy at wall seconds since the first step began, validation passes "
        f"included: each run validates as often). Time to the baseline's final accuracy ({100 * target:.1f}%):",
        "",
        "| mode | curve (s: accuracy) | time to baseline's final accuracy | x baseline's |",
        "|---|---|---|---|",
    ]
    base_t = time_to(base["curve"], target)
    for mode in args.modes:
        r = results[mode]
        curve = ", ".join(f"{t:.0f}: {100 * a:.1f}" for t, _, a in r["curve"])
        t = time_to(r["curve"], target)
        ratio = f"{t / base_t:.2f}x" if t is not None and base_t else "not reached"
        lines.append(f"| {mode} | {curve} | {f'{t:.0f} s' if t is not None else 'not reached'} | {ratio} |")
    write_report(args.out, lines)


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.0f}%"  # NaN: the colocated run has one pool


if __name__ == "__main__":
    main()
