"""What makes a checkpoint part of one run: the settings that decide what it computes, the model and the data.

Every checkpoint carries its run's fingerprint (run.json, written and read by CheckpointManager). `trainer.resume: auto` continues from the latest
checkpoint only when the fingerprint now is the same; keys that say how a run is carried out or recorded (its
length, logging, validation, placement, micro-batch sizes) may change between a run and its resumption.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from verl.config.schema import VerlConfig

# Keys (or key prefixes, ending in ".") a resumed run may set differently: none changes what a step computes.
FREE = (
    "trainer.total_steps",
    "trainer.total_epochs",
    "trainer.val_every",
    "trainer.val_before_train",
    "trainer.log_every",
    "trainer.resume",
    "trainer.controller",
    "trainer.output_dir",
    "trainer.plugins",
    "trainer.profile",
    "trainer.profile.",
    "reward.server.",  # where scores come from, not what they are
    "tracking.",
    "checkpoint.",
    "placement.",
    "data.val_files",
    "actor.entropy_every",
    "actor.param_offload",
    "critic.param_offload",
    "ref.param_offload",
    "actor.optimizer_offload",
    "critic.optimizer_offload",
    "rollout.gpu_memory_utilization",
)
# how a batch is cut for memory, not what it sums to
FREE_SUFFIXES = ("micro_batch_size_per_device", "max_tokens_per_device")


def _free(key: str) -> bool:
    if key.endswith(FREE_SUFFIXES):
        return True
    return any(key == f or (f.endswith(".") and key.startswith(f)) for f in FREE)


def _flatten(obj: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(obj, Mapping):
        out: Dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def _files(paths: Any) -> List[Any]:
    """A data file's identity: its path and row count (a regenerated file with other rows is other data)."""
    out = []
    for path in [] if paths is None or isinstance(paths, str) else list(paths):
        rows = None
        if isinstance(path, str) and os.path.isfile(path):
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                rows = pq.read_metadata(path).num_rows
            except (pa.ArrowInvalid, OSError):  # not parquet: the data-file checks report it
                pass
        out.append([path, rows])
    return out


def _model(path: Any) -> Optional[str]:
    """A hash of a model folder's config.json: the same path holding another model is another model."""
    config = os.path.join(path, "config.json") if isinstance(path, str) else ""
    if not os.path.isfile(config):
        return None
    with open(config, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def fingerprint(cfg: VerlConfig) -> Dict[str, Any]:
    """The run's identity as flat dotted keys (JSON values), from a resolved config (DictConfig or dict)."""
    from omegaconf import DictConfig, OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    flat = {k: v for k, v in _flatten(tree).items() if not _free(k)}
    flat["data.train_files"] = _files(flat.get("data.train_files"))
    flat["model.config_json"] = _model(flat.get("model.path"))
    return json.loads(json.dumps(flat, default=str))  # as it reads back from run.json


def differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> List[Tuple[str, Any, Any]]:
    """(key, saved value, value now) for every key that differs, in key order."""
    keys = sorted(set(saved) | set(now))
    return [(k, saved.get(k), now.get(k)) for k in keys if saved.get(k) != now.get(k)]


def describe(changes: List[Tuple[str, Any, Any]], limit: int = 4) -> str:
    shown = "; ".join(f"{k} was {json.dumps(a)}, now {json.dumps(b)}" for k, a, b in changes[:limit])
    more = len(changes) - limit
    return shown + (f" (and {more} more: {', '.join(k for k, _, _ in changes[limit:])})" if more > 0 else "")
