"""The reward model on worker processes: `RewardModelWorker` (each rank holds a copy of `reward.model`) and
`PooledRewardModel`, the driver's handle that RewardManager scores with as if the model were local.

A pool that lists `reward` among its roles runs the model there, on devices of its own or shared with the actor's
(a process of its own on each device, as a colocated critic is). Each batch is split over the ranks (data
parallel): a model with `score_texts` gets each rank's conversations and response texts, one with `forward` its
prompt and response ids. Without `reward` in a pool, the model runs in the driver process.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List

import torch

from verl.config.instantiate import instantiate, resolve_target
from verl.config.plan import Plan
from verl.controller import Dispatch, Worker, register
from verl.protocol import DataProto
from verl.workers.setup import setup_worker


class RewardModelWorker(Worker):
    def __init__(self, config: Any, plan: Plan):
        self.cfg, self.plan = config, plan

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> Dict[str, bool]:
        """Build reward.model on this rank's device; returns {"texts": whether it scores texts (score_texts)}."""
        setup_worker(self.cfg)
        spec = self.cfg.reward.model
        # a model that takes a device and was not given one goes on this worker's (its GPU, under Ray)
        extra = {"device": str(self.device)} if "device" not in spec and _takes(spec, "device") else {}
        self.model = instantiate(spec, key="reward.model", **extra)
        return {"texts": callable(getattr(self.model, "score_texts", None))}

    @register(Dispatch.DP_COMPUTE)
    def score(self, batch: DataProto) -> DataProto:
        """Scores [rows] of this rank's share, from texts (conversation, response_text) or ids (prompts, responses);
        meta_info["metrics"]: the model's own metrics of the call (e.g. a judge's unparsed outputs), if it keeps them."""
        if "response_text" in batch.non_tensor_batch:
            conversations = [list(c) for c in batch.non_tensor_batch["conversation"]]
            out = self.model.score_texts(conversations, [str(t) for t in batch.non_tensor_batch["response_text"]])
        else:
            with torch.no_grad():
                prompts, responses = batch.batch["prompts"], batch.batch["responses"]
                model = self.model
                out = (
                    model(prompts, responses)
                    if isinstance(model, torch.nn.Module)
                    else model.forward(prompts, responses)
                )
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"reward.model returned {type(out).__name__}; it must return a Tensor of shape [B]")
        out = out[:, 0] if out.dim() == 2 and out.shape[1] == 1 else out
        if tuple(out.shape) != (len(batch),):
            raise ValueError(f"reward.model returned shape {tuple(out.shape)} for {len(batch)} samples; expected [B]")
        metrics = dict(getattr(self.model, "last_metrics", None) or {})
        return DataProto.from_dict({"scores": out.detach().double().cpu()}, meta_info={"metrics": metrics})


class PooledRewardModel:
    """RewardManager's reward model when it runs on a worker group: each batch's rows split over the ranks.

    It has `score_texts` or `forward` as the model on the workers has (RewardManager picks the way by which one
    exists), and `last_metrics`: the ranks' metrics of the last call, a metric named ".../mean..." averaged over
    the rows, any other (a count) summed."""

    def __init__(self, group: Any, capabilities: Dict[str, bool]):
        self.group = group
        if capabilities["texts"]:
            self.score_texts = self._score_texts
        else:
            self.forward = self._forward
        self.last_metrics: Dict[str, float] = {}

    def _score_texts(self, conversations: List[List[Dict[str, str]]], responses: List[str]) -> torch.Tensor:
        rows = DataProto.from_dict(
            non_tensors={"conversation": list(conversations), "response_text": [str(r) for r in responses]}
        )
        return self._scores(rows)

    def _forward(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        return self._scores(DataProto.from_dict({"prompts": prompts.cpu(), "responses": responses.cpu()}))

    def _scores(self, rows: DataProto) -> torch.Tensor:
        # Shares as even as the count allows (rank r takes one more while r < n % world): no padding rows, which
        # a model's counts would include.
        n, world = len(rows), self.group.world_size
        bounds = [r * (n // world) + min(r, n % world) for r in range(world + 1)]
        calls = [
            (
                bounds[r + 1] - bounds[r],
                self.group.submit_to(r, RewardModelWorker.score, rows[bounds[r] : bounds[r + 1]]),
            )
            for r in range(world)
            if bounds[r + 1] > bounds[r]
        ]
        outs = [(size, call.result()) for size, call in calls]
        self.last_metrics = _combined([(size, out.meta_info.get("metrics") or {}) for size, out in outs])
        if not outs:
            return torch.zeros(0, dtype=torch.float64)
        return torch.cat([out.batch["scores"] for _, out in outs])


def _combined(per_rank: List[tuple]) -> Dict[str, float]:
    """The ranks' metrics as one call's: means weighted by the rows each rank scored, counts summed."""
    total = sum(size for size, _ in per_rank) or 1
    keys = dict.fromkeys(k for _, metrics in per_rank for k in metrics)
    return {
        k: (
            sum(size * float(m.get(k, 0.0)) for size, m in per_rank) / total
            if "mean" in k
            else sum(float(m.get(k, 0.0)) for _, m in per_rank)
        )
        for k in keys
    }


def _takes(spec: Any, name: str) -> bool:
    """Whether reward.model's target accepts a keyword argument `name`."""
    try:
        target = resolve_target(str(spec["_target_"]), key="reward.model._target_")
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
