"""The memory model's estimates against what the engines hold, layout by layout, on this machine.

    python benchmarks/memory_model.py [--rows 4] [--seq 256] [--out FILE]

One training step of a random Llama in each layout of both engines (gloo processes, one per rank). On every rank:
the state the engine holds (parameters, gradients, optimizer state: each storage counted once, from its tensors)
against the backend's state estimate (verl_fsdp / verl_megatron.memory_model.state_bytes), and the most bytes
autograd holds for backward during the step (saved-tensor hooks) against the activation estimate; and the
process's peak resident set, which also holds the interpreter, torch and the libraries. Estimates are worked out
before any process starts, from the model's config and the layout alone.

Activation recompute is measured with torch's reentrant checkpoint standing in for the FSDP engine's non-reentrant
one (both keep each layer's input and recompute one layer in backward; only the reentrant one saves where the
hooks see it); megatron's recompute is its own.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import tempfile
import types
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [str(ROOT / "packages" / p / "src") for p in ("verl-core", "verl-kernels", "verl-fsdp", "verl-megatron")]
sys.path[:0] = SOURCES

from machine import machine_line, write_report  # noqa: E402
from verl.memory_model import MicroBatch, PassSettings  # noqa: E402
from verl.utils.saved_activations import SavedActivations  # noqa: E402

SHAPE = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
# A mixture of experts of the same size: 8 experts of 352, top 2, every layer routed.
MOE_SHAPE = dict(
    {k: v for k, v in SHAPE.items() if k != "intermediate_size"},
    intermediate_size=704,
    moe_intermediate_size=352,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    head_dim=32,
)
# name: (engine, processes, parallel sizes, recompute)
LAYOUTS = {
    "fsdp dp1": ("fsdp", 1, {}, False),
    "fsdp dp2": ("fsdp", 2, {}, False),
    "fsdp dp1 recompute": ("fsdp", 1, {}, True),
    "megatron tp1": ("megatron", 1, {}, False),
    "megatron tp2": ("megatron", 2, {"tp": 2, "sequence_parallel": False}, False),
    "megatron tp2+sp": ("megatron", 2, {"tp": 2, "sequence_parallel": True}, False),
    "megatron pp2": ("megatron", 2, {"pp": 2}, False),
    "megatron cp2": ("megatron", 2, {"cp": 2}, False),
    "megatron dp2": ("megatron", 2, {}, False),
    "megatron tp1 recompute": ("megatron", 1, {}, True),
    "megatron moe ep1": ("megatron", 1, {}, False),
    "megatron moe ep2": ("megatron", 2, {"ep": 2}, False),
}


def _model(path: str, moe: bool = False) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3_moe", **MOE_SHAPE) if moe else AutoConfig.for_model("llama", **SHAPE)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def _batch(rows: int, seq: int):
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, SHAPE["vocab_size"], (rows, seq), generator=g)
    response = seq // 2
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": torch.ones(rows, seq, dtype=torch.long),
            "position_ids": torch.arange(seq).expand(rows, seq).clone(),
            "responses": ids[:, -response:],
            "response_mask": torch.ones(rows, response, dtype=torch.long),
        }
    )


def _nll(out, mb):
    mask = mb.batch["response_mask"]
    return -(out["log_probs"] * mask).sum() / mask.sum(), {}


def _sizes(world: int, parallel: dict) -> dict:
    split = parallel.get("tp", 1) * parallel.get("pp", 1) * parallel.get("cp", 1)
    return {
        "tp": 1,
        "pp": 1,
        "vpp": None,
        "cp": 1,
        "ep": 1,
        "sequence_parallel": None,
        **parallel,
        "dp": world // split,
    }


def _rank(rank: int, world: int, port: int, name: str, model: str, args, results) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from verl.config.schema import OptimConfig
    from verl.engine_protocol import EngineConfig, load_engine

    engine_name, _, parallel, recompute = LAYOUTS[name]
    sizes = _sizes(world, parallel)
    cfg = EngineConfig(
        model_path=model,
        optim=OptimConfig(lr=1e-5),
        total_steps=10,
        dtype="float32",
        gradient_checkpointing=recompute,
        parallel=types.SimpleNamespace(**sizes) if engine_name == "megatron" else None,
    )
    engine = load_engine(engine_name, "train")(cfg)
    if engine_name == "fsdp":
        params = list(engine.model.parameters())
        if recompute:  # (see the module's docstring)
            engine.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
            engine.model.enable_input_require_grads()
    else:
        params = engine._parameters()
    with SavedActivations(params) as saved:
        engine.train_step(_batch(args.rows, args.seq), _nll, micro_batch_size=args.rows)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    results[rank] = (engine.held_bytes(), saved.peak_bytes, rss)
    dist.destroy_process_group()


def _estimates(name: str, world: int, model: str, args) -> list:
    """Per rank: (state dict, activation bytes), worked out here before any process starts."""
    from transformers import AutoConfig

    engine_name, _, parallel, recompute = LAYOUTS[name]
    hf = AutoConfig.from_pretrained(model)
    sizes = _sizes(world, parallel)
    if engine_name == "fsdp":
        from verl_fsdp import memory_model as mm

        states = [
            mm.fsdp_state_bytes(mm.trained_shapes(mm.hf_parameter_shapes(hf), True), world, r) for r in range(world)
        ]
    else:
        from verl_megatron import memory_model as mm

        per_stage = mm.state_bytes(hf, sizes, dtype=torch.float32)
        states = [per_stage[r // (world // sizes["pp"])] for r in range(world)]
    settings = PassSettings(dtype_bytes=4, recompute=recompute, entropy=False)
    # rows without padding: transformers drops an all-ones mask (causal attention, native GQA); megatron's local
    # attention takes its causal mask either way
    mb = MicroBatch(args.rows, args.seq, args.seq // 2, masked=engine_name == "megatron")
    acts = [mm.activation_bytes(hf, sizes, mb, settings, stage=r // (world // sizes["pp"])) for r in range(world)]
    return [(s.as_dict(), a) for s, a in zip(states, acts)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256, help="tokens per row (half prompt, half response)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "memory_model_cpu.md"))
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([*SOURCES, os.environ.get("PYTHONPATH", "")])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {False: _model(os.path.join(tmp, "llama")), True: _model(os.path.join(tmp, "moe"), moe=True)}
        for name in args.layouts.split(","):
            model = models[" moe " in name]
            world = LAYOUTS[name][1]
            estimates = _estimates(name, world, model, args)
            results = mp.Manager().dict()
            mp.spawn(_rank, args=(world, _free_port(), name, model, args, results), nprocs=world)
            for rank in range(world):
                held, saved, rss = results[rank]
                state, acts = estimates[rank]
                rows.append((name, rank, state, held, acts, saved, rss))
                print(
                    f"{name} rank {rank}: state {'equal' if state == held else f'{state} vs {held}'}, "
                    f"activations {acts / 2**20:.2f} vs {saved / 2**20:.2f} MiB ({acts / saved:.3f}x)",
                    flush=True,
                )
    worst = max(abs(r[4] / r[5] - 1) for r in rows)
    lines = [
        "# Memory model: estimates against what the engines hold (CPU)",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine_line()}",
        f"- model: random Llama {SHAPE}; the `moe` layouts a random Qwen3-MoE {MOE_SHAPE}; float32; AdamW",
        f"- batch: {args.rows} rows x {args.seq} tokens ({args.seq // 2} response tokens), one micro-batch, every rank",
        "- state: parameters + gradients + optimizer bytes on the rank, counted from its tensors' storages after the "
        "step, against the estimate (`equal`: every one of the three to the byte)",
        "- activations: the most bytes autograd held for backward during the step (saved-tensor hooks) against the "
        "estimate; peak RSS: the process's, for scale (interpreter, torch, libraries included)",
        f"- largest activation error: {worst:.2%} (the issue's bar: 15%)",
        "",
        "| layout | rank | state estimate | state counted | activations estimate (MiB) | measured (MiB) | ratio | "
        "peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rank, state, held, acts, saved, rss in rows:
        total = sum(state.values())
        counted = "equal" if state == held else f"{sum(held.values()) / 2**20:.2f} MiB"
        lines.append(
            f"| {name} | {rank} | {total / 2**20:.2f} MiB | {counted} | {acts / 2**20:.2f} | {saved / 2**20:.2f} | "
            f"{acts / saved:.3f} | {rss / 2**20:.0f} |"
        )
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
