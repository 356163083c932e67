"""How far grpo_tiny learns from a warm start of a fixed step count and from one that stops at an accuracy band.

The SFT warm start's trajectory depends on the CPU's floating-point arithmetic (and on the seed), so a fixed
step count starts RL from a different skill on each machine; `model.warm_start.until_exact_match` stops it at
the first check where greedy decoding reproduces that share of held-out answers. Seeds stand in for other CPUs
here: each moves the SFT trajectory as another CPU's arithmetic does. Every run is `verl train
recipes/grpo_tiny.yaml` at one torch thread (as CI runs it), with its own warm-start cache, so each seed's warm
start is computed, not reused.

    python benchmarks/warm_start_band.py [--seeds 1 2 3 4] [--jobs 2] [--out benchmarks/results/warm_start_band_cpu.md]

Per run: the warm start's stop step and exact match, and held-out greedy accuracy before and after RL.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from machine import machine_line, write_report

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "grpo_tiny.yaml"
# (name, overrides): warm starts to two accuracy bands (checked every 10 steps, at most 400), and the recipe's
# fixed 200 steps
BAND = ("model.warm_start.val_files=[embedded:arithmetic-sft-val]", "model.warm_start.steps=400")
SETTINGS = (
    ("band (until_exact_match 0.3)", ("model.warm_start.until_exact_match=0.3", *BAND)),
    ("band (until_exact_match 0.4)", ("model.warm_start.until_exact_match=0.4", *BAND)),
    ("fixed 200 steps", ()),  # the recipe as shipped
)
SUMMARY = re.compile(r"held-out greedy accuracy ([\d.]+)% -> ([\d.]+)%")
STOP = re.compile(r"warm start (?:reached|did not reach) greedy exact match [\d.]+ \(([\d.]+) at step (\d+)")


def run(seed: int, overrides: tuple[str, ...], work: str) -> dict:
    """One `verl train` of grpo_tiny: accuracy before/after and, with a band, where the warm start stopped."""
    cmd = [
        sys.executable,
        "-m",
        "verl.cli",
        "train",
        str(RECIPE),
        f"trainer.seed={seed}",
        f"trainer.output_dir={work}/run",
        "trainer.resume=disable",
        "tracking.loggers=[console]",
        *overrides,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VERL_CACHE": f"{work}/cache"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    before, after = (float(v) for v in SUMMARY.search(out.stdout).groups())  # type: ignore[union-attr]
    stop = STOP.search(out.stdout)
    return {
        "before": before,
        "after": after,
        "stop_step": int(stop.group(2)) if stop else None,
        "exact_match": float(stop.group(1)) if stop else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "warm_start_band_cpu.md"))
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (one thread each)")
    args = parser.parse_args()

    def one(job: tuple[int, str, tuple[str, ...]]) -> dict:
        seed, name, overrides = job
        with tempfile.TemporaryDirectory(prefix="band-") as work:
            return {"seed": seed, "name": name, **run(seed, overrides, work)}

    jobs = [(seed, name, overrides) for seed in args.seeds for name, overrides in SETTINGS]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, jobs))
    rows, gains = [], {name: [] for name, _ in SETTINGS}
    for r in results:
        gains[r["name"]].append(r["after"] - r["before"])
        stop = "-" if r["stop_step"] is None else f"step {r['stop_step']} ({r['exact_match']:.3f})"
        rows.append(
            f"| {r['seed']} | {r['name']} | {stop} | {r['before']:.1f}% | {r['after']:.1f}% | "
            f"{r['after'] - r['before']:+.1f} |"
        )
    lines = [
        "# grpo_tiny: warm start to an accuracy band vs a fixed step count",
        "",
        f"- Machine: {machine_line()}",
        f"- Run: `verl train recipes/grpo_tiny.yaml trainer.seed=S` at OMP_NUM_THREADS=1 ({args.jobs} side by side), "
        "each with its own cache; "
        f"seeds {args.seeds} stand in for CPUs whose arithmetic moves the SFT trajectory.",
        "- Command: `python benchmarks/warm_start_band.py`",
        "",
        "| seed | warm start | stopped at (exact match) | before RL | after RL | gain (points) |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "| warm start | gain min | gain median | gain max |",
        "|---|---|---|---|",
        *(f"| {name} | {min(g):+.1f} | {statistics.median(g):+.1f} | {max(g):+.1f} |" for name, g in gains.items()),
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
