"""grpo_tiny_vlm with its image rows packed (a GRPO group's shared prompt and its images computed once) against
the same run padded (`model.shared_prefix=false`), on this machine's CPU.

Each setting is one `verl train recipes/grpo_tiny_vlm.yaml` in its own process (the recipe as shipped: a 30-step
warm start, then 40 GRPO steps of 32 prompts x 8 samples), run one after the other, so both see the same machine.

    python benchmarks/vlm_packing.py [--out benchmarks/results/vlm_packing_cpu.md]

Reported per setting: the run's wall seconds, the 40 RL steps' seconds and tokens/s as the run's summary line gives
them, the actor's computed-tokens ratio (tokens the model ran over / the padded rows' tokens, last step), and
held-out greedy accuracy before and after RL.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_line, write_report

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "grpo_tiny_vlm.yaml"
SETTINGS = (("padded", ("model.shared_prefix=false",)), ("packed", ()))
SUMMARY = re.compile(
    r"held-out greedy accuracy ([\d.]+)% -> ([\d.]+)%.*?(\d+) steps in ([\d.]+) s .*?; ([\d.]+) tokens/s"
)


def run(overrides: tuple[str, ...], work: str) -> dict:
    """One `verl train` of grpo_tiny_vlm: wall seconds, the summary line's figures, the last step's layout."""
    cmd = [sys.executable, "-m", "verl.cli", "train", str(RECIPE), f"trainer.output_dir={work}", *overrides]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    found = SUMMARY.search(out.stdout + out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{(out.stdout + out.stderr)[-3000:]}")
    with open(Path(work) / "logs" / "metrics.jsonl") as f:
        last = [json.loads(line) for line in f][-1]
    before, after, steps, seconds, tokens_per_s = found.groups()
    return {
        "wall": wall,
        "before": float(before),
        "after": float(after),
        "steps": int(steps),
        "rl_s": float(seconds),
        "tokens_per_s": float(tokens_per_s),
        "computed": last["actor/computed_tokens_ratio"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vlm_packing_cpu.md"))
    args = parser.parse_args()
    results = {}
    for name, overrides in SETTINGS:
        with tempfile.TemporaryDirectory() as work:
            results[name] = run(overrides, work)
            print(name, results[name], flush=True)
    padded, packed = results["padded"], results["packed"]
    lines = [
        "# grpo_tiny_vlm: image rows packed against padded (FSDP engine, CPU)",
        "",
        f"Measured {time.strftime('%Y-%m-%dT%H:%M:%S%z')} with `benchmarks/vlm_packing.py`.",
        "",
        f"- Machine: {machine_line()}",
        "- Run: `verl train recipes/grpo_tiny_vlm.yaml` as shipped (embedded tiny Qwen2.5-VL, 30 warm-start steps,"
        " 40 GRPO steps of 32 prompts x 8 samples, hf rollout), each setting in its own process, one after the other",
        "",
        "| setting | wall s | RL steps s | tokens/s | computed / padded tokens (actor) | accuracy before -> after |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['wall']:.1f} | {r['rl_s']:.0f} | {r['tokens_per_s']:.0f} | {r['computed']:.2f} | "
            f"{r['before']:.1f}% -> {r['after']:.1f}% |"
        )
    lines += [
        "",
        f"- packed / padded: **{packed['tokens_per_s'] / padded['tokens_per_s']:.2f}x** tokens/s over the RL steps, "
        f"{packed['rl_s'] / padded['rl_s']:.2f}x their seconds, {packed['wall'] / padded['wall']:.2f}x the run's wall "
        "time.",
        "",
        "padded: `model.shared_prefix=false`, every row its own prompt and images; packed: the default, each prompt "
        "with its images computed once for its group's rows (verl_fsdp.vision), so the vision tower encodes each "
        "image once per step instead of once per sample.",
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
