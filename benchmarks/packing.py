"""Packed rows against padded ones on a GRPO-shaped batch with long-tail response lengths (FSDP and megatron
engines, CPU).

A ~20M-parameter Llama (random weights), 4 prompts x 4 samples, prompts of 16-64 tokens, response lengths
log-normal, clipped to [8, 512]. Each setting runs in a fresh process (so its peak RSS is its own): one
warm-up step, then `--steps` timed optimizer steps of the actor's token-mean loss.

  fsdp padded       model.shared_prefix=false, micro-batches of 4 rows (every row padded to the longest)
  fsdp packed       shared-prefix packing, micro-batches of <= --budget tokens
  megatron padded   model.shared_prefix=false, micro-batches of 4 rows (TP=PP=CP=1, local attention)
  megatron packed   shared-prefix packing, micro-batches of 4 rows (one prompt's samples: one packed row)
  megatron budget   shared-prefix packing, micro-batches of <= --budget tokens (balanced), as fsdp packed
  fsdp/megatron half  shared-prefix packing, micro-batches of <= --budget / 2 tokens

Reported: s/step, tokens/s (prompt + response tokens that are not padding, per second), the tokens the model
computes per step, peak activation memory (the most bytes autograd held for backward at once, in one more step
run under saved-tensor hooks: the largest micro-batch's forward) and peak RSS above the RSS after the model was
built (activations, gradients, optimizer state, the allocator's caches). The fsdp packed budget defaults to the tokens a padded micro-batch of 4 rows holds, so both fsdp
settings bound a micro-batch by the same number of tokens.

    python benchmarks/packing.py [--steps 3] [--budget 2048] [--out benchmarks/results/packing_cpu.md]
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
from verl.utils.saved_activations import SavedActivations

HERE = Path(__file__).resolve().parent
PROMPTS, N, MAX_RESPONSE, VOCAB = 4, 4, 512, 2048


def make_model(path: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)


def make_batch(seed: int = 0, prompts: int = PROMPTS, n: int = N, max_response: int = MAX_RESPONSE):
    """Rollout-shaped rows: each prompt n times (a uid per prompt), left-padded prompts of 16-64 tokens,
    right-padded responses of log-normal length in [8, max_response], random advantages."""
    import numpy as np

    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    plens = torch.randint(16, 65, (prompts,), generator=g).tolist()
    rlens = torch.exp(torch.randn(prompts * n, generator=g) * 1.0 + 4.5).clamp(8, max_response).long().tolist()
    p = max(plens)
    ids = torch.zeros(prompts * n, p + max_response, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, plen in enumerate(plens):
        prompt = torch.randint(3, VOCAB, (plen,), generator=g)
        for j in range(n):
            row = i * n + j
            ids[row, p - plen : p] = prompt
            ids[row, p : p + rlens[row]] = torch.randint(3, VOCAB, (rlens[row],), generator=g)
            mask[row, p - plen : p + rlens[row]] = 1
    width = p + max(rlens)  # the rollout pads to the longest response of the batch
    ids, mask = ids[:, :width], mask[:, :width]
    r = width - p
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, p:],
            "response_mask": mask[:, p:],
            "advantages": torch.randn(prompts * n, r, generator=g),
        },
        {"uid": np.array([f"p{i // n}" for i in range(prompts * n)], dtype=object)},
    )


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


SETTINGS = (
    "fsdp padded",
    "fsdp packed",
    "fsdp half",
    "megatron padded",
    "megatron packed",
    "megatron budget",
    "megatron half",
)


def run_setting(model: str, setting: str, steps: int, budget: int) -> dict:
    """One setting in this process: the engine, a warm-up step, `steps` timed steps."""
    import types

    import torch.distributed as dist

    from verl.config.schema import ActorConfig, OptimConfig
    from verl.controller.worker import free_port
    from verl.engine_protocol import EngineConfig, load_engine
    from verl.workers.losses import actor_loss_fn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    backend, layout = setting.split()
    packed = layout in ("packed", "budget", "half")
    parallel = types.SimpleNamespace(tp=1, pp=1, vpp=None, cp=1, ep=1, dp=None) if backend == "megatron" else None
    cfg = EngineConfig(
        model_path=model, optim=OptimConfig(lr=1e-5), total_steps=100, shared_prefix=packed, parallel=parallel
    )
    engine = load_engine(backend, "train")(cfg)
    batch = make_batch()
    loss = actor_loss_fn(ActorConfig(ppo_mini_batch_size=1, loss_agg_mode="token-mean"))
    if layout == "half":
        kw = dict(micro_batch_size=PROMPTS * N, max_tokens=budget // 2)
    elif (packed and backend == "fsdp") or layout == "budget":
        kw = dict(micro_batch_size=PROMPTS * N, max_tokens=budget)
    else:
        kw = dict(micro_batch_size=4)
    b = batch.batch
    base = rss_mb()
    metrics = engine.train_step(batch, loss, **kw)  # warm-up (allocates the optimizer state)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.train_step(batch, loss, **kw)
        times.append(time.perf_counter() - start)
    modules = engine.chunks if backend == "megatron" else [engine.model]
    with SavedActivations(p for m in modules for p in m.parameters()) as saved:  # (untimed: the hooks cost)
        engine.train_step(batch, loss, **kw)
    dist.destroy_process_group()
    tokens = int(b["attention_mask"].sum())
    s = sorted(times)[len(times) // 2]
    return {
        "setting": setting,
        "s_per_step": s,
        "tokens_per_s": tokens / s,
        "real_tokens": tokens,
        "computed_tokens": round(metrics["computed_tokens_ratio"] * b["input_ids"].numel()),  # the engine's count
        "peak_rss_above_model_mb": rss_mb() - base,
        "peak_activation_mb": saved.peak_bytes / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--budget",
        type=int,
        default=None,
        help="tokens per packed micro-batch (default: as many as a padded micro-batch of 4 rows holds)",
    )
    parser.add_argument("--out", default=str(HERE / "results" / "packing_cpu.md"))
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "BACKEND", "LAYOUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.budget is None:
        args.budget = 4 * make_batch().batch["input_ids"].shape[1]
    if args.one:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        print(json.dumps(run_setting(args.one[0], " ".join(args.one[1:]), args.steps, args.budget)))
        return
    work = tempfile.mkdtemp(prefix="verl-packing-")
    model = os.path.join(work, "llama")
    make_model(model)
    results = []
    for setting in SETTINGS:
        cmd = [sys.executable, __file__, "--one", model, *setting.split(), "--steps", str(args.steps)]
        cmd += ["--budget", str(args.budget)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        results.append(json.loads(out))
        print(f"packing: {results[-1]}", flush=True)
    report(args, results)


def report(args, results: list) -> None:
    by = {r["setting"]: r for r in results}
    batch = make_batch()
    lengths = batch.batch["response_mask"].sum(-1).tolist()
    lines = [
        "# Packed rows vs padded rows (FSDP and megatron engines, CPU)",
        "",
        f"Measured {time.strftime('%Y-%m-%dT%H:%M:%S%z')} with `benchmarks/packing.py --steps {args.steps} "
        f"--budget {args.budget}`.",
        "",
        f"- Machine: {machine_line()}",
        f"- Model: random Llama, hidden 512, 6 layers, GQA 8/4 heads, vocab {VOCAB} (~20M parameters), fp32",
        f"- Batch: {PROMPTS} prompts x {N} samples; response lengths log-normal in [8, {MAX_RESPONSE}]: "
        f"{sorted(int(x) for x in lengths)}; padded width {batch.batch['input_ids'].shape[1]}",
        f"- One optimizer step of the actor's token-mean loss; median of {args.steps} after a warm-up step",
        "",
        "| setting | s/step | tokens/s | tokens computed / step | peak activations (MB) | peak RSS above the model (MB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting']} | {r['s_per_step']:.2f} | {r['tokens_per_s']:.0f} | {r['computed_tokens']:,} | "
            f"{r['peak_activation_mb']:.0f} | {r['peak_rss_above_model_mb']:.0f} |"
        )
    lines.append("")
    pairs = [("fsdp", "packed"), ("fsdp", "half"), ("megatron", "packed"), ("megatron", "budget"), ("megatron", "half")]
    for backend, layout in pairs:
        pad, pack = by[f"{backend} padded"], by[f"{backend} {layout}"]
        lines.append(
            f"- {backend} {layout} / padded **{pack['tokens_per_s'] / pad['tokens_per_s']:.2f}x** tokens/s, "
            f"**{pack['peak_activation_mb'] / pad['peak_activation_mb']:.2f}x** peak activation memory, "
            f"{pack['peak_rss_above_model_mb'] / max(pad['peak_rss_above_model_mb'], 1):.2f}x peak RSS above "
            f"the model ({pad['real_tokens']:,} real tokens per step in both)."
        )
    lines += [
        "",
        "padded: `model.shared_prefix=false`, micro-batches of 4 rows; fsdp packed: shared-prefix packing with",
        f"micro-batches of <= {args.budget} tokens (`actor.ppo_max_tokens_per_device`); megatron packed: the same",
        "packing over micro-batches of 4 rows (one prompt's samples), the pack's mask given to megatron's local",
        f"attention; megatron budget: that packing over micro-batches of <= {args.budget} tokens, balanced; half:",
        f"the packing over micro-batches of <= {args.budget // 2} tokens. A token budget bounds a micro-batch's",
        "activations; packing computes fewer tokens, so the same step fits in half the budget's micro-batches.",
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
