"""Agent loops: `async def loop(sample, ctx) -> Trajectory`, registered by name (or a `_target_` function).

A loop turns one sample into a trajectory through `ctx`: `await ctx.generate()` runs a model turn from the
trajectory's context and appends its tokens; `ctx.insert(messages)` renders messages (tool results, observations)
and appends their ids untrained. Built-ins: `single_turn` (one completion, today's rollout), `tool_agent` (tool
calls parsed, run, results appended, until an answer or a limit) and `env_agent` (an environment's reset/step).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional

from verl.agents.client import Completion, GenerationClient
from verl.agents.parsers import Parser
from verl.agents.render import InsertRenderer
from verl.agents.tools import Tool, run_tool
from verl.agents.trajectory import Trajectory
from verl.config.errors import ConfigError, ConfigProblem
from verl.config.instantiate import instantiate
from verl.registry import Registry, UnknownNameError


@dataclass
class AgentSample:
    """One row of the data set as a loop sees it."""

    prompt_ids: List[int]
    raw_prompt: str
    ground_truth: Any
    extra_info: Dict[str, Any]
    data_source: str = ""
    messages: List[Dict[str, Any]] = field(default_factory=list)  # the prompt's conversation (before rendering)


@dataclass
class AgentContext:
    client: GenerationClient
    tokenizer: Any
    renderer: InsertRenderer
    trajectory: Trajectory
    max_response_tokens: int  # the whole response: model turns and inserted tokens
    max_turns: int
    temperature: Optional[float] = None
    tools: Mapping[str, Tool] = field(default_factory=dict)  # the ones this sample may call
    tool_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # the sample's hidden arguments
    parser: Optional[Parser] = None
    tool_timeout_s: float = 10.0
    make_env: Optional[Callable[[], Any]] = None
    endpoint: Any = None  # openai_agent: the ChatEndpoint serving this trajectory's session
    program: Any = None  # openai_agent: the external agent program

    @property
    def budget(self) -> int:
        return self.max_response_tokens - len(self.trajectory.response_ids)

    async def generate(self, max_new_tokens: Optional[int] = None) -> Completion:
        """One model turn from the trajectory's context (at most `max_new_tokens`, and what the budget leaves), its
        tokens and log-probs appended (trained)."""
        limit = self.budget if max_new_tokens is None else min(self.budget, max_new_tokens)
        c = await self.client.generate(self.trajectory.context, max_new_tokens=limit, temperature=self.temperature)
        self.trajectory.add_model_tokens(c.ids, c.log_probs)
        if c.version is not None:
            self.trajectory.versions.append(c.version)
        self.trajectory.final_text = self.decode(c.ids)
        return c

    def insert(self, messages: List[Dict[str, Any]]) -> bool:
        """Append messages after a model turn (untrained); False, with nothing appended, when they would not leave
        a token for the next turn (the trajectory then ends: finish "length")."""
        ids = self.renderer.ids(messages)
        if len(ids) >= self.budget:
            return False
        self.trajectory.add_inserted_tokens(ids)
        return True

    def decode(self, ids: List[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


AgentLoop = Callable[[AgentSample, AgentContext], Awaitable[Trajectory]]
# (black_box's loops live in a module of their own, which registers them when the registry is first read)
AGENT_LOOPS = Registry("agent loop", builtins=("verl.agents.black_box",))


def register_agent_loop(name: str) -> Callable[[AgentLoop], AgentLoop]:
    """Decorator: make an async `loop(sample, ctx) -> Trajectory` available as `rollout.agent.loop: <name>`."""
    return AGENT_LOOPS.register(name)


def make_agent_loop(spec: Any, key: str = "rollout.agent.loop") -> AgentLoop:
    """A registered loop by name, or `{_target_: pkg.module.loop, setting: ...}` (settings bound as keywords)."""
    if isinstance(spec, str):
        try:
            return AGENT_LOOPS.get(spec)
        except UnknownNameError as e:
            raise ConfigError([ConfigProblem(key, str(e), f"use one of {AGENT_LOOPS.names()} or _target_")]) from None
    loop = instantiate({**dict(spec), "_partial_": True}, key=key)
    fn = loop.func if isinstance(loop, functools.partial) else loop
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(
            [
                ConfigProblem(
                    key, f"{spec['_target_']} is not an async function", "write it as async def loop(sample, ctx)"
                )
            ]
        )
    return loop


@register_agent_loop("single_turn")
async def single_turn(sample: AgentSample, ctx: AgentContext) -> Trajectory:
    c = await ctx.generate()
    ctx.trajectory.finish = "answer" if c.finished else "length"
    return ctx.trajectory


@register_agent_loop("tool_agent")
async def tool_agent(sample: AgentSample, ctx: AgentContext) -> Trajectory:
    """Generate; run the turn's tool calls (concurrently) and append their results; repeat until a turn calls
    nothing (the answer), the turn limit, or the token budget. A malformed call is answered with what was wrong."""
    t = ctx.trajectory
    while True:
        c = await ctx.generate()
        if not c.finished:
            t.finish = "length"
            return t
        turn = ctx.parser(t.final_text, ctx.tools)
        if turn.is_answer:
            t.finish = "answer"
            return t
        if t.turns >= ctx.max_turns:
            t.finish = "max_turns"
            return t
        messages = [{"role": "tool", "content": f"error: malformed tool call: {why}"} for why in turn.malformed]
        t.malformed += turn.malformed
        results = await asyncio.gather(
            *(run_tool(ctx.tools, call, ctx.tool_timeout_s, ctx.tool_kwargs.get(call.name)) for call in turn.calls)
        )
        for call, result in zip(turn.calls, results):
            t.tool_calls.append({"name": call.name, "arguments": call.arguments, "status": result.status})
            messages.append({"role": "tool", "name": call.name, "content": result.text})
        if not ctx.insert(messages):
            t.finish = "length"
            return t


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@register_agent_loop("env_agent")
async def env_agent(sample: AgentSample, ctx: AgentContext) -> Trajectory:
    """An environment's episode: reset(sample) starts it (the sample's prompt is the first observation); each model
    turn is an action for step(action) -> (observation, reward, done); observations are appended as user messages.
    The step rewards are the trajectory's turn_rewards."""
    t = ctx.trajectory
    env = ctx.make_env()
    await _maybe_await(env.reset(sample))
    while True:
        c = await ctx.generate()
        observation, reward, done = await _maybe_await(env.step(t.final_text))
        t.turn_rewards.append(float(reward))
        if done:
            t.finish = "answer"
            return t
        if not c.finished:
            t.finish = "length"
            return t
        if t.turns >= ctx.max_turns:
            t.finish = "max_turns"
            return t
        if not ctx.insert([{"role": "user", "content": str(observation)}]):
            t.finish = "length"
            return t
