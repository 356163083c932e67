"""A trajectory: the exact token ids of an agent's episode with the mask of the model's own tokens, and the
training batch built from many of them.

The response of a trajectory is everything after the prompt: model turns (trained: mask 1, with the log-probs
the rollout sampled them with) and the tokens inserted between turns (tool results, observations: mask 0, log-prob
0). The attention mask covers both, so the trainer's forward sees the same context the rollout did.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from verl.protocol import DataProto
from verl.rollout_batch import pad_rows, rollout_tensors

FINISH_REASONS = ("answer", "max_turns", "length", "wall_time")


@dataclass
class Trajectory:
    prompt_ids: List[int]
    response_ids: List[int] = field(default_factory=list)
    loss_mask: List[int] = field(default_factory=list)
    log_probs: List[float] = field(default_factory=list)
    turns: int = 0  # model turns
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)  # {"name", "arguments", "status"} per call
    malformed: List[str] = field(default_factory=list)  # why each malformed call could not be read
    turn_rewards: List[float] = field(default_factory=list)  # per model turn, when the loop gives them (env_agent)
    finish: str = ""  # one of FINISH_REASONS
    final_text: str = ""  # the last model turn's text: what a reward function reads as the response
    info: Dict[str, Any] = field(default_factory=dict)  # anything else the loop wants the reward to see
    versions: List[int] = field(default_factory=list)  # the policy version of each model turn (a rollout apart)

    def add_model_tokens(self, ids: Sequence[int], log_probs: Sequence[float]) -> None:
        self.response_ids += list(ids)
        self.loss_mask += [1] * len(ids)
        self.log_probs += [float(x) for x in log_probs]
        self.turns += 1

    def add_inserted_tokens(self, ids: Sequence[int]) -> None:
        self.response_ids += list(ids)
        self.loss_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)

    @property
    def context(self) -> List[int]:
        """What the model continues from on its next turn."""
        return self.prompt_ids + self.response_ids

    def summary(self) -> Dict[str, Any]:
        """What the reward function sees of the episode (extra["agent"])."""
        return {
            "turns": self.turns,
            "tool_calls": list(self.tool_calls),
            "malformed": list(self.malformed),
            "turn_rewards": list(self.turn_rewards),
            "finish": self.finish,
            **self.info,
        }


def trajectories_to_batch(
    prompts: DataProto, trajectories: Sequence[Trajectory], response_length: int, pad_id: int
) -> DataProto:
    """The rollout batch of `RolloutEngine.generate` (same columns) from one trajectory per row of `prompts`
    (left-padded prompt tensors, already repeated n times), plus the non-tensors `response_text` (the final model
    turn) and `agent` (each trajectory's summary)."""
    if len(prompts) != len(trajectories):
        raise ValueError(f"{len(trajectories)} trajectories for {len(prompts)} prompt rows")
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    for i, t in enumerate(trajectories):
        if len(t.response_ids) > response_length:
            raise ValueError(f"trajectory {i} has {len(t.response_ids)} response tokens, over {response_length}")
        if ids[i][mask[i].bool()].tolist() != t.prompt_ids:
            raise ValueError(f"trajectory {i} does not start from its prompt row's tokens")
    responses = pad_rows([t.response_ids for t in trajectories], response_length, pad_id, torch.long)
    response_mask = pad_rows([t.loss_mask for t in trajectories], response_length, 0, torch.long)
    log_probs = pad_rows([t.log_probs for t in trajectories], response_length, 0.0, torch.float32)
    real = pad_rows([[1] * len(t.response_ids) for t in trajectories], response_length, 0, torch.long)
    tensors = rollout_tensors(prompts, responses, response_mask, log_probs, real)  # tool output is context too
    if trajectories and all(t.versions for t in trajectories):  # the oldest policy that sampled a token of each
        tensors["weight_version"] = torch.tensor([min(t.versions) for t in trajectories], dtype=torch.long)
    non_tensors = dict(prompts.non_tensor_batch)
    non_tensors["response_text"] = np.array([t.final_text for t in trajectories], dtype=object)
    non_tensors["agent"] = np.array([t.summary() for t in trajectories], dtype=object)
    return DataProto.from_dict(tensors, non_tensors, dict(prompts.meta_info))


def trajectory_metrics(trajectories: Sequence[Trajectory]) -> Dict[str, float]:
    """agent/*: turns, tool-call and malformed-call rates, tool failures by kind, how trajectories ended."""
    n = max(1, len(trajectories))
    status = Counter(c["status"] for t in trajectories for c in t.tool_calls)
    calls = sum(len(t.tool_calls) for t in trajectories)
    malformed = sum(len(t.malformed) for t in trajectories)
    metrics = {
        "agent/turns/mean": sum(t.turns for t in trajectories) / n,
        "agent/turns/max": float(max((t.turns for t in trajectories), default=0)),
        "agent/tool_calls/mean": calls / n,
        "agent/tool_call_rate": sum(bool(t.tool_calls) for t in trajectories) / n,  # trajectories that call a tool
        "agent/malformed_calls/mean": malformed / n,
        "agent/malformed_rate": sum(bool(t.malformed) for t in trajectories) / n,
        "agent/inserted_tokens/mean": sum(len(t.loss_mask) - sum(t.loss_mask) for t in trajectories) / n,
    }
    for kind in ("error", "timeout", "unknown"):
        metrics[f"agent/tool_{kind}s"] = float(status.get(kind, 0))
    finish = Counter(t.finish for t in trajectories)
    for reason in FINISH_REASONS:
        metrics[f"agent/finish/{reason}"] = finish.get(reason, 0) / n
    return metrics
