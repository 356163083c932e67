"""The `openai_agent` loop: an external agent program, given a base URL and an API key of the run's
OpenAI-compatible endpoint, plays each trajectory; the endpoint records what the model produced.

`rollout.agent.program` is either a Python function `pkg.module.fn(base_url, api_key, sample) -> str | None`
(run on a thread; e.g. one that builds `openai.OpenAI(base_url=..., api_key=...)`) or a command line (a list),
run with OPENAI_BASE_URL and OPENAI_API_KEY in its environment and the sample as JSON on stdin
(`{"messages": [...], "extra_info": {...}}`). What the program returns (the function's string, the command's
stdout) is the trajectory's final answer for the reward; without one it is the model's last reply.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, Optional

from verl.agents.loops import AgentContext, AgentSample, register_agent_loop
from verl.agents.trajectory import Trajectory
from verl.config.instantiate import resolve_target


class AgentProgramError(RuntimeError):
    """The agent program failed (a command's nonzero exit, with the end of its stderr)."""


async def _run_command(cmd: list, base_url: str, api_key: str, sample: AgentSample) -> str:
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key}
    proc = await asyncio.create_subprocess_exec(
        *[str(c) for c in cmd],
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    payload = json.dumps({"messages": sample.messages, "extra_info": sample.extra_info}, default=str)
    try:
        out, err = await proc.communicate(payload.encode())
    finally:
        if proc.returncode is None:  # the trajectory ran out of wall time: the program goes with it
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        tail = "\n".join(err.decode(errors="replace").strip().splitlines()[-5:])
        raise AgentProgramError(f"{cmd[0]} exited with {proc.returncode}: {tail}")
    return out.decode(errors="replace").strip()


async def run_program(program: Any, base_url: str, api_key: str, sample: AgentSample) -> Optional[str]:
    if isinstance(program, (list, tuple)):
        return await _run_command(list(program), base_url, api_key, sample)
    fn = resolve_target(program, key="rollout.agent.program") if isinstance(program, str) else program
    out = await asyncio.to_thread(fn, base_url, api_key, sample)
    return None if out is None else str(out)


@register_agent_loop("openai_agent")
async def openai_agent(sample: AgentSample, ctx: AgentContext) -> Trajectory:
    sid, base_url = ctx.endpoint.open_session(ctx)
    try:
        answer = await run_program(ctx.program, base_url, ctx.endpoint.token, sample)
    finally:
        session = ctx.endpoint.close_session(sid)
    t = ctx.trajectory  # (a new one when the program rewrote its history)
    t.info.update(endpoint_requests=session.requests, history_rewrites=session.history_rewrites)
    if answer:
        t.final_text = answer
    t.finish = "answer" if session.last_finished and ctx.budget > 0 else "length"
    return t
