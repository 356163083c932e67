"""Token-in-token-out: inserted messages rendered as the template does, masks right at every turn boundary, the
batching client's rounds, and tool_agent's handling of calls that fail."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from verl.agents.client import BatchingClient, Completion
from verl.agents.loops import AgentContext, AgentSample, tool_agent
from verl.agents.parsers import get_parser
from verl.agents.render import InsertRenderer
from verl.agents.tools import Calculator
from verl.agents.trajectory import Trajectory, trajectories_to_batch, trajectory_metrics
from verl.data.sft_dataset import conversation_ids
from verl.embedded.tokenizer import build_char_tokenizer
from verl.rollout_batch import left_padded

# A template with role markup where text follows the assistant's eos (like ChatML's "<|im_end|>\n").
MARKUP = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_inserted_messages_are_the_templates_own_tokens(char_tokenizer):
    r = InsertRenderer(char_tokenizer)
    assert r.ids([{"role": "tool", "content": "1665"}]) == ids(char_tokenizer, "1665\n")
    markup = build_char_tokenizer()
    markup.chat_template = MARKUP
    r = InsertRenderer(markup)
    # what follows the model's eos: the rest of its turn's markup, the tool's turn, the next generation prompt
    assert r.ids([{"role": "tool", "content": "42"}]) == ids(markup, "\ntool: 42\nassistant: ")
    no_eos = build_char_tokenizer()
    no_eos.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="does not end an assistant turn with the eos token"):
        InsertRenderer(no_eos)


def test_sft_conversation_trains_assistant_turns_through_eos(char_tokenizer):
    messages = [
        {"role": "user", "content": "3*4="},
        {"role": "assistant", "content": "calc(3*4)"},
        {"role": "tool", "content": "12"},
        {"role": "assistant", "content": "12"},
    ]
    tok = char_tokenizer
    got, mask = conversation_ids(tok, messages)
    eos = [tok.eos_token_id]
    assert got == ids(tok, "3*4=calc(3*4)") + eos + ids(tok, "12\n12") + eos
    assert mask == [0] * 4 + [1] * 10 + [0] * 3 + [1] * 3
    # the RL side produces the same stream: prompt, the model's tokens, the renderer's insert, the model's tokens
    insert = InsertRenderer(tok).ids([{"role": "tool", "content": "12"}])
    assert got == ids(tok, "3*4=") + ids(tok, "calc(3*4)") + eos + insert + ids(tok, "12") + eos
    markup = build_char_tokenizer()
    markup.chat_template = MARKUP
    got, mask = conversation_ids(markup, messages)
    text = markup.decode(got)
    assert text == "user: 3*4=\nassistant: calc(3*4)<eos>\ntool: 12\nassistant: 12<eos>\n"
    trained = markup.decode([t for t, m in zip(got, mask) if m])
    assert trained == "calc(3*4)<eos>12<eos>"  # not the newline after eos, not the markup


def test_batch_masks_and_attention_at_turn_boundaries():
    pad = 0
    prompts = left_padded([[5, 6, 7], [8, 9]], pad)
    a = Trajectory(prompt_ids=[5, 6, 7])
    a.add_model_tokens([10, 11, 2], [-0.5, -0.25, -0.125])
    a.add_inserted_tokens([20, 21])
    a.add_model_tokens([12, 2], [-1.0, -2.0])
    b = Trajectory(prompt_ids=[8, 9], final_text="x")
    b.add_model_tokens([13, 2], [-0.1, -0.2])
    batch = trajectories_to_batch(prompts, [a, b], response_length=8, pad_id=pad)
    t = batch.batch
    assert t["responses"].tolist() == [[10, 11, 2, 20, 21, 12, 2, 0], [13, 2, 0, 0, 0, 0, 0, 0]]
    assert t["response_mask"].tolist() == [[1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0, 0]]
    assert t["attention_mask"][:, 3:].tolist() == [[1] * 7 + [0], [1, 1] + [0] * 6]  # tool output is context
    assert t["attention_mask"][1, :3].tolist() == [0, 1, 1]
    assert torch.equal(t["rollout_log_probs"][0], torch.tensor([-0.5, -0.25, -0.125, 0, 0, -1.0, -2.0, 0]))
    assert t["position_ids"][0].tolist() == list(range(11)) and t["position_ids"][1, 3:].tolist() == list(range(2, 10))
    assert list(batch.non_tensor_batch["response_text"]) == ["", "x"]
    assert batch.non_tensor_batch["agent"][0]["turns"] == 2
    with pytest.raises(ValueError, match="trajectory 0 has 7 response tokens, over 6"):
        trajectories_to_batch(prompts, [a, b], response_length=6, pad_id=pad)
    with pytest.raises(ValueError, match="does not start from its prompt"):
        trajectories_to_batch(prompts, [b, a], response_length=8, pad_id=pad)


def test_a_slow_trajectory_does_not_hold_the_others():
    """Rounds take whoever waits: a trajectory whose tool takes 0.3 s joins a later round while the others go on."""
    served = []

    def generate_batch(requests):
        served.append(len(requests))
        return [Completion([len(r.ids)], [0.0], True) for r in requests]

    client = BatchingClient(generate_batch)
    done_at = {}

    async def trajectory(i, tool_s, start):
        client.enter()
        try:
            for _ in range(3):
                await client.generate([1] * (i + 1), max_new_tokens=1)
                await asyncio.sleep(tool_s)
            done_at[i] = time.perf_counter() - start
        finally:
            client.leave()

    async def main():
        start = time.perf_counter()
        await asyncio.gather(*(trajectory(i, 0.3 if i == 0 else 0.0, start) for i in range(8)))
        await client.close()

    asyncio.run(main())
    assert served[0] == 8  # the first round takes all of them
    assert max(done_at[i] for i in range(1, 8)) < 0.3 < done_at[0]  # the fast ones finished before the slow tool


def scripted(turns):
    """A generate_batch that answers each context with the next scripted text of its trajectory (by prompt)."""
    tok = build_char_tokenizer()
    eos = tok.eos_token_id
    count = {}

    def generate_batch(requests):
        out = []
        for r in requests:
            key = r.ids[0]
            k = count.get(key, 0)
            count[key] = k + 1
            text = turns[key][k]
            new = ids(tok, text)[: r.max_new_tokens - 1] + [eos]
            out.append(Completion(new, [-0.5] * len(new), True))
        return out

    return tok, generate_batch


def run_tool_agent(turns, tools, max_turns=4, timeout_s=0.2, response_length=120):
    tok, generate_batch = scripted(turns)
    client = BatchingClient(generate_batch)
    renderer = InsertRenderer(tok)
    trajectories = []

    async def main():
        async def one(first):
            t = Trajectory(prompt_ids=[first])
            ctx = AgentContext(
                client,
                tok,
                renderer,
                t,
                response_length,
                max_turns,
                tools=tools,
                parser=get_parser("plain"),
                tool_timeout_s=timeout_s,
            )
            client.enter()
            try:
                await tool_agent(AgentSample([first], "", None, {}), ctx)
            finally:
                client.leave()
            trajectories.append(t)

        await asyncio.gather(*(one(k) for k in turns))
        await client.close()

    asyncio.run(main())
    return tok, sorted(trajectories, key=lambda t: t.prompt_ids[0])


class Broken:
    name, description = "calc", "raises"
    parameters = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}

    def __call__(self, expression):
        raise ZeroDivisionError("division by zero")


class Hangs(Broken):
    def __call__(self, expression):
        time.sleep(1.0)
        return "late"


def test_tool_agent_turns_failures_into_observations_and_metrics():
    turns = {
        10: ["calc(6*7)", "42"],  # a good call, then the answer
        11: ["calc(6*7", "42"],  # malformed: told so, answers next
        12: ["ask(1)", "1"],  # an unknown tool
        13: ["calc(1)", "calc(2)", "calc(3)"],  # never answers: max_turns
    }
    tok, (good, malformed, unknown, looping) = run_tool_agent(turns, {"calc": Calculator()}, max_turns=3)
    assert good.finish == "answer" and good.final_text == "42" and good.tool_calls[0]["status"] == "ok"
    assert tok.decode(good.response_ids) == "calc(6*7)<eos>42\n42<eos>"
    assert good.loss_mask == [1] * 10 + [0] * 3 + [1] * 3
    text = tok.decode(malformed.response_ids)
    assert malformed.finish == "answer" and malformed.malformed and "error: malformed tool call" in text
    assert unknown.tool_calls[0]["status"] == "unknown" and "no tool named 'ask'" in tok.decode(unknown.response_ids)
    assert looping.finish == "max_turns" and looping.turns == 3
    m = trajectory_metrics([good, malformed, unknown, looping])
    assert m["agent/tool_call_rate"] == 0.75 and m["agent/malformed_rate"] == 0.25 and m["agent/tool_unknowns"] == 1
    assert m["agent/finish/answer"] == 0.75 and m["agent/finish/max_turns"] == 0.25

    _, (raised,) = run_tool_agent({10: ["calc(1/0)", "0"]}, {"calc": Broken()})
    assert raised.tool_calls[0]["status"] == "error" and raised.finish == "answer"
    tok, (late,) = run_tool_agent({10: ["calc(1)", "1"]}, {"calc": Hangs()}, timeout_s=0.05)
    assert late.tool_calls[0]["status"] == "timeout" and "took longer than 0.05 s" in tok.decode(late.response_ids)
    # out of tokens: the tool's result would not leave room for a turn, so the trajectory ends there
    _, (short,) = run_tool_agent({10: ["calc(12345*6789)", "1"]}, {"calc": Calculator()}, response_length=20)
    assert short.finish == "length" and short.turns == 1


class Check:
    """A checker tool: the model gives a guess, the sample gives the answer (a hidden argument)."""

    name, description = "check", "is the guess right"
    parameters = {"type": "object", "properties": {"guess": {"type": "string"}}, "required": ["guess"]}

    def __call__(self, guess: str, answer: str = "?") -> str:
        return "right" if guess == answer else f"wrong:{answer}"


def test_a_samples_extra_info_narrows_the_tools_and_gives_hidden_arguments():
    from types import SimpleNamespace

    from verl.agents.runner import AgentRunner

    turns = {
        10: ["check(42)", "ok"],  # the sample's answer is 42: right
        11: ["check(42)", "ok"],  # its answer is 7: the tool says so (the model never saw 7)
        12: ["calc(1+1)", "ok"],  # calc is not among this sample's tools: unknown
        13: ["calc(1+1)", "ok"],  # no extra_info.tools: every tool
    }
    tok, generate_batch = scripted(turns)
    cfg = SimpleNamespace(
        loop="tool_agent",
        tools=[{"_target_": "tests.core.agents.test_trajectories.Check"}, {"name": "calculator"}],
        tool_parser="plain",
        max_turns=3,
        tool_timeout_s=5.0,
        max_wall_s=None,
        max_in_flight=8,
        env=None,
        program=None,
    )
    runner = AgentRunner(cfg, tok, response_length=60)
    checked = {"tools": ["check"], "tools_kwargs": {"check": {"answer": "42"}}}
    extras = [checked, {**checked, "tools_kwargs": {"check": {"answer": "7"}}}, {"tools": ["check"]}, {}]
    samples = [AgentSample([k], "", None, extra) for k, extra in zip(turns, extras)]
    (right, wrong, narrowed, every), _ = runner.run(samples, generate_batch, temperature=None)
    assert "right" in tok.decode(right.response_ids) and right.tool_calls[0]["status"] == "ok"
    assert "wrong:7" in tok.decode(wrong.response_ids)
    assert narrowed.tool_calls[0]["status"] == "unknown" and "tools: check" in tok.decode(narrowed.response_ids)
    assert every.tool_calls[0]["status"] == "ok" and "2\n" in tok.decode(every.response_ids)
