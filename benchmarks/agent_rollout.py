"""Agent rollouts with many trajectories in flight vs a turn-synchronous loop, on the same engine and tool.

Each trajectory runs K model turns of up to T tokens (greedy), a tool call between turns whose latency is drawn
from an exponential distribution of mean L seconds (the same draws in both modes: seeded by trajectory and turn).

- `in_flight`: the agent runner (verl.agents): every trajectory its own task; the batching client serves whatever
  turns are waiting in each round, so a trajectory whose tool answered early goes on while slow tools run.
- `turn_sync`: the loop many frameworks ran first: one batched generate for every live trajectory, then all the
  turn's tool calls (concurrently), waiting for the slowest, then the next turn.

The engine is grpo_tiny's: the embedded tiny Llama in the hf rollout of a local-controller trainer (no warm
start: the model's words do not matter here, only the turn structure). Trajectories/s and the ratio are reported
per latency; generated tokens are counted to show both modes did the same work.

    python benchmarks/agent_rollout.py [--trajectories 64] [--turns 3] [--tokens 8] [--repeats 3]
        [--out benchmarks/results/agent_rollout_cpu.md]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine_line, write_report  # noqa: E402

TOOL_RESULT = [{"role": "tool", "content": "42"}]


def latency(i: int, turn: int, mean_s: float) -> float:
    return random.Random(i * 1000 + turn).expovariate(1 / mean_s) if mean_s > 0 else 0.0


async def fixed_turns(sample, ctx, *, turns: int, tokens: int, mean_s: float):
    """K turns with a tool call of random latency between them (the benchmark's agent loop)."""
    i = sample.extra_info["bench_index"]
    for turn in range(turns):
        await ctx.generate(max_new_tokens=tokens)
        if turn == turns - 1:
            break
        await asyncio.sleep(latency(i, turn, mean_s))  # the tool
        ctx.insert(TOOL_RESULT)
    ctx.trajectory.finish = "answer"
    return ctx.trajectory


def in_flight(runner, samples, generate_batch, turns, tokens, mean_s):
    import functools

    runner.loop = functools.partial(fixed_turns, turns=turns, tokens=tokens, mean_s=mean_s)
    trajectories, metrics = runner.run(samples, generate_batch, temperature=0.0)
    return trajectories, metrics["agent/rounds"]


def turn_sync(runner, samples, generate_batch, turns, tokens, mean_s):
    from verl.agents.client import Request
    from verl.agents.trajectory import Trajectory

    trajectories = [Trajectory(prompt_ids=list(s.prompt_ids)) for s in samples]

    async def tools(turn: int) -> None:
        await asyncio.gather(*(asyncio.sleep(latency(i, turn, mean_s)) for i in range(len(samples))))

    for turn in range(turns):
        out = generate_batch([Request(t.context, tokens, 0.0) for t in trajectories])
        for t, c in zip(trajectories, out):
            t.add_model_tokens(c.ids, c.log_probs)
        if turn < turns - 1:
            asyncio.run(tools(turn))  # the barrier: every call of the turn answered
            for t in trajectories:  # (rendered per trajectory, as the in-flight loop's ctx.insert does)
                t.add_inserted_tokens(runner.renderer.ids(TOOL_RESULT))
    return trajectories, float(turns)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trajectories", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--latencies", default="0,0.05,0.2,0.5", help="mean tool latencies, seconds")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/agent_rollout_cpu.md"))
    args = p.parse_args()

    import torch

    from verl.agents.client import Request
    from verl.agents.loops import AgentSample
    from verl.agents.runner import AgentRunner
    from verl.config.loader import load_config
    from verl.trainer.agent_rollouts import batch_generator
    from verl.trainer.ppo import PPOTrainer
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    torch.set_num_threads(1)
    out_dir = "/tmp/verl-bench-agent-rollout"
    cfg = load_config(
        ROOT / "recipes/grpo_tiny.yaml",
        [
            "model.warm_start=null",
            "trainer.controller=local",
            f"trainer.output_dir={out_dir}",
            "trainer.resume=disable",
            "tracking.loggers=[]",
            f"data.max_response_length={args.turns * (args.tokens + 8)}",
        ],
    )
    trainer = PPOTrainer(cfg)
    try:
        group = trainer.workers.actor_rollout

        def call(inputs, t, max_new_tokens):
            return group.call(ActorRolloutRefWorker.generate, inputs, n=1, temperature=t, max_new_tokens=max_new_tokens)

        tok = trainer.tokenizer
        generate_batch = batch_generator(call, dp=trainer.dp, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
        agent = SimpleNamespace(
            loop="single_turn", tools=[], tool_parser="hermes", max_turns=args.turns, tool_timeout_s=60.0,
            max_wall_s=None, max_in_flight=4096, env=None, program=None,
        )  # fmt: skip
        runner = AgentRunner(agent, tok, response_length=cfg.data.max_response_length)
        prompts = [f"{a}*{b}=" for a, b in zip(range(11, 99), range(97, 9, -1))][: args.trajectories]
        samples = [
            AgentSample(tok(q, add_special_tokens=False)["input_ids"], q, None, {"bench_index": i}, "bench")
            for i, q in enumerate(prompts)
        ]
        generate_batch([Request(list(samples[0].prompt_ids), args.tokens, 0.0)])  # warm-up
        rows = []
        for mean_s in [float(x) for x in args.latencies.split(",")]:
            times = {"in_flight": [], "turn_sync": []}
            rounds, tokens = {}, {}
            modes = [("turn_sync", turn_sync), ("in_flight", in_flight)]
            for r in range(args.repeats):
                for name, fn in modes[:: 1 if r % 2 == 0 else -1]:  # (alternating which goes first)
                    start = time.perf_counter()
                    trajectories, rounds[name] = fn(runner, samples, generate_batch, args.turns, args.tokens, mean_s)
                    times[name].append(time.perf_counter() - start)
                    tokens[name] = sum(sum(t.loss_mask) for t in trajectories)
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append((mean_s, med, rounds, tokens))
            print(
                f"latency {mean_s:g} s: " + ", ".join(f"{k} {args.trajectories / v:.1f} traj/s" for k, v in med.items())
            )
    finally:
        trainer.close()

    lines = [
        "# Agent rollouts: many trajectories in flight vs turn-synchronous",
        "",
        f"Machine: {machine_line()}; 1 torch thread.",
        f"Workload: {args.trajectories} trajectories x {args.turns} greedy model turns of <= {args.tokens} tokens, "
        "a tool call between turns with exponential latency of the given mean (same draws in both modes); engine: "
        "grpo_tiny's hf rollout (embedded tiny Llama), local controller. Median of "
        f"{args.repeats} runs each.",
        "",
        "| mean tool latency | turn-sync traj/s | in-flight traj/s | ratio | generate calls (sync / in-flight) "
        "| model tokens (sync / in-flight) |",
        "|---|---|---|---|---|---|",
    ]
    for mean_s, med, rounds, tokens in rows:
        n = args.trajectories
        lines.append(
            f"| {mean_s:g} s | {n / med['turn_sync']:.1f} | {n / med['in_flight']:.1f} | "
            f"{med['turn_sync'] / med['in_flight']:.2f}x | {rounds['turn_sync']:.0f} / {rounds['in_flight']:.0f} | "
            f"{tokens['turn_sync']} / {tokens['in_flight']} |"
        )
    lines += [
        "",
        "With no tool latency both modes batch every turn the same way (the in-flight runner's rounds are the "
        "turns, and the ratio is run-to-run noise around 1: 0.99x in a 5-run repeat); with slow, uneven tools the turn-synchronous loop waits for the slowest call of each turn while "
        "the in-flight runner generates for the trajectories whose tools have answered.",
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
