"""Activation memory per rank of the fsdp engine under tensor parallelism (tp=2) and Ulysses sequence parallelism
(cp=2), against one rank, for long rows.

    python benchmarks/fsdp_parallel_memory.py [--seq 2048] [--rows 2] [--out FILE]

One training step of the same batch (padded rows, no packing: every row its full length) on a random Llama
(8 layers, hidden 512, vocabulary 8192, 8 heads over 4 query groups), in each layout on gloo processes. Measured on
every rank: the bytes autograd saves for backward during the step (every saved tensor's storage once, parameters
excluded) and the step's seconds (median of --repeats after a warm-up); beside them, what the engine's memory model
(verl_fsdp.memory_model.activation_bytes) says before launch. Bytes are exact and repeatable; seconds on a shared
CPU are noisy, so read their ratios only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [str(ROOT / "packages" / p / "src") for p in ("verl-core", "verl-kernels", "verl-fsdp")]
sys.path[:0] = SOURCES

from machine import cpu_name  # noqa: E402
from megatron_parallel_memory import _free_port, _nll  # noqa: E402  (the same loss and port picking)

from verl.utils.saved_activations import SavedActivations  # noqa: E402

SHAPE = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=8192,
)
LAYOUTS = {"dp1": (1, {}), "tp2": (2, dict(tp=2)), "cp2": (2, dict(cp=2))}  # name: (processes, parallel)


def _model(path: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SHAPE)).save_pretrained(path)
    return path


def _batch(rows: int, seq: int, vocab: int):
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, seq), generator=g)
    response = seq // 2
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(seq).expand(rows, -1).clone(),
            "responses": ids[:, -response:],
            "response_mask": torch.ones(rows, response, dtype=torch.long),
        }
    )


def _rank(rank: int, world: int, port: int, parallel: dict, model: str, args, results) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from verl.config.schema import OptimConfig, ParallelConfig
    from verl.engine_protocol import EngineConfig
    from verl_fsdp.engine import FSDPEngine

    cfg = EngineConfig(
        model_path=model,
        optim=OptimConfig(lr=1e-5),
        total_steps=100,
        shared_prefix=False,
        parallel=ParallelConfig(**parallel),
    )
    engine = FSDPEngine(cfg)
    batch = _batch(args.rows, args.seq, SHAPE["vocab_size"])

    def step() -> None:
        engine.train_step(batch, _nll, micro_batch_size=args.rows)

    with SavedActivations(engine.model.parameters()) as held:  # also the warm-up step
        step()
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    results[rank] = (held.peak_bytes, statistics.median(seconds))
    dist.destroy_process_group()


def _estimate(model: str, parallel: dict, args) -> int:
    from transformers import AutoConfig

    from verl.memory_model import MicroBatch, PassSettings
    from verl_fsdp.memory_model import activation_bytes

    # rows without padding: transformers' sdpa runs them causal without a mask; under cp the engine's 4D mask is kept
    mb = MicroBatch(rows=args.rows, seq=args.seq, response=args.seq // 2, masked="cp" in parallel)
    settings = PassSettings(dtype_bytes=4, entropy=False, fused_logits=False, recompute=False)
    return activation_bytes(AutoConfig.from_pretrained(model), {"dp": 1, **parallel}, mb, settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=2048, help="tokens per row (half prompt, half response)")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fsdp_parallel_memory_cpu.md"))
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([*SOURCES, os.environ.get("PYTHONPATH", "")])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = _model(os.path.join(tmp, "llama"))
        for name in args.layouts.split(","):
            world, parallel = LAYOUTS[name]
            results = mp.Manager().dict()
            mp.spawn(_rank, args=(world, _free_port(), parallel, model, args, results), nprocs=world)
            saved = max(results[r][0] for r in range(world))
            seconds = max(results[r][1] for r in range(world))
            estimate = _estimate(model, parallel, args)
            rows.append((name, world, saved, estimate, seconds))
            print(
                f"{name}: {saved / 2**20:.1f} MiB saved per rank (model: {estimate / 2**20:.1f}), {seconds:.2f} s/step"
            )
    base = rows[0]
    lines = [
        "# FSDP engine: activation memory per rank by layout (CPU)",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}",
        f"- model: random Llama {SHAPE}; float32, sdpa",
        f"- batch: {args.rows} padded rows x {args.seq} tokens ({args.seq // 2} response tokens), one micro-batch",
        "- saved: the most bytes autograd holds for backward at once in one training step, per rank (the largest "
        "rank), distinct storages, parameters excluded; model: verl_fsdp.memory_model.activation_bytes",
        f"- seconds: median of {args.repeats} training steps after a warm-up (slowest rank); noisy on a shared CPU",
        "",
        f"| layout | processes | saved for backward (MiB) | vs {base[0]} | memory model (MiB) | model / saved | "
        f"s/step | vs {base[0]} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, world, saved, estimate, seconds in rows:
        lines.append(
            f"| {name} | {world} | {saved / 2**20:.1f} | {saved / base[2]:.2f}x | {estimate / 2**20:.1f} | "
            f"{estimate / saved:.2f} | {seconds:.2f} | {seconds / base[4]:.2f}x |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
