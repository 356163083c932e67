"""A GRPO step on one GPU through verl's own trainer: generation tokens/s, update tokens/s and MFU, the in-place
weight sync's GB/s, the trainer-vs-rollout log-prob mismatch in bf16 and the peak memory of each phase.

    python benchmarks/gpu_grpo_step.py                  # Qwen2.5-0.5B shapes, vLLM generating (hf without vLLM)
    python benchmarks/gpu_grpo_step.py --dry-run        # parse, print the settings, check the run config; no CUDA
    python benchmarks/gpu_grpo_step.py --device cpu --model tiny --steps 2   # a smoke run of this script on a CPU

The model is built here with random weights from a real architecture (bf16; speed depends on the shapes, not on
what the weights say) and saved as a Hugging Face folder with the embedded character tokenizer; the prompts are
random characters of that tokenizer, one token each, so every prompt has exactly --prompt-len tokens. Random
weights almost never emit eos, so responses run to --response-len. The reward is a function of the token rows
(the parity of their sum), which gives every group a spread of rewards and so nonzero GRPO advantages.

The run is the project's PPOTrainer (algorithm.adv_estimator grpo) with its in-process worker: the FSDP2 actor,
the rollout engine built by the project's builder beside it (vLLM in sleep mode, woken per phase), old log-probs
recomputed (two optimizer steps per step), the actor's weights synced into vLLM in place after every update.
Every figure comes from the trainer's own per-step metrics (metrics.jsonl): medians over the steps after the
first, which includes compilation and warm-up. The device's bf16 dense peak for MFU comes from the table in
benchmarks/machine.py (--peak-tflops overrides it). Results: a markdown section (--out) and its data (.json).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _src in sorted(ROOT.glob("packages/*/src"), reverse=True):
    if str(_src) not in sys.path:
        sys.path.insert(0, str(_src))

from machine import device_slug, gpu_line, machine_line, peak_bf16_tflops  # noqa: E402

# Architectures (Hugging Face config values): a real model's shapes, random weights.
MODELS = {
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "tiny": dict(  # a smoke test of this script (CPU): the same architecture, small
        model_type="qwen2",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    ),
}
PHASES = ("gen", "log_probs", "update", "weight_sync")
GIB = 2**30


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument(
        "--rollout", choices=["auto", "vllm", "hf"], default="auto", help="auto: vllm if importable, else hf"
    )
    p.add_argument("--prompts", type=int, default=32, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (rollout.n)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--response-len", type=int, default=512)
    p.add_argument("--mini-batch", type=int, help="prompts per optimizer step (default: half of --prompts)")
    p.add_argument("--micro-batch", type=int, default=16, help="samples per forward/backward")
    p.add_argument("--steps", type=int, default=3, help="GRPO steps; the first is warm-up")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.4, help="vLLM's share of the device")
    p.add_argument("--attn", default="sdpa", help="model.attn_implementation (flash_attention_2 needs flash-attn)")
    p.add_argument("--fused-kernels", action="store_true", help="actor.use_fused_kernels (no full-vocabulary logits)")
    p.add_argument("--peak-tflops", type=float, help="the device's bf16 dense peak (default: machine.py's table)")
    p.add_argument("--out", help="markdown section to write (default benchmarks/results/gpu_grpo_step_<device>.md)")
    p.add_argument("--dry-run", action="store_true", help="parse, print the settings, check the config; no CUDA")
    args = p.parse_args(argv)
    if args.mini_batch is None:
        args.mini_batch = max(1, args.prompts // 2)
    problems = [
        f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}"
        for k in ("prompts", "n", "prompt_len", "response_len", "mini_batch", "micro_batch", "steps")
        if getattr(args, k) < 1
    ]
    if args.prompts % args.mini_batch:
        problems.append(f"--mini-batch ({args.mini_batch}) must divide --prompts ({args.prompts})")
    if not 0 < args.gpu_memory_utilization < 1:
        problems.append(f"--gpu-memory-utilization must be in (0, 1), got {args.gpu_memory_utilization}")
    if problems:
        p.error("; ".join(problems))
    return args


def settings_line(args, rollout: str) -> str:
    optimizer_steps = args.prompts // args.mini_batch
    line = (
        f"{args.prompts} prompts x {args.n} samples, {args.prompt_len} prompt tokens, up to {args.response_len} "
        f"response tokens, temperature 1.0; {optimizer_steps} optimizer step(s) per step (mini-batch "
        f"{args.mini_batch} prompts), micro-batch {args.micro_batch} samples, AdamW; FSDP2 actor, "
        f"{'bf16' if args.device == 'cuda' else 'float32 (CPU)'}, attention {args.attn}, shared-prefix packing"
        f"{', fused log-prob kernels' if args.fused_kernels else ''}; rollout {rollout}"
    )
    if rollout == "vllm":
        line += f" (gpu_memory_utilization {args.gpu_memory_utilization}, asleep while the actor trains)"
    if args.steps > 1:
        return line + f"; {args.steps} steps, figures are medians over steps 2..{args.steps} (the first warms up)"
    return line + "; 1 step (its warm-up included)"


def run_config(args, model_path: str, data_path: str, out_dir: str, rollout: str) -> dict:
    """The run, as a recipe would write it (sections of verl's config schema)."""
    return {
        "trainer": {
            "total_steps": args.steps,
            "val_every": 0,
            "val_before_train": False,
            "resume": "disable",
            "output_dir": out_dir,
        },
        "data": {
            "train_files": [data_path],
            "max_prompt_length": args.prompt_len,
            "max_response_length": args.response_len,
            "train_batch_size": args.prompts,
        },
        "model": {"path": model_path, "dtype": "bfloat16", "attn_implementation": args.attn},
        "algorithm": {"adv_estimator": "grpo"},
        "actor": {
            "backend": "fsdp",
            "ppo_mini_batch_size": args.mini_batch,
            "ppo_micro_batch_size_per_device": args.micro_batch,
            "log_prob_micro_batch_size_per_device": args.micro_batch,
            "use_fused_kernels": bool(args.fused_kernels),
            "optim": {"lr": 1.0e-6},
        },
        "rollout": {
            "backend": rollout,
            "n": args.n,
            "temperature": 1.0,
            "gpu_memory_utilization": args.gpu_memory_utilization,
        },
        "placement": {
            "nnodes": 1,
            "devices_per_node": 1,
            "device": args.device,
            "pools": [{"name": "hybrid", "roles": ["actor", "rollout"]}],
        },
        "tracking": {"loggers": ["jsonl"], "curves": False},
        "checkpoint": {"save_every": 0, "save_last": False},
    }


def check_config(cfg: dict) -> list[str]:
    """The config's errors as `verl validate` finds them, planning for another machine (a missing GPU or vLLM is
    a warning there): a renamed or mistyped key fails here, before a GPU is spent on it."""
    from verl.config.errors import ConfigError
    from verl.config.loader import load_config
    from verl.config.validate import errors, validate_and_plan

    try:
        _, problems = validate_and_plan(load_config(cfg), strict=False)
    except ConfigError as e:  # (unknown keys and wrong types: found while loading)
        return [str(e)]
    return [p.format() for p in errors(problems)]


def choose_rollout(requested: str) -> tuple[str, str]:
    """(backend, why): vLLM when asked for or importable, else the hf engine."""
    if requested == "hf":
        return "hf", "asked for (--rollout hf)"
    if importlib.util.find_spec("vllm") is None:
        if requested == "vllm":
            sys.exit("--rollout vllm: vLLM is not installed")
        return "hf", "vLLM is not installed: the hf engine generates instead"
    try:
        import vllm
    except Exception as e:  # a broken install (a torch it was not built for): say so, measure the hf engine
        if requested == "vllm":
            raise
        return "hf", f"vLLM failed to import ({type(e).__name__}: {e}): the hf engine generates instead"
    return "vllm", f"vLLM {vllm.__version__}"


def make_model(args, root: str) -> tuple[str, dict]:
    """A Hugging Face folder: the architecture with random weights (seed 0) and the embedded character tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from verl.embedded.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    shape = dict(MODELS[args.model])
    config = AutoConfig.for_model(
        shape.pop("model_type"),
        **shape,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    with torch.device(args.device):  # random init on the GPU: seconds instead of a minute on the CPU
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    path = os.path.join(root, args.model)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    tied = bool(getattr(config, "tie_word_embeddings", False))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    info = {
        "params": total,
        # Parameters that multiply each token: all but the embedding lookup (a tied embedding is the lm_head's matrix).
        "matmul_params": total if tied else total - embed,
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "attn_dim": config.num_attention_heads * head_dim,
        "vocab": config.vocab_size,
        "tied": tied,
        "model_type": config.model_type,
    }
    del model
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return path, info


def make_data(args, root: str) -> str:
    """RL parquet rows (verl's format): prompts of --prompt-len random characters, one token each."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl.embedded.tokenizer import CHARACTERS

    chars = np.array(list(CHARACTERS.replace("\n", "")))
    rng = np.random.default_rng(0)
    rows = []
    for i in range(args.prompts * args.steps):
        text = "".join(rng.choice(chars, args.prompt_len))
        rows.append(
            {
                "data_source": "gpu_bench",
                "prompt": [{"role": "user", "content": text}],
                "ability": "none",
                "reward_model": {"style": "rule", "ground_truth": ""},
                "extra_info": {"index": i},
            }
        )
    path = os.path.join(root, "prompts.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def parity_reward(input_ids, attention_mask):
    """1 when the sum of a row's tokens is odd: a spread of rewards in every group, whatever the weights say."""
    return ((input_ids * attention_mask).sum(-1) % 2).float()


class DevicePeak:
    """The most device memory in use (every allocator: torch's, vLLM's pool, NCCL's), polled every 50 ms."""

    def __init__(self, device: str):
        self.peak, self.total, self.on = 0, 0, device == "cuda"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def poll(self) -> None:
        import torch

        while not self.stop.wait(0.05):
            free, self.total = torch.cuda.mem_get_info(0)
            self.peak = max(self.peak, self.total - free)

    def __enter__(self) -> "DevicePeak":
        if self.on:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.on:
            self.thread.join()


def median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def figures(args, rows: list[dict], info: dict, rollout: str, peak_tflops: float | None) -> dict:
    """The compared figures from the trainer's per-step metrics (medians over the measured steps)."""
    measured = rows[1:] if len(rows) > 1 else rows
    m = {k: median(measured, k) for k in sorted({k for r in measured for k in r})}
    samples = args.prompts * args.n
    resp = m.get("response_length/mean") or 0.0
    seq = args.prompt_len + resp
    tokens = (m.get("perf/tokens_per_s") or 0.0) * (m.get("timing/step_s") or 0.0)  # prompt + response, all samples
    gen_tokens = samples * resp
    # FLOPs per token of one forward: the matmuls, and causal attention over a sequence of mean length `seq`.
    fwd = 2 * info["matmul_params"] + 2 * info["layers"] * info["attn_dim"] * seq
    sync_s = m.get("timing/weight_sync_s") or 0.0
    update_s = (m.get("timing/update_s") or 0.0) - sync_s  # the update stage ends with the sync into the rollout
    logp_s = m.get("timing/log_probs_s") or 0.0
    gen_s = m.get("timing/gen_s") or 0.0
    peak = peak_tflops * 1e12 if peak_tflops else None
    out = {
        "step_s": m.get("timing/step_s"),
        "samples": samples,
        "response_len_mean": resp,
        "gen_tokens": gen_tokens,
        "gen_s": gen_s,
        "gen_tokens_per_s": gen_tokens / gen_s if gen_s else None,
        "train_tokens": tokens,
        "log_probs_s": logp_s,
        "log_probs_tokens_per_s": tokens / logp_s if logp_s else None,
        "log_probs_mfu": tokens * fwd / logp_s / peak if logp_s and peak else None,
        "update_s": update_s,
        "update_tokens_per_s": tokens / update_s if update_s > 0 else None,
        "update_mfu": tokens * 3 * fwd / update_s / peak if update_s > 0 and peak else None,
        "computed_tokens_ratio": m.get("actor/computed_tokens_ratio"),
        "sync_bytes": m.get("perf/weight_sync_bytes"),
        "sync_s": sync_s,
        "sync_gbps": (m.get("perf/weight_sync_bytes") or 0.0) / sync_s / 1e9 if sync_s else None,
        "logprob_diff_max": m.get("rollout/logprob_diff_max"),
        "logprob_diff_mean": m.get("rollout/logprob_diff_mean"),
        "prob_ratio_max": m.get("rollout/prob_ratio_max"),
        "tokens_per_s": m.get("perf/tokens_per_s"),
        "flops_per_token_fwd": fwd,
    }
    out.update({f"mem_{p}_gib": m.get(f"memory/{p}_peak_gib") for p in PHASES})
    return out


def fmt(v, spec: str = ",.0f", none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


def markdown(args, info, fig, meta) -> list[str]:
    rollout = meta["rollout"]
    gpu = args.device == "cuda"
    pct = lambda v: "n/a (no peak for this device: --peak-tflops)" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    sync = (
        f"{fmt(fig['sync_bytes'] and fig['sync_bytes'] / 1e9, '.2f')} GB in {fmt(fig['sync_s'], '.3f')} s = "
        f"**{fmt(fig['sync_gbps'], '.2f')} GB/s**"
        if fig["sync_bytes"]
        else "0 bytes: the hf engine generates on the actor's own weights (nothing to sync)"
    )
    mem = " / ".join(fmt(fig[f"mem_{p}_gib"], ".2f") for p in PHASES)
    lines = [
        f"## GRPO step: {args.model} shapes (random weights), FSDP2 actor, {rollout} generating",
        "",
        f"Measured {meta['date']} with `benchmarks/gpu_grpo_step.py {' '.join(meta['argv'])}` (commit {meta['commit']}).",
        "",
        f"- Machine: {meta['machine']}",
        f"- Settings: {settings_line(args, rollout)}",
        f"- Rollout: {meta['rollout_why']}",
        f"- Model: {info['params'] / 1e6:.1f}M parameters ({info['model_type']}, {info['layers']} layers, hidden "
        f"{info['hidden']}, vocabulary {info['vocab']}, {'tied' if info['tied'] else 'untied'} embeddings)",
        (
            f"- Peak for MFU: {meta['peak_tflops']:.1f} TFLOP/s bf16 dense ({meta['peak_from']})"
            if meta["peak_tflops"]
            else f"- Peak for MFU: {meta['peak_from']}"
        ),
        "",
        "| figure | value |",
        "|---|---|",
        f"| step | {fmt(fig['step_s'], '.2f')} s; start-up (trainer built: model, engines) {meta['startup_s']:.1f} s |",
        f"| generation | {fmt(fig['gen_tokens'])} tokens ({fig['samples']} samples, mean length "
        f"{fig['response_len_mean']:.0f}) in {fmt(fig['gen_s'], '.2f')} s = **{fmt(fig['gen_tokens_per_s'])} tokens/s** |",
        f"| old log-probs pass | {fmt(fig['train_tokens'])} tokens in {fmt(fig['log_probs_s'], '.2f')} s = "
        f"{fmt(fig['log_probs_tokens_per_s'])} tokens/s, MFU {pct(fig['log_probs_mfu'])} |",
        f"| update (weight sync excluded) | {fmt(fig['train_tokens'])} tokens in {fmt(fig['update_s'], '.2f')} s = "
        f"**{fmt(fig['update_tokens_per_s'])} tokens/s, MFU {pct(fig['update_mfu'])}** |",
        f"| weight sync into the rollout, in place | {sync} |",
        f"| trainer vs rollout log-probs on the sampled tokens ({'bf16' if gpu else 'float32'}) | max abs diff "
        f"{fmt(fig['logprob_diff_max'], '.3g')}, mean {fmt(fig['logprob_diff_mean'], '.3g')}, max prob ratio "
        f"{fmt(fig['prob_ratio_max'], '.3g')} |",
        f"| peak memory per phase, {'torch allocated' if gpu else 'process RSS'}: {' / '.join(PHASES)} | {mem} GiB |",
    ]
    if gpu:
        lines.append(
            f"| device memory in use, peak (every allocator, vLLM's included) | {meta['device_peak_gib']:.1f} of "
            f"{meta['device_total_gib']:.0f} GiB |"
        )
    lines += [
        f"| trainer's tokens/s (prompt + response tokens per step second) | {fmt(fig['tokens_per_s'])} |",
        "",
        "Tokens of the log-prob pass and the update are every sample's prompt and response tokens (a prompt counted "
        "once per sample, as tokens/s counts them); shared-prefix packing computes a prompt once per group "
        f"(actor/computed_tokens_ratio {fmt(fig['computed_tokens_ratio'], '.2f')} of the padded rows). MFU counts, "
        f"per token, 2 x {info['matmul_params'] / 1e6:.1f}M matmul parameters + causal attention (2 x layers x "
        "attention width x sequence length) FLOPs forward, 3x that for the update, against the peak above. The "
        "update's time is the trainer's update stage less the weight sync that ends it (vLLM's sleep included). "
        "Memory per phase is the trainer's memory/<phase>_peak_gib (the busiest rank's).",
        "",
        "| step | " + " | ".join(meta["columns"]) + " |",
        "|---" * (len(meta["columns"]) + 1) + "|",
    ]
    for i, r in enumerate(meta["rows"], 1):
        lines.append(f"| {i} | " + " | ".join(fmt(r.get(k), ".3g") for k in meta["columns"]) + " |")
    return lines + [""]


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def main(argv=None) -> None:
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    out = Path(args.out) if args.out else HERE / "results" / f"gpu_grpo_step_{args.device}.md"
    if args.dry_run:
        rollout = "vllm" if args.rollout == "auto" else args.rollout
        shown = "vllm (hf where vLLM is not importable)" if args.rollout == "auto" else rollout
        print(f"gpu_grpo_step: model {args.model} on {args.device}; {settings_line(args, shown)}")
        print(f"gpu_grpo_step: would write {out} and {out.with_suffix('.json')}")
        try:
            problems = check_config(run_config(args, "/model/built/at/run/time", "/prompts.parquet", "/out", rollout))
        except ImportError as e:
            print(f"gpu_grpo_step: the run config was not checked: verl's dependencies are not importable here ({e})")
            return
        if problems:
            sys.exit("gpu_grpo_step: the run config has errors:\n" + "\n".join(problems))
        print("gpu_grpo_step: run config checked (verl validate, planning for a GPU machine): no errors")
        return

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_grpo_step: no CUDA device here (run with --dry-run to check the settings)", file=sys.stderr)
        sys.exit(2)
    if args.device == "cpu" and args.rollout == "auto":
        rollout, why = "hf", "a CPU smoke run: the hf engine"
    else:
        rollout, why = choose_rollout(args.rollout)
    peak_tflops, peak_from = args.peak_tflops, "--peak-tflops"
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    if peak_tflops is None and args.device == "cuda":
        peak_tflops, peak_from = peak_bf16_tflops(name), f"{name}, benchmarks/machine.py"
    print(f"gpu_grpo_step: {name}; rollout {rollout} ({why})", flush=True)

    with tempfile.TemporaryDirectory(prefix="verl-gpu-grpo-") as root:
        os.environ.setdefault("VERL_CACHE", os.path.join(root, "cache"))  # (tokenised prompts: not the user's cache)
        model_path, info = make_model(args, root)
        data_path = make_data(args, root)
        out_dir = os.path.join(root, "run")
        cfg = run_config(args, model_path, data_path, out_dir, rollout)
        problems = check_config(cfg)
        if problems:
            sys.exit("gpu_grpo_step: the run config has errors:\n" + "\n".join(problems))

        from verl.trainer.ppo import PPOTrainer

        with DevicePeak(args.device) as device_peak:
            start = time.perf_counter()
            with PPOTrainer(cfg, reward_fn=parity_reward) as trainer:
                startup_s = time.perf_counter() - start
                print(f"gpu_grpo_step: trainer built in {startup_s:.1f} s; {args.steps} steps", flush=True)
                trainer.fit()
        with open(os.path.join(out_dir, "logs", "metrics.jsonl")) as f:
            rows = [r for r in map(json.loads, f) if "timing/step_s" in r]

    fig = figures(args, rows, info, rollout, peak_tflops)
    columns = [
        "timing/step_s",
        "timing/gen_s",
        "timing/log_probs_s",
        "timing/update_s",
        "timing/weight_sync_s",
        "perf/tokens_per_s",
        "response_length/mean",
        "rollout/logprob_diff_max",
        *(f"memory/{p}_peak_gib" for p in PHASES),
    ]
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": argv,
        "commit": commit(),
        "machine": gpu_line() if args.device == "cuda" else machine_line(),
        "device": name,
        "device_slug": device_slug(name),
        "rollout": rollout,
        "rollout_why": why,
        "peak_tflops": peak_tflops,
        "peak_from": peak_from if peak_tflops else "not known for this device: pass --peak-tflops",
        "startup_s": startup_s,
        "device_peak_gib": device_peak.peak / GIB,
        "device_total_gib": device_peak.total / GIB,
        "columns": [c for c in columns if any(c in r for r in rows)],
        "rows": rows,
    }
    lines = markdown(args, info, fig, meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    data = {"settings": vars(args), "model": info, "figures": fig, **{k: v for k, v in meta.items() if k != "columns"}}
    out.with_suffix(".json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    print("\n".join(lines))
    print(f"gpu_grpo_step: wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
