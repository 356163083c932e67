"""Agent loops through the trainer (local controller, real engines): masks at turn boundaries, trainer/rollout
log-prob parity on multi-turn trajectories, and tool failures that become observations and metrics."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.support.agent_loops import TOOL_RESULT, TWO_TURNS, OddLengthEnv  # noqa: F401  (by _target_)
from tests.support.run_configs import ODD_LENGTH_REWARD, fit, tiny_config
from verl.agents.render import InsertRenderer
from verl.trainer.ppo import PPOTrainer

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def test_multi_turn_masks_and_log_prob_parity(tmp_path):
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path),
        "trainer.controller=local",
        "data.max_response_length=16",
        TWO_TURNS,
    )
    with PPOTrainer(cfg) as trainer:
        batch = trainer.rollout.next_batch(trainer.step)[0]
        inserted = InsertRenderer(trainer.tokenizer).ids([{"role": "tool", "content": TOOL_RESULT}])
        b = batch.batch
        for row in range(len(batch)):
            mask, responses = b["response_mask"][row], b["responses"][row]
            span = (mask == 0) & (b["attention_mask"][row, -16:] == 1)
            where = span.nonzero().flatten().tolist()
            first = where[0]  # the first turn: up to 3 tokens (fewer when the model sampled eos)
            assert 1 <= first <= 3 and mask[:first].tolist() == [1] * first
            assert where == list(range(first, first + len(inserted)))  # right after it, untrained
            assert responses[where].tolist() == inserted
            assert mask[first + len(inserted)] == 1  # the second turn is trained
            assert torch.all(b["rollout_log_probs"][row][span] == 0)
        assert batch.non_tensor_batch["agent"][0]["turns"] == 2
        batch = trainer.compute_log_probs(batch)
        m = b["response_mask"].bool()
        diff = (batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"])[m].abs().max()
        assert diff < 1e-4, f"trainer vs rollout log-probs differ by {diff:.2e} on multi-turn trajectories"


class BrokenCalculator:
    name, description = "calc", "a calculator that fails"
    parameters = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}

    def __call__(self, expression: str) -> str:
        raise ArithmeticError("the calculator is broken")


def test_tool_recipe_trains_and_a_failing_tool_is_an_observation(tmp_path):
    """grpo_tiny_tools with its warm start, 2 steps: the model calls the tool; then the same with a tool that
    raises on every call: the run goes on, the failures counted."""
    base = [
        "trainer.controller=local",
        # (tiny_config drops the warm start; the recipe's, cached for the session)
        "model.warm_start={files: [embedded:arithmetic-tools-sft], steps: 200, batch_size: 64, max_length: 48}",
        "data.train_batch_size=8",
        "actor.ppo_mini_batch_size=8",
        "actor.ppo_micro_batch_size_per_device=64",
    ]
    samples = 8 * 8  # prompts x rollout.n per step
    _, rows = fit(tiny_config("grpo_tiny_tools", str(tmp_path / "ok"), *base))
    assert all(r["agent/tool_call_rate"] > 0.1 for r in rows)  # (a call the calculator cannot read is an error)
    assert all(r["rollout/logprob_diff_max"] < 1e-4 for r in rows)
    broken = "rollout.agent.tools=[{_target_: tests.e2e.test_agents.BrokenCalculator}]"
    _, rows = fit(tiny_config("grpo_tiny_tools", str(tmp_path / "broken"), *base, broken))
    assert all(r["agent/tool_calls/mean"] > 0 for r in rows)
    for r in rows:  # every call failed, and was answered
        assert r["agent/tool_errors"] == round(r["agent/tool_calls/mean"] * samples)


def test_an_environment_episode_trains_on_its_return(tmp_path):
    """env_agent with an environment of step rewards and reward.fn=episode_return: each trajectory's score is
    the sum of its turns' rewards, observations are inserted between turns, and the update runs."""
    env = [
        "rollout.agent.loop=env_agent",
        "rollout.agent.env={_target_: tests.support.agent_loops.OddLengthEnv}",
        "rollout.agent.max_turns=3",
        "reward.fn=episode_return",
    ]
    cfg = tiny_config("grpo_tiny", str(tmp_path), "trainer.controller=local", "data.max_response_length=24", *env)
    with PPOTrainer(cfg) as trainer:
        batch = trainer.rollout.next_batch(trainer.step)[0]
        scores, _ = trainer.reward(batch)
        returns = [sum(a["turn_rewards"]) for a in batch.non_tensor_batch["agent"]]
        assert scores.sum(-1).tolist() == returns and 0 < sum(returns) < len(returns)
        episodes = batch.non_tensor_batch["agent"]
        assert all(len(a["turn_rewards"]) == a["turns"] for a in episodes) and max(a["turns"] for a in episodes) > 1
    _, rows = fit(cfg)
    assert rows[0]["agent/turns/mean"] > 1 and rows[0]["agent/inserted_tokens/mean"] > 0
    assert "actor/pg_loss" in rows[0]


