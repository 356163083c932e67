"""A megatron engine's checkpoints and exports: its chunks' and distributed optimizer's sharded state in megatron's
own format (`verl_megatron.checkpoint`), fully reshardable (a run may resume or export at another TP / PP / DP
layout), beside the state every engine keeps (`engine_skeleton.save_extra`) and what `verl export` needs."""

from __future__ import annotations

import json
import os
from typing import Any, Dict

import torch.distributed as dist

from verl import engine_skeleton as parts
from verl_megatron import checkpoint
from verl_megatron.weights import unwrap


def sharded_state(engine: Any, loading: bool) -> Dict[str, Any]:
    """The engine's model chunks and optimizer as megatron sharded state dicts."""
    meta = {"distrib_optim_sharding_type": "fully_reshardable"}
    state: Dict[str, Any] = {
        f"model{i}": unwrap(c).sharded_state_dict(metadata=meta) for i, c in enumerate(engine.chunks)
    }
    if engine.optimizer is not None:  # matched to the model's sharded tensors by parameter
        state["optimizer"] = engine.optimizer.sharded_state_dict(state, is_loading=loading, metadata=meta)
    return state


def save_engine(engine: Any, path: str) -> None:
    """Collective: every rank writes its shards; rank 0 the metadata `verl export` reads."""
    os.makedirs(path, exist_ok=True)
    engine._resident()
    dist.barrier()
    with engine.optim_away.back():
        checkpoint.save(sharded_state(engine, loading=False), path)
    parts.save_extra(path, engine.state)
    if dist.get_rank() == 0:
        write_meta(engine, path)
    dist.barrier()


def write_meta(engine: Any, path: str) -> None:
    """What `verl export` needs to turn this checkpoint into an HF folder without the training job."""
    from verl.utils.hf_files import copy_tokenizer_files

    hf_dir = os.path.join(path, "hf_config")
    os.makedirs(hf_dir, exist_ok=True)
    engine.hf_config.save_pretrained(hf_dir)
    copy_tokenizer_files(engine.cfg.tokenizer_path or engine.cfg.model_path, hf_dir)
    with open(parts.meta_file(path, "megatron"), "w") as f:
        dtype = str(engine.dtype).removeprefix("torch.")
        json.dump({"backend": "megatron", "kind": engine.cfg.kind, "dtype": dtype, "format": "megatron-dist"}, f)


def load_engine(engine: Any, path: str, *, model_only: bool = False) -> None:
    """Restore a checkpoint saved at any TP/PP; model_only: the weights alone (export)."""
    engine._resident()
    with engine.optim_away.back():
        if engine.optimizer is not None and not model_only:
            # A fresh optimizer has no state to load into (megatron reads its step count from it): take one
            # step with zero gradients, as megatron itself does before loading; the load overwrites it all.
            for inner in getattr(engine.optimizer, "chained_optimizers", [engine.optimizer]):
                if not inner.optimizer.state:
                    inner._init_optimizer_states_with_dummy_values()
        state = sharded_state(engine, loading=True)
        if model_only:
            state.pop("optimizer", None)
        state = checkpoint.load(state, path)
        for i, c in enumerate(engine.chunks):
            unwrap(c).load_state_dict(state[f"model{i}"])
        if model_only:
            return
        if engine.optimizer is not None:
            engine.optimizer.load_state_dict(state["optimizer"])
        parts.load_extra(path, engine.state)


def export_engine(engine: Any, path: str) -> None:
    """Rank 0 writes safetensors + config + tokenizer (and generation config) to `path`; collective."""
    from verl_megatron.export import write_hf_folder

    stream = engine.weights()

    def write() -> None:
        write_hf_folder(
            stream,
            path,
            engine.hf_config,
            kind=engine.cfg.kind,
            tokenizer_from=engine.cfg.tokenizer_path or engine.cfg.model_path,
        )

    def take_part() -> None:
        for _ in stream:  # every rank takes part in the gathers
            pass

    parts.export_then_barrier(write, others=take_part)
