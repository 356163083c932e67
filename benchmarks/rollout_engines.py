"""Rollout engines head to head: generation tokens/s of vllm vs hf on the same prompts and settings, in one run,
and the seconds a weight sync takes in each.

    python benchmarks/rollout_engines.py [--models tiny,small] [--device cpu] [--out FILE]

Runs where vLLM is installed (in this repository: the Pants resolve `vllm`). Models are built locally with
random weights (generation speed does not depend on what the weights say, only on their shapes):
  tiny   the embedded tiny-llama the CPU recipes train (0.8M parameters)
  small  a Llama of 8 layers, hidden 512, vocabulary 8192 (32M parameters)
  0.5b   Qwen2-0.5B's shapes (~494M parameters; meant for a GPU)
Each engine keeps its own copy of the weights (hf standalone, as with a megatron actor) so both syncs load
every tensor. Each measurement is the median over --repeats calls after one warm-up call.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for src in ("verl-core", "verl-rollout"):
    sys.path.insert(0, str(ROOT / "packages" / src / "src"))

from machine import cpu_name  # noqa: E402

from verl.config.schema import RolloutConfig  # noqa: E402
from verl.protocol import DataProto  # noqa: E402

SHAPES = {
    "small": dict(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
    ),
    "0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}


def model_dir(name: str, root: str) -> str:
    if name == "tiny":
        from verl.embedded.models import materialize_embedded_model

        return materialize_embedded_model("tiny-llama", root)
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0, **SHAPES[name])
    torch.manual_seed(0)
    path = os.path.join(root, name)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def prompts(b: int, p: int, vocab: int) -> DataProto:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (b, p), generator=g)
    mask = torch.ones(b, p, dtype=torch.long)
    pos = torch.arange(p).expand(b, p).clone()
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def median_call(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def bench_model(name: str, args, root: str) -> dict:
    from safetensors.torch import load_file

    from verl.engine_protocol import RolloutSettings
    from verl_rollout.hf import HFRollout
    from verl_rollout.vllm import VLLMRollout

    path = model_dir(name, root)
    weights = {}
    for f in Path(path).glob("*.safetensors"):
        weights.update(load_file(str(f)))
    n_params = sum(t.numel() for t in weights.values())
    vocab = int(next(t for k, t in weights.items() if k.endswith("embed_tokens.weight")).shape[0])
    batch = prompts(args.prompts, args.prompt_len, vocab)
    cfg = RolloutConfig(temperature=1.0)
    common = dict(max_new_tokens=args.max_new_tokens, eos_ids=(2,), pad_id=0, device=args.device)
    row = {"model": name, "params": n_params}
    engines = {
        "hf": lambda: HFRollout(cfg, model_path=path, settings=RolloutSettings(**common)),
        "vllm": lambda: VLLMRollout(
            cfg,
            model_path=path,
            settings=RolloutSettings(**common, max_prompt_length=args.prompt_len, dtype=args.dtype),
        ),
    }
    for engine_name, make in engines.items():
        start = time.perf_counter()
        engine = make()
        row[f"{engine_name}_init_s"] = time.perf_counter() - start
        row.update({f"{engine_name}_{k}": v for k, v in bench_engine(engine, batch, weights, args).items()})
        del engine
    return row


def bench_engine(engine, batch: DataProto, weights: dict, args) -> dict:
    torch.manual_seed(0)
    secs, out = median_call(lambda: engine.generate(batch, n=args.n), args.repeats)
    tokens = int(out.batch["response_mask"].sum())
    sync_s, _ = median_call(lambda: engine.update_weights(iter(weights.items())), args.repeats)
    return {"gen_s": secs, "tokens": tokens, "tok_s": tokens / secs, "sync_s": sync_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", help="vLLM's dtype on GPU (CPU always runs float32)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollout_engines_cpu.md"))
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as root:
        rows = [bench_model(m, args, root) for m in args.models.split(",")]

    import vllm

    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_name()
    lines = [
        "# Rollout engines: vllm vs hf generation throughput and weight-sync time",
        "",
        f"Measured {datetime.now(timezone.utc).isoformat(timespec='seconds')} with "
        f"`benchmarks/rollout_engines.py {' '.join(sys.argv[1:])}`.",
        "",
        f"- Machine: {device} ({args.device}), {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}, vLLM {vllm.__version__}",
        f"- Settings: {args.prompts} prompts x {args.n} samples, {args.prompt_len} prompt tokens, up to "
        f"{args.max_new_tokens} new tokens, temperature 1.0; random weights; medians over {args.repeats} calls "
        f"after a warm-up; hf with its own copy of the weights (dtype float32 on CPU)",
        f"- Load average before: {load_before:.2f}",
        "",
        "| model | params | hf tok/s | vllm tok/s | **vllm / hf** | hf sync s | vllm sync s | hf init s | vllm init s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['hf_tok_s']:.0f} | {r['vllm_tok_s']:.0f} | "
            f"**{r['vllm_tok_s'] / r['hf_tok_s']:.2f}** | {r['hf_sync_s']:.3f} | {r['vllm_sync_s']:.3f} | "
            f"{r['hf_init_s']:.1f} | {r['vllm_init_s']:.1f} |"
        )
    lines += [
        "",
        "Generation tokens are the response tokens inside the mask (up to and including eos). A sync loads every",
        "tensor of the model from an in-memory state dict: hf copies into its parameters, vllm runs its weight",
        "loaders in place (`reload_weights`) and resets its prefix cache.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
