"""Activation memory per rank of the megatron engine under tensor, sequence and context parallelism.

    python benchmarks/megatron_parallel_memory.py [--seq 1024] [--rows 2] [--out FILE]

One training step of the same batch on a random Llama (8 layers, hidden 512, vocabulary 8192, 8 heads over 4
query groups) in each layout: TP=1 on one process; TP=2 without and with sequence parallelism, and CP=2, on two
gloo processes. What is measured on every rank: the bytes autograd saves for backward during the step (every
saved tensor's storage, counted once, parameters excluded), which is what a layout's activation memory is; and
the step's seconds (median of --repeats steps after one warm-up). Bytes are exact and repeatable; seconds on a
shared CPU are noisy, so read their ratios only.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import types
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [str(ROOT / "packages" / p / "src") for p in ("verl-core", "verl-kernels", "verl-megatron")]
sys.path[:0] = SOURCES

from machine import cpu_name  # noqa: E402
from verl.utils.saved_activations import SavedActivations  # noqa: E402

SHAPE = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=4096,
)
LAYOUTS = {  # name: (processes, parallel settings)
    "tp1": (1, dict(tp=1)),
    "tp2": (2, dict(tp=2, sequence_parallel=False)),
    "tp2+sp": (2, dict(tp=2, sequence_parallel=True)),
    "cp2": (2, dict(cp=2)),
}


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
            "responses": ids[:, -response:],
            "response_mask": torch.ones(rows, response, dtype=torch.long),
        }
    )


def _nll(out, mb):
    mask = mb.batch["response_mask"]
    return -(out["log_probs"] * mask).sum() / mask.sum(), {}


def _rank(rank: int, world: int, port: int, parallel: dict, model: str, args, results) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from verl.config.schema import OptimConfig
    from verl.engine_protocol import EngineConfig
    from verl_megatron.engine import MegatronEngine

    sizes = {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": None, "sequence_parallel": None, **parallel}
    cfg = EngineConfig(
        model_path=model,
        optim=OptimConfig(lr=1e-5),
        total_steps=100,
        dtype="float32",
        parallel=types.SimpleNamespace(**sizes),
    )
    engine = MegatronEngine(cfg)
    batch = _batch(args.rows, args.seq, SHAPE["vocab_size"])

    def step() -> None:
        engine.train_step(batch, _nll, micro_batch_size=args.rows)

    with SavedActivations(p for c in engine.chunks for p in c.parameters()) as held:  # also the warm-up step
        step()
    saved = held.peak_bytes
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    results[rank] = (saved, statistics.median(seconds))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=1024, help="tokens per row (half prompt, half response)")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "megatron_parallel_memory_cpu.md"))
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
            rows.append((name, world, saved, seconds))
            print(f"{name}: {saved / 2**20:.1f} MiB saved for backward per rank, {seconds:.2f} s/step", flush=True)
    base_saved, base_seconds = rows[0][2], rows[0][3]
    lines = [
        "# Megatron engine: activation memory per rank by layout (CPU)",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}",
        f"- model: random Llama {SHAPE}; float32",
        f"- batch: {args.rows} rows x {args.seq} tokens ({args.seq // 2} response tokens), one micro-batch",
        "- saved: the most bytes autograd holds for backward at once in one training step, per rank (the largest rank), "
        "distinct storages, parameters excluded",
        f"- seconds: median of {args.repeats} training steps after a warm-up (slowest rank); noisy on a shared CPU",
        "",
        f"| layout | processes | saved for backward (MiB) | vs {rows[0][0]} | s/step | vs {rows[0][0]} |",
        "|---|---|---|---|---|---|",
    ]
    for name, world, saved, seconds in rows:
        lines.append(
            f"| {name} | {world} | {saved / 2**20:.1f} | {saved / base_saved:.2f}x | {seconds:.2f} | "
            f"{seconds / base_seconds:.2f}x |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
