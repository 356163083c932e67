"""What the weight-sync check costs: a sync into the hf rollout's own copy, with and without the check, on this
machine.

    python benchmarks/weight_check.py [--models Qwen3-0.6B,tiny] [--repeats 5] [--out FILE]

For each model (random weights with the shapes of its config: recipes/model_configs/<name>, or a tiny Llama), an
hf rollout loads its own copy, then takes the full weights `--repeats` times as a sync feeds them
(`update_weights` over the checkpoint-named tensors, float32), alternating a plain sync and a checked one
(verl.workers.weight_check.watch_sync: the stream fingerprinted on its way in, then the engine's parameters).
Reported: the median seconds of each, the check's own seconds (both sides' fingerprints) and its share of the
plain sync's time. The sync here is a local copy (the fastest a sync gets); a sync between pools adds the transfer,
so the share of a real one is lower.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "packages" / p / "src") for p in ("verl-core", "verl-rollout")]

from machine import machine_line, write_report  # noqa: E402

from verl.config.schema import RolloutConfig  # noqa: E402
from verl.engine_protocol import RolloutSettings  # noqa: E402
from verl.workers.weight_check import watch_sync  # noqa: E402
from verl_rollout.hf import HFRollout  # noqa: E402

TINY = dict(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8)


def model_folder(name: str, root: str) -> str:
    """A Hugging Face folder with random weights of `name`'s shapes."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    if name == "tiny":
        config = LlamaConfig(**TINY, num_key_value_heads=4, tie_word_embeddings=False)
    else:
        config = AutoConfig.from_pretrained(ROOT / "recipes" / "model_configs" / name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = str(Path(root) / name)
    model.save_pretrained(path)
    return path


def measure(path: str, repeats: int) -> dict:
    rollout = HFRollout(
        RolloutConfig(), model_path=path, settings=RolloutSettings(max_new_tokens=1, eos_ids=(0,), pad_id=0)
    )
    source = {n: p.detach().clone() for n, p in rollout.module.named_parameters()}  # what an actor would send
    plain, checked, check = [], [], []
    for _ in range(repeats + 1):  # the first of each is a warm-up
        start = time.perf_counter()
        rollout.update_weights(iter(source.items()))
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        with watch_sync(rollout, iter(source.items()), 1, True) as watched:
            rollout.update_weights(watched.weights)
        checked.append(time.perf_counter() - start)
        assert watched.report is not None and watched.report.expected.keys() == watched.report.actual.keys()
        check.append(watched.report.seconds)
    plain, checked, check = plain[1:], checked[1:], check[1:]
    return {
        "bytes": sum(t.numel() * t.element_size() for t in source.values()),
        "tensors": len(source),
        "plain": statistics.median(plain),
        "checked": statistics.median(checked),
        "check": statistics.median(check),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="Qwen3-0.6B,tiny", help="recipes/model_configs names, or tiny")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "weight_check_cpu.md"))
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for name in args.models.split(","):
            r = measure(model_folder(name, root), args.repeats)
            gbps = r["bytes"] / r["plain"] / 1e9
            rows.append(
                f"| {name} | {r['tensors']} | {r['bytes'] / 2**30:.2f} | {r['plain']:.3f} ({gbps:.1f} GB/s) | "
                f"{r['checked']:.3f} | {r['check']:.3f} | {r['check'] / r['plain']:.1%} |"
            )
            print(rows[-1], flush=True)
    lines = [
        "# The weight-sync check's cost (benchmarks/weight_check.py)",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d}; {machine_line()}; {torch.get_num_threads()} torch threads; "
        f"float32; median of {args.repeats} syncs each.",
        "",
        "A sync here is the hf rollout copying the full weights into its own copy in the same process (no transfer:",
        "the fastest a sync gets, so the largest share the check can take); checked = the same sync through",
        "`watch_sync` (each tensor fingerprinted on its way in, then every parameter of the engine).",
        "",
        "| model | tensors | GiB | sync s | checked sync s | check s | check / sync |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
