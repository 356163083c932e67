"""Many trajectories in flight at once: each sample's agent loop runs as its own task over one generation client,
with limits on turns, tokens and wall time per trajectory."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.agents.client import BatchingClient, GenerateBatch
from verl.agents.endpoint import ChatEndpoint
from verl.agents.loops import AgentContext, AgentSample, make_agent_loop
from verl.agents.parsers import get_parser
from verl.agents.render import InsertRenderer
from verl.agents.tools import make_tools, schema
from verl.agents.trajectory import Trajectory, trajectory_metrics
from verl.config.instantiate import instantiate


class AgentLoopError(RuntimeError):
    """A user's agent loop raised: names the loop and the sample."""


class AgentRunner:
    """The agent loop of `rollout.agent` with its tools, parser and environment, run over batches of samples."""

    def __init__(
        self,
        agent: Any,
        tokenizer: Any,
        response_length: int,
        max_prompt_length: int = 1 << 20,
        max_turns: Optional[int] = None,
    ):
        """max_turns: the plan's agent_max_turns (None: rollout.agent.max_turns of `agent`)."""
        self.cfg, self.tokenizer, self.response_length = agent, tokenizer, response_length
        self.max_turns = int(max_turns if max_turns is not None else agent.max_turns)
        self.max_prompt_length = max_prompt_length  # (what an agent program's own prompt may hold)
        program = agent.program
        self.program = OmegaConf.to_container(program) if isinstance(program, (DictConfig, ListConfig)) else program
        self.loop = make_agent_loop(agent.loop)
        self.loop_name = agent.loop if isinstance(agent.loop, str) else str(agent.loop.get("_target_"))
        self.tools = make_tools(list(agent.tools or []))
        self.parser = get_parser(agent.tool_parser)
        self.tool_schemas = [schema(t) for t in self.tools.values()]  # what the prompts' chat template gets
        self.renderer = InsertRenderer(tokenizer, self.tool_schemas)
        env = agent.env
        self.make_env: Optional[Callable[[], Any]] = (
            (lambda: instantiate(env, key="rollout.agent.env")) if env is not None else None
        )

    def run(
        self, samples: Sequence[AgentSample], generate_batch: GenerateBatch, temperature: Optional[float]
    ) -> Tuple[List[Trajectory], Dict[str, float]]:
        """Every sample's trajectory (in order) and the agent/* metrics of the lot."""
        return asyncio.run(self.arun(samples, BatchingClient(generate_batch), temperature))

    async def trajectory(
        self,
        sample: AgentSample,
        client: Any,
        temperature: Optional[float],
        endpoint: Optional[ChatEndpoint] = None,
        index: int = 0,
    ) -> Trajectory:
        """One sample's agent loop over `client` (a GenerationClient that counts live trajectories in and out),
        within the trajectory's wall-time limit; a loop that raises is named with its sample. The sample's
        extra_info may narrow the tools (`tools`) and give them hidden arguments (`tools_kwargs`)."""
        tools = sample.extra_info.get("tools")
        ctx = AgentContext(
            client=client,
            tokenizer=self.tokenizer,
            renderer=self.renderer,
            trajectory=Trajectory(prompt_ids=list(sample.prompt_ids)),
            max_response_tokens=self.response_length,
            max_turns=self.max_turns,
            temperature=temperature,
            tools=self.tools if tools is None else {name: self.tools[name] for name in tools},
            tool_kwargs=sample.extra_info.get("tools_kwargs") or {},
            parser=self.parser,
            tool_timeout_s=self.cfg.tool_timeout_s,
            make_env=self.make_env,
            endpoint=endpoint,
            program=self.program,
        )
        client.enter()
        try:
            return await asyncio.wait_for(self.loop(sample, ctx), self.cfg.max_wall_s)
        except asyncio.TimeoutError:
            ctx.trajectory.finish = "wall_time"
            return ctx.trajectory
        except Exception as e:
            raise AgentLoopError(
                f"agent loop {self.loop_name} raised {type(e).__name__}: {e}\n  on sample {index} "
                f"(data_source={sample.data_source!r}, prompt={sample.raw_prompt[:200]!r})"
            ) from e
        finally:
            client.leave()

    def endpoint(self) -> Optional[ChatEndpoint]:
        """The OpenAI-compatible endpoint an external agent program talks to (not started), if the loop has one."""
        if self.program is None:
            return None
        return ChatEndpoint(self.tokenizer, self.parser, max_prompt_tokens=self.max_prompt_length)

    async def arun(
        self, samples: Sequence[AgentSample], client: BatchingClient, temperature: Optional[float]
    ) -> Tuple[List[Trajectory], Dict[str, float]]:
        start = time.perf_counter()
        limit = asyncio.Semaphore(self.cfg.max_in_flight)
        trajectories: List[Trajectory] = [None] * len(samples)  # type: ignore[list-item]  # (the loops fill them)
        endpoint = self.endpoint()  # an external agent program: served over HTTP on loopback
        if endpoint is not None:
            endpoint.start(asyncio.get_running_loop())

        async def one(i: int) -> None:
            async with limit:
                trajectories[i] = await self.trajectory(samples[i], client, temperature, endpoint, index=i)

        try:
            await asyncio.gather(*(one(i) for i in range(len(samples))))
        finally:
            await client.close()
            if endpoint is not None:
                endpoint.close()
        seconds = time.perf_counter() - start
        metrics = trajectory_metrics(trajectories)
        metrics["agent/rounds"] = float(len(client.rounds))
        metrics["agent/round_size/mean"] = sum(client.rounds) / max(1, len(client.rounds))
        metrics["agent/trajectories_per_s"] = len(samples) / max(seconds, 1e-9)
        metrics["timing/agent_generate_s"] = client.busy_s
        return trajectories, metrics
