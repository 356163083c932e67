"""Generated batches between the rollout and the trainer: one still generating (`PendingRollout`), its form in a
checkpoint (one_step_off saves the batch it generated ahead), and how stale its samples are."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import numpy as np

from verl.protocol import DataProto


class PendingRollout:
    """A batch being generated (`PPOTrainer.submit_generate`); `result()` waits for it, once."""

    def __init__(self, finish: Callable[[], DataProto]):
        self._finish = finish
        self._batch: Optional[DataProto] = None

    def result(self) -> DataProto:
        if self._batch is None:
            self._batch = self._finish()
        return self._batch


def _plain(value: Any) -> Any:
    """numpy values as plain Python ones (what a checkpoint loaded with weights_only=True may hold)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def batch_state(batch: DataProto) -> Dict[str, Any]:
    """A generated batch as tensors and plain values, for the trainer state of a checkpoint."""
    return {
        "tensors": {k: v.clone() for k, v in batch.batch.items()},
        "non_tensors": {k: _plain(v) for k, v in batch.non_tensor_batch.items()},
        "meta": _plain(dict(batch.meta_info)),
    }


def batch_from_state(state: Dict[str, Any]) -> DataProto:
    non_tensors: Dict[str, Any] = {}
    for key, rows in state["non_tensors"].items():
        column = np.empty(len(rows), dtype=object)
        for i, row in enumerate(rows):  # (one by one: numpy would broadcast rows that are equal-length lists)
            column[i] = row
        non_tensors[key] = column
    return DataProto.from_dict(state["tensors"], non_tensors, state["meta"])


def rollout_metrics(batch: DataProto, version: int) -> Dict[str, float]:
    """From a batch generated on the rollout's own pool: how many updates behind the trainer's policy (`version`)
    its samples are (async/staleness_mean, _max). Removes the per-sample `weight_version` column. Empty for a
    colocated rollout's batch (always on-policy)."""
    if "weight_version" not in batch.batch.keys():
        return {}
    staleness = (version - batch.batch.pop("weight_version")).float()
    return {"async/staleness_mean": float(staleness.mean()), "async/staleness_max": float(staleness.max())}
