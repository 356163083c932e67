"""The rollout service's replica over vLLM: its own scheduler stepped request by request against generate calls in
turns, on the same requests with long-tail lengths, and the cost of a weight update midway in each.

    python benchmarks/rollout_service.py [--requests 64] [--max-new-tokens 128] [--out FILE]

Runs where vLLM is installed (in this repository: the Pants resolve `vllm`). A random Llama of 4 layers, hidden
256, vocabulary 4096 (built locally); requests with prompts of 8-32 tokens and token limits log-normal in
[4, --max-new-tokens] (eos never stops them, so every mode produces the same number of tokens). Modes:

  stepped      vLLM's scheduler: each step adds a token to every running request, KV caches kept
  turns-32     the service's turns: `generate` over every live request, 32 new tokens each, prompt + tokens so far
  turns-8      the same with 8 tokens per turn (weights arrive sooner, more prefill again)

Each mode runs the requests twice: as they are, and with a weight update after half of the tokens are out (the
stepped mode then restarts the requests inside the engine from their tokens so far; turns take the new weights
between two turns). Reported: seconds until every request finished, tokens/s, and the update's cost.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for src in ("verl-core", "verl-rollout"):
    sys.path.insert(0, str(ROOT / "packages" / src / "src"))

from machine import machine_line, write_report  # noqa: E402


class Turns:
    """The engine seen through `generate` alone: the service runs it in turns."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, *args, **kwargs):
        return self.engine.generate(*args, **kwargs)

    def update_weights(self, weights):
        return self.engine.update_weights(weights)


def make_model(root: str) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=None,  # nothing stops a request before its limit
        pad_token_id=0,
    )
    torch.manual_seed(0)
    path = os.path.join(root, "llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def make_requests(k: int, max_new: int, seed: int = 0) -> list:
    from verl.workers.rollout_server import Request

    g = torch.Generator().manual_seed(seed)
    plens = torch.randint(8, 33, (k,), generator=g).tolist()
    limits = torch.exp(torch.randn(k, generator=g) * 0.9 + 3.0).clamp(4, max_new).long().tolist()
    return [
        Request(f"r{i}", torch.randint(3, 4096, (p,), generator=g).tolist(), temperature=1.0, max_tokens=n)
        for i, (p, n) in enumerate(zip(plens, limits))
    ]


def run(server, requests: list, weights: list | None) -> dict:
    """Submit every request, optionally load `weights` once half of the tokens are out; wait for all."""
    total = sum(r.max_tokens for r in requests)
    start = time.perf_counter()
    server.submit(requests)
    done, produced, update_s = {}, 0, 0.0
    while len(done) < len(requests):
        finished, updates = server.poll(timeout_s=0.05, stream=True)
        produced += sum(len(u.tokens) for u in updates) + sum(len(f.tokens) for f in finished)
        done.update({f.id: f for f in finished})
        if weights is not None and produced >= total // 2:
            t = time.perf_counter()
            server.load_weights(iter(weights), version=1)
            update_s, weights = time.perf_counter() - t, None
    seconds = time.perf_counter() - start
    tokens = sum(len(f.tokens) for f in done.values())
    return {"s": seconds, "tokens": tokens, "tok_s": tokens / seconds, "update_s": update_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollout_service_cpu.md"))
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    import torch.distributed as dist
    from safetensors.torch import load_file

    from verl.config.schema import RolloutConfig
    from verl.controller.worker import free_port
    from verl.engine_protocol import RolloutSettings
    from verl.workers.rollout_server import RolloutServer
    from verl_rollout.vllm import VLLMRollout

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    root = tempfile.mkdtemp(prefix="verl-service-")
    path = make_model(root)
    weights = list(load_file(os.path.join(path, "model.safetensors")).items())
    engine = VLLMRollout(
        RolloutConfig(),
        model_path=path,
        settings=RolloutSettings(max_new_tokens=args.max_new_tokens, eos_ids=(), pad_id=0, max_prompt_length=32),
    )
    modes = {
        "stepped": (lambda: engine, 32),
        "turns-32": (lambda: Turns(engine), 32),
        "turns-8": (lambda: Turns(engine), 8),
    }
    warm = RolloutServer(engine, eos_ids=[], pad_id=0, max_new_tokens=args.max_new_tokens)
    run(warm, make_requests(8, 16, seed=1), None)
    warm.close()
    results = {}
    for name, (wrap, chunk) in modes.items():
        for update in (False, True):
            server = RolloutServer(
                wrap(), eos_ids=[], pad_id=0, max_new_tokens=args.max_new_tokens, chunk=chunk, max_batch=256
            )
            results[name, update] = run(
                server, make_requests(args.requests, args.max_new_tokens), weights if update else None
            )
            server.close()
            print(name, "update" if update else "", results[name, update], flush=True)
    dist.destroy_process_group()

    import vllm

    limits = [r.max_tokens for r in make_requests(args.requests, args.max_new_tokens)]
    base = results["turns-32", False]["tok_s"]
    lines = [
        "# The rollout service over vLLM: its scheduler stepped vs generate in turns (CPU)",
        "",
        f"Measured {time.strftime('%Y-%m-%dT%H:%M:%S%z')} with `benchmarks/rollout_service.py --requests "
        f"{args.requests} --max-new-tokens {args.max_new_tokens}`.",
        "",
        f"- Machine: {machine_line()}, vLLM {vllm.__version__}",
        "- Model: random Llama, 4 layers, hidden 256, vocabulary 4096 (~5M parameters), float32",
        f"- Requests: {args.requests}, prompts of 8-32 tokens, token limits log-normal in [4, {args.max_new_tokens}] "
        f"(sum {sum(limits):,}, longest {max(limits)}); temperature 1.0, no eos",
        "",
        "| mode | s | tokens/s | vs turns-32 | with a weight update: s | tokens/s | the update's s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in modes:
        a, b = results[name, False], results[name, True]
        lines.append(
            f"| {name} | {a['s']:.2f} | {a['tok_s']:.0f} | **{a['tok_s'] / base:.2f}x** | {b['s']:.2f} | "
            f"{b['tok_s']:.0f} | {b['update_s']:.3f} |"
        )
    lines += [
        "",
        "stepped: requests inside vLLM's scheduler, one token each per step, their KV caches kept; turns-k: the",
        "service's own turns, one `generate` over every live request for k tokens, each turn computing every",
        "request's prompt and tokens so far again (vLLM's prefix cache shortens that). A weight update midway",
        "restarts the stepped requests from their tokens so far (prefill again, under the new weights), and",
        "resets the prefix cache in both.",
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
