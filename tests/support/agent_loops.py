"""Agent loops for trainer tests, as a user writes them (referenced by `_target_` in configs)."""

from __future__ import annotations

TOOL_RESULT = "1234"
TWO_TURNS = "rollout.agent.loop={_target_: tests.support.agent_loops.two_turns}"


async def two_turns(sample, ctx):
    """A short first turn, a tool's result inserted whatever the model said, a second turn."""
    await ctx.generate(max_new_tokens=3)
    ctx.insert([{"role": "tool", "content": TOOL_RESULT}])
    await ctx.generate()
    ctx.trajectory.finish = "answer"
    return ctx.trajectory


class OddLengthEnv:
    """An environment for env_agent: each action earns 1 when its stripped text has odd length (a reward with
    spread on an untrained model), and the episode ends there; otherwise the observation asks again."""

    def reset(self, sample) -> None:
        self.prompt = sample.raw_prompt

    def step(self, action: str):
        reward = float(len(action.strip()) % 2)
        return "again", reward, reward > 0
