"""The rollout stage when `rollout.agent.loop` is set: agent loops in the driver, their model turns batched into the
rollout workers' generate calls, their trajectories assembled into the usual rollout batch."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from verl.agents.client import Completion, Request
from verl.agents.loops import AgentSample
from verl.agents.runner import AgentRunner
from verl.agents.trajectory import Trajectory, trajectories_to_batch
from verl.protocol import DataProto
from verl.rollout_batch import left_padded

# (prompts with PROMPTS columns, temperature, max_new_tokens) -> the workers' rollout batch
GenerateCall = Callable[[DataProto, Optional[float], int], DataProto]


def agent_samples(prompts: DataProto, n: int) -> List[AgentSample]:
    """n samples per prompt row, adjacent (the order of the rollout batch)."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    nt, rows = prompts.non_tensor_batch, len(prompts)

    def col(key: str, default: Any) -> List[Any]:
        return list(nt[key]) if key in nt else [default] * rows

    raw, truth, extra, source, messages = (
        col("raw_prompt", ""),
        col("ground_truth", None),
        col("extra_info", None),
        col("data_source", ""),
        col("messages", None),
    )
    samples = []
    for i in range(rows):
        s = AgentSample(
            ids[i][mask[i]].tolist(),
            str(raw[i]),
            truth[i],
            dict(extra[i] or {}),
            str(source[i]),
            [dict(m) for m in messages[i] or []],
        )
        samples += [s] * n
    return samples


def batch_generator(call: GenerateCall, *, dp: int, eos_ids: List[int], pad_id: int):
    """A BatchingClient's batch function over the workers: one generate call per temperature in the round, rows
    padded to a multiple of the rollout's data-parallel size, each completion cut to its own token budget."""

    def generate_batch(requests: Sequence[Request]) -> List[Completion]:
        out: List[Optional[Completion]] = [None] * len(requests)
        for temperature in dict.fromkeys(r.temperature for r in requests):
            idx = [i for i, r in enumerate(requests) if r.temperature == temperature]
            contexts = [requests[i].ids for i in idx]
            contexts += [contexts[0]] * ((-len(contexts)) % dp)
            width = max(requests[i].max_new_tokens for i in idx)
            batch = call(left_padded(contexts, pad_id), temperature, width)
            responses, mask, lp = (batch.batch[k] for k in ("responses", "response_mask", "rollout_log_probs"))
            versions = batch.batch.get("weight_version")  # (a rollout on a pool of its own tags its samples)
            for row, i in enumerate(idx):
                k = min(int(mask[row].sum()), requests[i].max_new_tokens)
                ids = responses[row, :k].tolist()
                version = int(versions[row]) if versions is not None else None
                out[i] = Completion(ids, lp[row, :k].tolist(), bool(ids) and ids[-1] in eos_ids, version)
        return out

    return generate_batch


class AgentRollouts:
    def __init__(
        self,
        agent: Any,
        tokenizer: Any,
        *,
        response_length: int,
        max_prompt_length: int,
        max_turns: int,
        dp: int,
        eos_ids: List[int],
        pad_id: int,
    ):
        self.runner = AgentRunner(agent, tokenizer, response_length, max_prompt_length, max_turns)
        self.response_length, self.dp, self.eos_ids, self.pad_id = response_length, dp, eos_ids, pad_id

    def sample(
        self, prompts: DataProto, n: int, temperature: Optional[float], call: GenerateCall
    ) -> Tuple[DataProto, Dict[str, float]]:
        """n trajectories per prompt (adjacent) as a rollout batch, and their agent/* metrics."""
        samples = agent_samples(prompts, n)
        generate_batch = batch_generator(call, dp=self.dp, eos_ids=self.eos_ids, pad_id=self.pad_id)
        trajectories, metrics = self.runner.run(samples, generate_batch, temperature)
        return self.batch(prompts, n, samples, trajectories), metrics

    def batch(
        self, prompts: DataProto, n: int, samples: Sequence[AgentSample], trajectories: Sequence[Trajectory]
    ) -> DataProto:
        """The rollout batch of n trajectories per prompt row (prompt tensors only: the caller adds text columns)."""
        rows = prompts.select(["input_ids", "attention_mask", "position_ids"], []).repeat(n, interleave=True)
        if any(t.prompt_ids != s.prompt_ids for t, s in zip(trajectories, samples)):
            rows = left_padded([t.prompt_ids for t in trajectories], self.pad_id)  # programs' own prompts
        return trajectories_to_batch(rows, trajectories, self.response_length, self.pad_id)
