"""Save and load megatron distributed checkpoints (the torch_dist format) from inside worker processes.

The format is megatron's own, so checkpoints reshard on load (another TP / PP / DP layout) and megatron's
default loader reads them. Writing goes through torch.distributed.checkpoint's plain FileSystemWriter in the
calling process: megatron's default writer starts a spawn-based manager and forked writer processes for
asynchronous saves, which a Ray worker on a CPU machine gains nothing from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Union

from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.strategies.torch import (
    MCoreSavePlanner,
    TorchDistSaveShardedStrategy,
    _replace_state_dict_keys_with_sharded_keys,
    mcore_to_pyt_state_dict,
)


class InProcessTorchDistSave(TorchDistSaveShardedStrategy):
    """megatron's torch_dist save strategy, written synchronously by this process."""

    def __init__(self) -> None:
        super().__init__("torch_dist", 1, thread_count=1)

    def save(self, sharded_state_dict: Dict[str, Any], checkpoint_dir: Union[str, Path]) -> None:
        import torch.distributed.checkpoint as dcp

        state, _, _ = _replace_state_dict_keys_with_sharded_keys(sharded_state_dict, self.keep_only_main_replica)
        dcp.save(
            mcore_to_pyt_state_dict(state, False),
            storage_writer=dcp.FileSystemWriter(str(checkpoint_dir), thread_count=1),
            planner=MCoreSavePlanner(
                dedup_replicated_tensors=not self.keep_only_main_replica, flatten_state_dict=False
            ),
        )


def save(sharded_state_dict: Dict[str, Any], path: str) -> None:
    dist_checkpointing.save(sharded_state_dict, path, sharded_strategy=InProcessTorchDistSave())


def load(sharded_state_dict: Dict[str, Any], path: str) -> Dict[str, Any]:
    return dist_checkpointing.load(sharded_state_dict, path)
