"""Agent loops through the trainer (local controller, real engines): masks at turn boundaries, trainer/rollout
log-prob parity on multi-turn trajectories, and tool failures that become observations and metrics."""

from __future__ import annotations

import pytest
import torch

from tests.support.run_configs import fit, tiny_config
from verl.agents.render import InsertRenderer
from verl.trainer.ppo import PPOTrainer

pytestmark = pytest.mark.slow

TOOL_RESULT = "1234"


async def two_turns(sample, ctx):
    """A user-written loop: a short first turn, a tool's result inserted whatever the model said, a second turn."""
    await ctx.generate(max_new_tokens=3)
    ctx.insert([{"role": "tool", "content": TOOL_RESULT}])
    await ctx.generate()
    ctx.trajectory.finish = "answer"
    return ctx.trajectory


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def test_multi_turn_masks_and_log_prob_parity(tmp_path):
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path),
        "trainer.controller=local",
        "data.max_response_length=16",
        "rollout.agent.loop={_target_: tests.trainer.test_agents.two_turns}",
    )
    trainer = PPOTrainer(cfg)
    try:
        batch = trainer.generate(trainer.train_loader.next_batch())
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
    finally:
        trainer.close()


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
    broken = "rollout.agent.tools=[{_target_: tests.trainer.test_agents.BrokenCalculator}]"
    _, rows = fit(tiny_config("grpo_tiny_tools", str(tmp_path / "broken"), *base, broken))
    assert all(r["agent/tool_calls/mean"] > 0 for r in rows)
    for r in rows:  # every call failed, and was answered
        assert r["agent/tool_errors"] == round(r["agent/tool_calls/mean"] * samples)
