"""Checks of rollout.agent: a loop that exists, and the tools, parser, environment or program it needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import List

from verl.config.checks import Context, error_at, warning_at
from verl.config.errors import ConfigProblem
from verl.config.placement import value


def check_agent(ctx: Context) -> List[ConfigProblem]:
    from verl.agents.loops import AGENT_LOOPS
    from verl.agents.parsers import PARSERS
    from verl.agents.tools import TOOLS

    cfg, problems = ctx.cfg, []
    loop, tools = value(cfg, "rollout.agent.loop"), value(cfg, "rollout.agent.tools") or []
    if loop is None:
        if tools:
            problems.append(
                warning_at("rollout.agent.tools", "tools are listed but no agent loop calls them", _LOOP_FIX)
            )
        return problems
    if isinstance(loop, str) and loop not in AGENT_LOOPS:
        problems.append(error_at("rollout.agent.loop", f"unknown agent loop {loop!r}", _LOOP_FIX))
    elif not isinstance(loop, (str, Mapping)) or (isinstance(loop, Mapping) and "_target_" not in loop):
        problems.append(
            error_at("rollout.agent.loop", f"expected a name or a _target_ mapping, got {loop!r}", _LOOP_FIX)
        )
    for i, spec in enumerate(tools):
        if not isinstance(spec, Mapping) or ("_target_" not in spec and spec.get("name") not in TOOLS):
            problems.append(
                error_at(
                    f"rollout.agent.tools[{i}]",
                    f"not a tool: {spec!r}",
                    f"write {{name: NAME}} with NAME one of {sorted(TOOLS)}, or {{_target_: pkg.module.YourTool}}",
                )
            )
    if loop == "tool_agent" and not tools:
        problems.append(
            error_at("rollout.agent.tools", "tool_agent has no tools to call", "list them, e.g. [{name: calculator}]")
        )
    parser = value(cfg, "rollout.agent.tool_parser")
    if tools and parser not in PARSERS:
        problems.append(
            error_at(
                "rollout.agent.tool_parser", f"unknown tool-call parser {parser!r}", f"use one of {sorted(PARSERS)}"
            )
        )
    if loop == "env_agent" and value(cfg, "rollout.agent.env") is None:
        problems.append(
            error_at(
                "rollout.agent.env",
                "env_agent has no environment",
                "set rollout.agent.env={_target_: pkg.module.YourEnv} (reset(sample), step(action) -> obs, reward, done)",
            )
        )
    program = value(cfg, "rollout.agent.program")
    if loop == "openai_agent" and program is None:
        problems.append(
            error_at(
                "rollout.agent.program",
                "openai_agent has no agent program to run",
                "set rollout.agent.program=pkg.module.fn (fn(base_url, api_key, sample)) or a command line "
                "[python, my_agent.py] (OPENAI_BASE_URL and OPENAI_API_KEY in its environment)",
            )
        )
    elif program is not None and loop != "openai_agent":
        problems.append(
            warning_at("rollout.agent.program", f"an agent program is set but the loop is {loop!r}", _LOOP_FIX)
        )
    return problems


_LOOP_FIX = (
    "set rollout.agent.loop to single_turn, tool_agent, env_agent, openai_agent (with rollout.agent.program), "
    "or {_target_: pkg.module.your_async_loop}"
)
