"""The OpenAI-compatible endpoint: an unchanged OpenAI-SDK agent's conversation stitched into one trajectory of the
exact served tokens; bad requests refused with the right status, changing nothing."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from types import SimpleNamespace

import openai

from verl.agents.client import BatchingClient, Completion
from verl.agents.endpoint import ChatEndpoint
from verl.agents.loops import AgentContext, AgentSample
from verl.agents.parsers import get_parser
from verl.agents.render import InsertRenderer
from verl.agents.runner import AgentRunner
from verl.agents.tools import evaluate
from verl.agents.trajectory import Trajectory, trajectories_to_batch
from verl.rollout_batch import left_padded

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


class Scripted:
    """A generate_batch that answers each context by its last line: a call for a question, the number after a
    tool result. (The endpoint is what is tested here; tests/e2e/test_agents.py serves a real model.)"""

    def __init__(self, tokenizer):
        self.tok, self.contexts = tokenizer, []

    def __call__(self, requests):
        out = []
        for r in requests:
            self.contexts.append(list(r.ids))
            text = self.tok.decode(r.ids)
            tool_result = text[:-1].split(self.tok.eos_token)[-1]
            reply = tool_result if text.endswith("\n") else f"calc({text.split('?')[0][-5:]})"
            ids = self.tok(reply, add_special_tokens=False)["input_ids"][: r.max_new_tokens - 1]
            ids.append(self.tok.eos_token_id)
            out.append(Completion(ids, [-0.5] * len(ids), True))
        return out


def sdk_agent(base_url: str, api_key: str, sample: AgentSample) -> str:
    """An ordinary function-calling agent, as written for any OpenAI-compatible server."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(sample.messages)
    for _ in range(3):
        reply = client.chat.completions.create(model="any", messages=messages, tools=[CALC], max_tokens=16)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = evaluate(json.loads(call.function.arguments)["expression"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return "no answer"


def runner(tok, **agent) -> AgentRunner:
    cfg = SimpleNamespace(
        loop="openai_agent",
        tools=[],
        tool_parser="plain",
        max_turns=4,
        tool_timeout_s=5.0,
        max_wall_s=30.0,
        max_in_flight=8,
        env=None,
        program="tests.core.agents.test_endpoint.sdk_agent",
    )
    for k, v in agent.items():
        setattr(cfg, k, v)
    return AgentRunner(cfg, tok, response_length=40, max_prompt_length=32)


def test_an_sdk_agent_is_stitched_into_one_trajectory_of_served_tokens(char_tokenizer):
    tok = char_tokenizer
    questions = ["12*3?", "7*8?", "41*5?"]
    samples = [
        AgentSample(tok(q, add_special_tokens=False)["input_ids"], q, None, {}, "t", [{"role": "user", "content": q}])
        for q in questions
    ]
    engine = Scripted(tok)
    trajectories, metrics = runner(tok).run(samples, engine, temperature=None)
    eos = [tok.eos_token_id]
    insert, seconds = InsertRenderer(tok, [CALC]), []
    for q, t in zip(questions, trajectories):
        product = str(evaluate(q[:-1]))
        call, answer = tok(f"calc({q[:-1]})")["input_ids"] + eos, tok(product)["input_ids"] + eos
        tool = insert.ids([{"role": "tool", "content": product}])
        assert t.prompt_ids == tok(q)["input_ids"]
        assert t.response_ids == call + tool + answer  # the served tokens, the tool's rendering between
        assert t.loss_mask == [1] * len(call) + [0] * len(tool) + [1] * len(answer)
        assert t.log_probs == [-0.5] * len(call) + [0.0] * len(tool) + [-0.5] * len(answer)
        assert (t.turns, t.finish, t.final_text) == (2, "answer", product)
        assert t.info == {"endpoint_requests": 2, "history_rewrites": 0}
        seconds.append(t.prompt_ids + call + tool)
    # each session's second request continued from the exact context its first left: prompt, call, tool result
    assert sorted(engine.contexts) == sorted([t.prompt_ids for t in trajectories] + seconds)
    assert metrics["agent/turns/mean"] == 2
    batch = trajectories_to_batch(left_padded([t.prompt_ids for t in trajectories], 0), trajectories, 40, 0)
    assert batch.batch["response_mask"].sum() == sum(sum(t.loss_mask) for t in trajectories)


def rewriting_agent(base_url: str, api_key: str, sample: AgentSample) -> str:
    """Drops its history between requests (a context-trimming agent): the trajectory starts over."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="m", messages=sample.messages, tools=[CALC])
    again = [{"role": "user", "content": "2*2?"}]
    return client.chat.completions.create(model="m", messages=again, tools=[CALC]).choices[0].message.content


def test_a_rewritten_history_starts_the_trajectory_over(char_tokenizer):
    tok = char_tokenizer
    sample = AgentSample(tok("9*9?")["input_ids"], "9*9?", None, {}, "t", [{"role": "user", "content": "9*9?"}])
    program = "tests.core.agents.test_endpoint.rewriting_agent"
    (t,), _ = runner(tok, program=program).run([sample], Scripted(tok), temperature=None)
    assert t.prompt_ids == tok("2*2?")["input_ids"] and t.turns == 1
    assert t.info == {"endpoint_requests": 2, "history_rewrites": 1}


def http(url: str, data: bytes | None, headers: dict) -> tuple[int, dict]:
    """(status, JSON body) of a plain HTTP request, errors included."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_bad_requests_get_their_status_and_change_nothing(char_tokenizer):
    tok = char_tokenizer
    good = {"messages": [{"role": "user", "content": "3*3?"}]}
    bad = {  # name: (body or raw bytes, headers, status)
        "no token": (good, {}, 401),
        "wrong token": (good, {"Authorization": "Bearer nope"}, 401),
        "not JSON": (b"{nope", None, 400),
        "no messages": ({"messages": []}, None, 400),
        "bad role": ({"messages": [{"role": "robot", "content": "x"}]}, None, 400),
        "streaming": ({**good, "stream": True}, None, 400),
        "n=2": ({**good, "n": 2}, None, 400),
        "bad max_tokens": ({**good, "max_tokens": 0}, None, 400),
        "too big": ({"messages": [{"role": "user", "content": "x" * 5000}]}, None, 413),
        "prompt too long": ({"messages": [{"role": "user", "content": "123456789"}]}, None, 400),
    }

    async def scenario():
        endpoint = ChatEndpoint(tok, get_parser("plain"), max_prompt_tokens=8, max_request_bytes=4096)
        endpoint.start(asyncio.get_running_loop())
        client = BatchingClient(Scripted(tok))
        client.enter()
        ctx = AgentContext(client, tok, InsertRenderer(tok), Trajectory(prompt_ids=[1]), 20, 4)
        sid, base = endpoint.open_session(ctx)
        auth = {"Authorization": f"Bearer {endpoint.token}"}

        def post(body, headers=None, url=f"{base}/chat/completions"):
            headers = auth if headers is None else headers
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            return http(url, data, {**headers, "Content-Type": "application/json"})

        got = {}
        for name, (body, headers, _) in bad.items():  # (in a thread: the endpoint serves on this loop)
            status, r = await asyncio.to_thread(post, body, headers)
            got[name] = (status, r["error"]["message"])
        status, r = await asyncio.to_thread(post, good, None, f"{base.replace(sid, '0' * 16)}/chat/completions")
        got["unknown session"] = (status, r["error"]["message"])
        untouched = (list(ctx.trajectory.prompt_ids), list(ctx.trajectory.response_ids))
        _, models = await asyncio.to_thread(http, f"{base}/models", None, auth)
        _, ok = await asyncio.to_thread(post, good)
        endpoint.close()
        await client.close()
        return got, untouched, models, ok, ctx.trajectory

    got, untouched, models, ok, t = asyncio.run(scenario())
    assert {k: s for k, (s, _) in got.items()} == {**{k: v[2] for k, v in bad.items()}, "unknown session": 404}
    assert "max_prompt_length=8" in got["prompt too long"][1] and "'role'" in got["bad role"][1]
    assert untouched == ([1], [])  # a refused request recorded nothing
    assert models["data"][0]["id"] == "verl-policy"
    assert ok["choices"][0]["message"]["content"] == "calc(3*3)" and t.turns == 1
