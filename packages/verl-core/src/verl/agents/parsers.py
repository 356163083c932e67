"""Tool-call parsers: a model turn's text -> the calls it makes, and what was malformed (a registry by name).

`hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, the format of the Qwen2.5/Qwen3
chat templates (and Hermes-style models). `plain`: the whole turn is `name(argument)`, the single argument going
to the tool's first required parameter (for small models and character tokenizers, e.g. `calc(37*45)`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, List, Mapping

from verl.agents.tools import Tool, ToolCall
from verl.registry import Registry


@dataclass
class ParsedTurn:
    calls: List[ToolCall] = field(default_factory=list)
    malformed: List[str] = field(default_factory=list)  # why each malformed call could not be read

    @property
    def is_answer(self) -> bool:
        """A turn that calls nothing, well-formed or not, ends the trajectory."""
        return not self.calls and not self.malformed


Parser = Callable[[str, Mapping[str, Tool]], ParsedTurn]
PARSERS = Registry("tool-call parser")


def register_parser(name: str) -> Callable[[Parser], Parser]:
    """Decorator: make `parse(text, tools) -> ParsedTurn` available as `rollout.agent.tool_parser: <name>`."""
    return PARSERS.register(name)


_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@register_parser("hermes")
def hermes(text: str, tools: Mapping[str, Tool]) -> ParsedTurn:
    turn = ParsedTurn()
    for body, close in _HERMES.findall(text):
        if not close:
            turn.malformed.append("a <tool_call> without </tool_call>")
            continue
        try:
            value = json.loads(body)
        except json.JSONDecodeError as e:
            turn.malformed.append(f"the tool call is not JSON ({e.msg} at char {e.pos})")
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            turn.malformed.append('a tool call needs {"name": "...", "arguments": {...}}')
            continue
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                turn.malformed.append(f"the arguments of {value['name']} are not JSON")
                continue
        turn.calls.append(ToolCall(value["name"], arguments))
    return turn


_PLAIN = re.compile(r"^\s*([A-Za-z_]\w*)\((.*)\)\s*$", re.DOTALL)


@register_parser("plain")
def plain(text: str, tools: Mapping[str, Tool]) -> ParsedTurn:
    turn = ParsedTurn()
    if "(" not in text and ")" not in text:
        return turn  # an answer
    m = _PLAIN.match(text)
    if m is None:
        turn.malformed.append("a call is the whole turn, written name(argument)")
        return turn
    name, argument = m.group(1), m.group(2)
    tool = tools.get(name)
    params = tool.parameters.get("required") or list(tool.parameters.get("properties", {})) if tool else []
    turn.calls.append(ToolCall(name, {params[0]: argument} if params else {}))
    return turn


def get_parser(name: str) -> Parser:
    """The parser registered as `name` (UnknownNameError, a KeyError, naming the closest one)."""
    return PARSERS.get(name, key="rollout.agent.tool_parser")