def test_one_step_off_runs_the_next_steps_loops_beside_the_update(tmp_path, ray_two_cpus):
    """grpo_tiny_async (rollout on a pool of its own, one_step_off) with the two-turn loop: every step trains
    multi-turn trajectories generated by the rollout's pool, one update old."""
    loop = TWO_TURNS
    _, rows = fit(tiny_config("grpo_tiny_async", str(tmp_path), loop, "data.max_response_length=16", steps=3))
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["agent/turns/mean"] == 2 and r["agent/inserted_tokens/mean"] > 0
        assert r["rollout/logprob_diff_max"] > 0  # (an older policy's samples: not the trainer's log-probs)
    assert rows[-1]["async/staleness_max"] == 1


def test_async_runs_agent_loops_over_the_rollout_service(tmp_path, ray_two_cpus):
    """grpo_tiny_async in trainer.mode=async (staleness 2) with the two-turn loop: each model turn is a request to
    the rollout service, loops of batches ahead run while the actor trains; every batch is multi-turn and within
    the bound, the first (sampled by the initial policy) matches the trainer's log-probs, and validation runs the
    loops through the service too."""
    loop = TWO_TURNS
    overrides = ["trainer.mode=async", "trainer.max_staleness=2", "data.max_response_length=16"]
    validation = ["data.val_files=[embedded:arithmetic-val]", "trainer.val_before_train=true"]
    cfg = tiny_config("grpo_tiny_async", str(tmp_path), loop, *overrides, *validation, ODD_LENGTH_REWARD, steps=4)
    _, rows = fit(cfg)
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert r["agent/turns/mean"] == 2 and r["agent/inserted_tokens/mean"] > 0
        assert 0 <= r["async/staleness_max"] <= 2
    assert steps[0]["async/staleness_max"] == 0 and steps[0]["rollout/logprob_diff_max"] < 1e-4
    assert max(r["async/staleness_max"] for r in steps) >= 1  # (later batches were generated ahead)
    assert steps[-1]["rollout/logprob_diff_max"] > 1e-3  # (by an older policy: the updates changed the weights)
    assert any("val/accuracy" in r for r in rows)


# An agent program as written for any OpenAI-compatible server: the SDK reads OPENAI_BASE_URL and OPENAI_API_KEY.
AGENT_PROGRAM = """
import json, sys
import openai

sample = json.load(sys.stdin)
client = openai.OpenAI(max_retries=0)
messages = list(sample["messages"])
first = client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "="}]
second = client.chat.completions.create(model="policy", messages=messages)
print(second.choices[0].message.content or "")
"""


def test_an_external_agent_program_trains_through_the_endpoint(tmp_path):
    """openai_agent with a command-line program (a child process speaking HTTP to the endpoint): its two requests
    per sample are one trajectory each; the trainer's log-probs match the served ones; the update runs."""
    program = tmp_path / "agent.py"
    program.write_text(AGENT_PROGRAM)
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path / "run"),
        "trainer.controller=local",
        "data.max_response_length=16",
        "rollout.agent.loop=openai_agent",
        f"rollout.agent.program=[{sys.executable}, {program}]",
        steps=1,
    )
    with PPOTrainer(cfg) as trainer:
        batch = trainer.rollout.next_batch(trainer.step)[0]
        eq = trainer.tokenizer("=", add_special_tokens=False)["input_ids"]
        for row in range(len(batch)):
            info, mask = batch.non_tensor_batch["agent"][row], batch.batch["response_mask"][row]
            assert info["endpoint_requests"] == 2 and info["history_rewrites"] == 0 and info["turns"] == 2
            inserted = batch.batch["responses"][row][(mask == 0) & (batch.batch["attention_mask"][row, -16:] == 1)]
            assert inserted.tolist()[-len(eq) :] == eq  # the user's turn, untrained, between the model's two
        batch = trainer.compute_log_probs(batch)
        m = batch.batch["response_mask"].bool()
        diff = (batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"])[m].abs().max()
        assert diff < 1e-4, f"trainer vs endpoint log-probs differ by {diff:.2e}"
    _, rows = fit(cfg)
    assert rows[0]["agent/turns/mean"] == 2 and rows[0]["rollout/logprob_diff_max"] < 1e-4
    assert "actor/pg_loss" in rows[0]
