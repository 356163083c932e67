"""Where asynchronous RL pays on any machine: an agent whose tool calls wait on a remote service.

grpo_tiny_tools (a calculator the model calls as calc(...), up to 3 turns) with its tool answered by a loopback
HTTP service after `--latency` seconds per call (benchmarks/latency_tool.py: the stand-in for a search API, a code
sandbox or an LLM judge; waiting, no CPU). Three kinds of run on the same two cores:

- `sync`: the recipe as it ships, colocated (one worker, the hybrid engine): each step's trajectories wait on
  their calls, then the actor trains.
- `one_step_off`: the rollout on a worker of its own generating step k+1's batch while the actor trains on k's.
- `async`: the rollout service with trainer.max_staleness=2 (trajectories run as requests; a trajectory waiting on
  its call holds nothing, the others and the trainer go on).

Reported: median seconds per step after the first two, samples/s, the held-out accuracy before and after, and each
mode's throughput against `sync` of the same run.

    python benchmarks/agent_latency.py [--latency 0.5] [--steps 40] [--out benchmarks/results/agent_latency_cpu.md]
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "packages" / "verl-core" / "src")]

from latency_tool import serve  # noqa: E402
from machine import machine_line, write_report  # noqa: E402

APART = (
    "trainer.controller=ray",
    "placement.devices_per_node=2",
    "placement.pools=[{name: train, roles: [actor], devices: 1}, {name: gen, roles: [rollout], devices: 1}]",
)
MODES = {
    "sync": (),
    "one_step_off": (*APART, "trainer.mode=one_step_off", "actor.tis_imp_ratio_cap=2.0"),
    "async": (*APART, "trainer.mode=async", "trainer.max_staleness=2", "actor.tis_imp_ratio_cap=2.0"),
}


def run(mode: str, url: str, steps: int, out_dir: str) -> tuple[list[dict], float]:
    cmd = [
        sys.executable,
        "-m",
        "verl.cli",
        "train",
        str(ROOT / "recipes" / "grpo_tiny_tools.yaml"),
        f"trainer.total_steps={steps}",
        f"trainer.val_every={steps}",
        "trainer.resume=disable",
        "checkpoint.save_last=false",
        f"trainer.output_dir={out_dir}",
        "tracking.loggers=[jsonl]",
        "tracking.curves=false",
        f"rollout.agent.tools=[{{_target_: latency_tool.RemoteCalculator, url: '{url}'}}]",
        *MODES[mode],
    ]
    path = os.pathsep.join([str(HERE), *(str(p) for p in sorted(ROOT.glob("packages/*/src"))), str(ROOT)])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    start = time.time()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(out_dir, "logs", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f], time.time() - start


def summarize(rows: list[dict]) -> dict:
    steps = [r for r in rows if "timing/step_s" in r]
    later = steps[2:] or steps
    accuracy = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
    step_s = statistics.median(r["timing/step_s"] for r in later)
    return {
        "step_s": step_s,
        "samples_per_s": 32 * 8 / step_s,  # grpo_tiny_tools: 32 prompts x 8 samples a step
        "tool_calls": statistics.mean(r.get("agent/tool_calls/mean", float("nan")) for r in later),
        "staleness": statistics.mean(r.get("async/staleness_mean", 0.0) for r in steps),
        "before": accuracy[0] if accuracy else None,
        "after": accuracy[-1] if accuracy else None,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latency", type=float, default=0.5, help="seconds the service waits before each answer")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "agent_latency_cpu.md"))
    p.add_argument("--work", default="/tmp/verl-agent-latency")
    args = p.parse_args(argv)
    server = serve(args.latency)
    results, walls = {}, {}
    try:
        for mode in args.modes:
            rows, walls[mode] = run(mode, server.url, args.steps, os.path.join(args.work, mode))
            results[mode] = summarize(rows)
            print(mode, results[mode], flush=True)
    finally:
        server.close()
    base = results[args.modes[0]]
    lines = [
        "# Asynchronous RL where generation waits on a tool (benchmarks/agent_latency.py)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine_line()}: grpo_tiny_tools, {args.steps} steps (32 prompts x 8 "
        f"samples, up to 3 turns), its calculator answered by a loopback HTTP service after {args.latency:g} s per "
        "call (benchmarks/latency_tool.py). One torch thread per worker process; ratios against the first mode of "
        "this run.",
        "",
        "| mode | s/step | samples/s | x sync | tool calls / sample | staleness | accuracy before -> after | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in results.items():
        lines.append(
            f"| {mode} | {r['step_s']:.2f} | {r['samples_per_s']:.0f} | **{base['step_s'] / r['step_s']:.2f}x** | "
            f"{r['tool_calls']:.2f} | {r['staleness']:.2f} | {100 * r['before']:.1f} -> {100 * r['after']:.1f} | "
            f"{walls[mode]:.0f} |"
        )
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
