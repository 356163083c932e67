"""LoRA against full training on a ~30M-parameter Llama (FSDP engine, CPU): what each holds, writes and moves.

Each setting runs in a fresh process (so its peak RSS is its own): the engine, one warm-up optimizer step of the
actor's token-mean loss on a GRPO-shaped batch, then `--steps` timed steps, a checkpoint and a weight sync.

  full   every parameter trains (AdamW state for all of them)
  lora   rank --rank adapters on every linear layer but the output head (alpha 2 x rank), the base frozen

Reported per setting: trainable parameters, optimizer-state bytes (AdamW's moments), checkpoint size on disk,
weight-sync bytes (what a rollout with its own copy receives: the full merged model; for LoRA also the adapters
alone, what an adapter-loading rollout such as vLLM's receives), s/step, and peak RSS above the RSS once the
model was built.

    python benchmarks/lora_memory.py [--steps 3] [--rank 16] [--out benchmarks/results/lora_memory_cpu.md]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import machine_line, write_report

HERE = Path(__file__).resolve().parent
PROMPTS, N, PROMPT_LEN, RESPONSE_LEN, VOCAB = 8, 4, 64, 192, 4096
LAYOUT = dict(
    hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4
)


def make_model(path: str) -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=1024, tie_word_embeddings=False, **LAYOUT)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def make_batch(seed: int = 0):
    """Rollout-shaped rows: each prompt N times, full-length prompts and responses, random advantages."""
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, VOCAB, (PROMPTS, PROMPT_LEN), generator=g).repeat_interleave(N, 0)
    responses = torch.randint(3, VOCAB, (PROMPTS * N, RESPONSE_LEN), generator=g)
    ids = torch.cat([prompts, responses], 1)
    mask = torch.ones_like(ids)
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1),
            "responses": responses,
            "response_mask": torch.ones_like(responses),
            "advantages": torch.randn(PROMPTS * N, RESPONSE_LEN, generator=g),
        }
    )


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def run_setting(model: str, setting: str, steps: int, rank: int) -> dict:
    """One setting in this process: the engine, a warm-up step, `steps` timed steps, a checkpoint, a sync."""
    import torch.distributed as dist

    from verl.config.schema import ActorConfig, LoraConfig, OptimConfig
    from verl.controller.worker import free_port
    from verl.engine_protocol import EngineConfig
    from verl.workers.losses import actor_loss_fn
    from verl_fsdp.engine import FSDPEngine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    lora = LoraConfig(rank=rank, alpha=2.0 * rank) if setting == "lora" else None
    engine = FSDPEngine(EngineConfig(model_path=model, optim=OptimConfig(lr=1e-5), total_steps=100, lora=lora))
    batch = make_batch()
    loss = actor_loss_fn(ActorConfig(ppo_mini_batch_size=1, loss_agg_mode="token-mean"))
    base = rss_mb()
    engine.train_step(batch, loss, micro_batch_size=PROMPTS * N)  # warm-up (allocates the optimizer state)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.train_step(batch, loss, micro_batch_size=PROMPTS * N)
        times.append(time.perf_counter() - start)
    peak = rss_mb() - base
    optim_bytes = nbytes(t for s in engine.optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    with tempfile.TemporaryDirectory() as ckpt:
        engine.save_checkpoint(ckpt)
        ckpt_bytes = sum(f.stat().st_size for f in Path(ckpt).rglob("*") if f.is_file())
    start = time.perf_counter()
    merged_bytes = nbytes(t for _, t in engine.weights())
    merged_s = time.perf_counter() - start
    adapter = engine.lora_adapter()
    adapter_bytes = nbytes(t for _, t in adapter[1]) if adapter is not None else None
    dist.destroy_process_group()
    return {
        "setting": setting,
        "trainable": sum(p.numel() for p in engine.model.parameters() if p.requires_grad),
        "optimizer_bytes": optim_bytes,
        "checkpoint_bytes": ckpt_bytes,
        "merged_sync_bytes": merged_bytes,
        "merged_sync_s": merged_s,
        "adapter_sync_bytes": adapter_bytes,
        "s_per_step": sorted(times)[len(times) // 2],
        "peak_rss_above_model_mb": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--out", default=str(HERE / "results" / "lora_memory_cpu.md"))
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "SETTING"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        print(json.dumps(run_setting(args.one[0], args.one[1], args.steps, args.rank)))
        return
    work = tempfile.mkdtemp(prefix="verl-lora-")
    model = os.path.join(work, "llama")
    params = make_model(model)
    results = []
    for setting in ("full", "lora"):
        cmd = [sys.executable, __file__, "--one", model, setting, "--steps", str(args.steps), "--rank", str(args.rank)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        results.append(json.loads(out))
        print(f"lora_memory: {results[-1]}", flush=True)
    report(args, params, results)


def _mb(n: float) -> str:
    return f"{n / 2**20:,.2f}"


def report(args, params: int, results: list) -> None:
    full, lora = results
    lines = [
        "# LoRA vs full training (FSDP engine, CPU)",
        "",
        f"Measured {time.strftime('%Y-%m-%dT%H:%M:%S%z')} with `benchmarks/lora_memory.py --steps {args.steps} "
        f"--rank {args.rank}`.",
        "",
        f"- Machine: {machine_line()}",
        f"- Model: random Llama, hidden {LAYOUT['hidden_size']}, {LAYOUT['num_hidden_layers']} layers, GQA "
        f"{LAYOUT['num_attention_heads']}/{LAYOUT['num_key_value_heads']} heads, vocab {VOCAB} "
        f"({params / 1e6:.1f}M parameters), fp32, world size 1",
        f"- LoRA: rank {args.rank}, alpha {2 * args.rank}, every linear layer but the output head (`all-linear`)",
        f"- Batch: {PROMPTS} prompts x {N} samples, {PROMPT_LEN} prompt + {RESPONSE_LEN} response tokens; one "
        f"optimizer step of the actor's token-mean loss, median of {args.steps} after a warm-up step",
        "",
        "| | full | LoRA | LoRA / full |",
        "|---|---|---|---|",
        f"| trainable parameters | {full['trainable']:,} | {lora['trainable']:,} | "
        f"{lora['trainable'] / full['trainable']:.4f} |",
        f"| optimizer state (MB) | {_mb(full['optimizer_bytes'])} | {_mb(lora['optimizer_bytes'])} | "
        f"{lora['optimizer_bytes'] / full['optimizer_bytes']:.4f} |",
        f"| checkpoint on disk (MB) | {_mb(full['checkpoint_bytes'])} | {_mb(lora['checkpoint_bytes'])} | "
        f"{lora['checkpoint_bytes'] / full['checkpoint_bytes']:.4f} |",
        f"| weight sync, full weights (MB) | {_mb(full['merged_sync_bytes'])} | {_mb(lora['merged_sync_bytes'])} "
        f"(merged) | {lora['merged_sync_bytes'] / full['merged_sync_bytes']:.2f} |",
        f"| weight sync, adapters only (MB) | - | {_mb(lora['adapter_sync_bytes'])} | "
        f"{lora['adapter_sync_bytes'] / full['merged_sync_bytes']:.4f} |",
        f"| producing the full weights (s) | {full['merged_sync_s']:.3f} | {lora['merged_sync_s']:.3f} (merging) | "
        f"{lora['merged_sync_s'] / full['merged_sync_s']:.2f} |",
        f"| s/step | {full['s_per_step']:.2f} | {lora['s_per_step']:.2f} | "
        f"{lora['s_per_step'] / full['s_per_step']:.2f} |",
        f"| peak RSS above the model (MB) | {full['peak_rss_above_model_mb']:.0f} | "
        f"{lora['peak_rss_above_model_mb']:.0f} | "
        f"{lora['peak_rss_above_model_mb'] / max(full['peak_rss_above_model_mb'], 1):.2f} |",
        "",
        "The checkpoint holds what trains and its optimizer state (for LoRA: the adapters; the base is the run's",
        "model). A rollout with its own copy of the weights (vLLM, SGLang) receives the merged model after each",
        "update, or, where it loads adapters (`rollout.lora_sync: adapter`, vLLM), the adapters alone.",
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
