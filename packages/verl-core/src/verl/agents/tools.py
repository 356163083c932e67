"""Tools an agent loop may call: a registry by name, `_target_` tools, and running a call with a timeout.

A tool is any object with `name`, `description`, `parameters` (a JSON schema of its arguments, the form chat
templates take) and `__call__(**arguments) -> str` (sync or async). What a call returns, or how it failed, is
an observation the model reads on its next turn; a failure is never an exception in the rollout.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import operator
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Protocol, Sequence

from verl.config.errors import ConfigError, ConfigProblem
from verl.config.instantiate import instantiate
from verl.registry import Registry, UnknownNameError


class Tool(Protocol):
    name: str
    description: str
    parameters: Dict[str, Any]  # JSON schema of the arguments: {"type": "object", "properties": ..., "required": ...}

    def __call__(self, **arguments: Any) -> Any: ...


# (the sandboxed tools live in a module of their own, which registers them when the registry is first read)
TOOLS = Registry("tool", builtins=("verl.agents.sandbox",))


def register_tool(name: str) -> Callable:
    """Register a tool class (or factory) under `name`; recipes list it as `{name: NAME, ...settings}`."""
    return TOOLS.register(name)


def schema(tool: Tool) -> Dict[str, Any]:
    """The tool in the OpenAI function format chat templates render (`tools=` of apply_chat_template)."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def make_tools(specs: Sequence[Mapping[str, Any]], key: str = "rollout.agent.tools") -> Dict[str, Tool]:
    """The tools a recipe lists, by their names: `{name: calculator}` (a registered tool, other keys are its
    settings) or `{_target_: pkg.module.Tool, ...}`."""
    tools: Dict[str, Tool] = {}
    for i, spec in enumerate(specs):
        spec = dict(spec)
        where = f"{key}[{i}]"
        if "_target_" in spec:
            tool = instantiate(spec, key=where)
        else:
            name = spec.pop("name", None)
            try:
                make = TOOLS.get(str(name))
            except UnknownNameError as e:
                fix = f"use one of {TOOLS.names()}, or give _target_: pkg.module.YourTool"
                raise ConfigError([ConfigProblem(f"{where}.name", str(e), fix)]) from None
            try:
                tool = make(**spec)
            except (TypeError, ValueError, RuntimeError) as e:  # bad settings, or a tool that cannot run here
                raise ConfigError([ConfigProblem(where, f"tool {name!r}: {e}", _TOOL_SETTINGS_FIX)]) from None
        missing = [a for a in ("name", "description", "parameters") if not hasattr(tool, a)]
        if missing or not callable(tool):
            raise ConfigError(
                [ConfigProblem(where, f"{tool!r} is not a tool (missing {missing or ['__call__']})", _TOOL_FIX)]
            )
        if tool.name in tools:
            raise ConfigError(
                [ConfigProblem(where, f"a second tool named {tool.name!r}", "give each tool its own name")]
            )
        tools[tool.name] = tool
    return tools


_TOOL_SETTINGS_FIX = "give the tool settings its constructor takes, or drop it from the list"
_TOOL_FIX = "a tool has name, description, parameters (a JSON schema) and __call__(**arguments) -> str"


class ToolTimeout(Exception):
    """Raised by a tool that enforces a time limit of its own (the call's status is then "timeout")."""


@dataclass
class ToolCall:
    name: str
    arguments: Dict[str, Any]


@dataclass
class ToolResult:
    text: str  # what the model reads
    status: str  # ok | error (the tool raised or was misused) | timeout | unknown (no such tool)


async def run_tool(
    tools: Mapping[str, Tool], call: ToolCall, timeout_s: float, hidden: Optional[Mapping[str, Any]] = None
) -> ToolResult:
    """The result of one call, as an observation: the tool's text, or what went wrong in words the model can read.
    `hidden`: the sample's own arguments for this tool (extra_info.tools_kwargs), over the model's."""
    tool = tools.get(call.name)
    if tool is None:
        return ToolResult(f"error: no tool named {call.name!r}; tools: {', '.join(sorted(tools))}", "unknown")
    problem = _argument_problem(tool, call.arguments)
    if problem:
        return ToolResult(f"error: {call.name}: {problem}", "error")
    arguments = {**call.arguments, **(hidden or {})}
    try:
        if inspect.iscoroutinefunction(tool.__call__) or inspect.iscoroutinefunction(tool):
            out = await asyncio.wait_for(tool(**arguments), timeout_s)
        else:  # a blocking tool runs on a thread, so the other trajectories go on meanwhile
            out = await asyncio.wait_for(asyncio.to_thread(tool, **arguments), timeout_s)
    except asyncio.TimeoutError:
        return ToolResult(f"error: {call.name} took longer than {timeout_s:g} s", "timeout")
    except ToolTimeout as e:
        return ToolResult(f"error: {call.name}: {e}", "timeout")
    except Exception as e:  # a tool's failure is the model's observation, not the run's crash
        return ToolResult(f"error: {call.name}: {type(e).__name__}: {e}", "error")
    return ToolResult(str(out), "ok")


def _argument_problem(tool: Tool, arguments: Mapping[str, Any]) -> Optional[str]:
    """What is wrong with the arguments against the tool's schema (required and known names), or None."""
    if not isinstance(arguments, Mapping):
        return f"arguments must be an object, got {type(arguments).__name__}"
    props = tool.parameters.get("properties", {})
    missing = [p for p in tool.parameters.get("required", []) if p not in arguments]
    unknown = [a for a in arguments if props and a not in props]
    if missing:
        return f"missing argument(s) {missing}"
    if unknown:
        return f"unknown argument(s) {unknown}; it takes {sorted(props)}"
    return None


# ---------------------------------------------------------------------------- built-ins

_OPS: Dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def evaluate(expression: str, max_digits: int = 64) -> int | float:
    """An arithmetic expression of numbers, + - * / // % and parentheses (no names, no calls, no powers)."""

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and type(node.value) is not bool:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            v = _OPS[type(node.op)](ev(node.left), ev(node.right))
            if isinstance(v, int) and len(str(abs(v))) > max_digits:
                raise ValueError(f"result over {max_digits} digits")
            return v
        raise ValueError(f"not arithmetic: {ast.unparse(node) if hasattr(ast, 'unparse') else node!r}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}") from None
    value = ev(tree)
    return int(value) if isinstance(value, float) and value.is_integer() else value


@register_tool("calculator")
class Calculator:
    """Evaluates an arithmetic expression: integers, + - * / // % and parentheses."""

    def __init__(self, name: str = "calc"):
        self.name = name
        self.description = "Evaluate an arithmetic expression such as 37*45 or (3+4)*2"
        self.parameters = {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the expression"}},
            "required": ["expression"],
        }

    def __call__(self, expression: str) -> str:
        return str(evaluate(str(expression)))
