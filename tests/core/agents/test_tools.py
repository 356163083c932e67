"""Tools and tool-call parsers: every failure is an observation with a status, never an exception."""

from __future__ import annotations

import asyncio
import time

import pytest

from verl.agents.parsers import get_parser
from verl.agents.tools import Calculator, ToolCall, evaluate, make_tools, run_tool
from verl.config.errors import ConfigError


class Raises:
    name, description = "boom", "always fails"
    parameters = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}

    def __call__(self, x: str) -> str:
        raise RuntimeError(f"cannot handle {x}")


class Sleeps:
    name, description = "slow", "sleeps"
    parameters = {"type": "object", "properties": {"s": {"type": "number"}}, "required": ["s"]}

    def __init__(self, name: str = "slow"):
        self.name = name

    async def __call__(self, s: float) -> str:
        await asyncio.sleep(s)
        return "woke"


TOOLS = {"calc": Calculator(), "boom": Raises(), "slow": Sleeps()}


def run(call: ToolCall, timeout_s: float = 1.0):
    return asyncio.run(run_tool(TOOLS, call, timeout_s))


def test_calculator_is_arithmetic_only():
    assert evaluate("37*45") == 1665 and evaluate("(3+4)*2 - -1") == 15 and evaluate("7/2") == 3.5
    for bad in ("__import__('os')", "2**100", "x+1", "1+"):
        with pytest.raises(ValueError):
            evaluate(bad)
    with pytest.raises(ValueError, match="digits"):
        evaluate("9" * 40 + "*" + "9" * 40)


def test_each_failure_is_an_observation_with_its_status():
    ok = run(ToolCall("calc", {"expression": "12*3"}))
    assert (ok.text, ok.status) == ("36", "ok")
    raised = run(ToolCall("boom", {"x": "7"}))
    assert raised.status == "error" and raised.text == "error: boom: RuntimeError: cannot handle 7"
    start = time.perf_counter()
    slow = run(ToolCall("slow", {"s": 5}), timeout_s=0.05)
    assert slow.status == "timeout" and "longer than 0.05 s" in slow.text and time.perf_counter() - start < 2
    unknown = run(ToolCall("search", {"q": "x"}))
    assert unknown.status == "unknown" and "boom, calc, slow" in unknown.text
    missing = run(ToolCall("calc", {}))
    assert missing.status == "error" and "missing argument(s) ['expression']" in missing.text
    extra = run(ToolCall("calc", {"expression": "1", "mode": "x"}))
    assert extra.status == "error" and "unknown argument(s) ['mode']" in extra.text
    bad_value = run(ToolCall("calc", {"expression": "import os"}))
    assert bad_value.status == "error" and bad_value.text.startswith("error: calc: ValueError")


def test_make_tools_by_name_and_target():
    tools = make_tools([{"name": "calculator"}])
    assert list(tools) == ["calc"]
    tools = make_tools([{"_target_": "tests.core.agents.test_tools.Sleeps", "name": "wait"}, {"name": "calculator"}])
    assert sorted(tools) == ["calc", "wait"]
    with pytest.raises(ConfigError, match=r"rollout.agent.tools\[0\].name.*unknown tool 'grep'"):
        make_tools([{"name": "grep"}])
    with pytest.raises(ConfigError, match="a second tool named 'calc'"):
        make_tools([{"name": "calculator"}, {"name": "calculator"}])


def test_hermes_parser():
    parse = get_parser("hermes")
    turn = parse(
        'I will compute. <tool_call>\n{"name": "calc", "arguments": {"expression": "2*3"}}\n</tool_call>', TOOLS
    )
    assert [(c.name, c.arguments) for c in turn.calls] == [("calc", {"expression": "2*3"})] and not turn.malformed
    turn = parse('<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"1\\"}"}</tool_call>', TOOLS)
    assert turn.calls[0].arguments == {"expression": "1"}  # arguments written as a JSON string
    assert parse("The answer is 6.", TOOLS).is_answer
    bad = parse('<tool_call>{"name": calc}</tool_call> <tool_call>{"arguments": {}}</tool_call> <tool_call>{', TOOLS)
    assert not bad.calls and len(bad.malformed) == 3 and not bad.is_answer
    assert (
        "not JSON" in bad.malformed[0] and '"name"' in bad.malformed[1] and "without </tool_call>" in bad.malformed[2]
    )


def test_plain_parser():
    parse = get_parser("plain")
    turn = parse("calc(37*45)", TOOLS)
    assert [(c.name, c.arguments) for c in turn.calls] == [("calc", {"expression": "37*45"})]
    assert parse("1665", TOOLS).is_answer
    assert parse("calc(37*45", TOOLS).malformed and parse("x calc(1)", TOOLS).malformed
    assert parse("what(1)", TOOLS).calls[0].name == "what"  # an unknown tool: run_tool answers "no tool named"
