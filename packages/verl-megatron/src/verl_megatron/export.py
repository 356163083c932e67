"""Megatron checkpoints to Hugging Face folders: the engine's `export_hf` and the `verl export` command.

`write_hf_folder` writes a stream of (HF name, tensor) as safetensors shards of bounded size (plus the index),
the config and the tokenizer, so exporting never holds more than one shard in memory.
`export_checkpoint` turns a checkpoint written by `MegatronEngine.save_checkpoint` (any TP/PP) into an HF
folder in one process: megatron's distributed checkpoint reshards it to TP=1, PP=1 on load.
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

SHARD_BYTES = 2 * 1024**3

VALUE_ARCHITECTURES = {
    "llama": "LlamaForTokenClassification",
    "qwen2": "Qwen2ForTokenClassification",
    "qwen3": "Qwen3ForTokenClassification",
}


def hf_config_for(hf_config: Any, kind: str) -> Any:
    """The config to write beside the weights: a value model is saved as HF's token-classification model."""
    cfg = copy.deepcopy(hf_config)
    if kind == "value":
        cfg.architectures = [VALUE_ARCHITECTURES[cfg.model_type]]
        cfg.num_labels = 1
    return cfg


def write_hf_folder(
    weights: Iterable[Tuple[str, torch.Tensor]],
    path: str,
    hf_config: Any,
    *,
    kind: str = "causal_lm",
    tokenizer_from: Optional[str] = None,
    shard_bytes: int = SHARD_BYTES,
) -> Dict[str, str]:
    """Write `weights` as model(-0000i-of-0000n).safetensors under `path`; returns the weight map."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    shards: List[Any] = []
    current: Dict[str, Any] = {}
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > shard_bytes:
            shards.append(_flush(current, path, len(shards), save_file))
            current, size = {}, 0
        current[name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += nbytes
    shards.append(_flush(current, path, len(shards), save_file))
    weight_map = _finish_names(shards, path)
    hf_config_for(hf_config, kind).save_pretrained(path)
    if tokenizer_from is not None:
        from verl.utils.hf_files import copy_tokenizer_files

        copy_tokenizer_files(tokenizer_from, path)
    return weight_map


def _flush(tensors: Dict[str, torch.Tensor], path: str, index: int, save_file) -> Tuple[str, list]:
    tmp = os.path.join(path, f"shard-{index:05d}.tmp.safetensors")
    save_file(tensors, tmp, metadata={"format": "pt"})
    return tmp, list(tensors)


def _finish_names(shards, path: str) -> Dict[str, str]:
    """Rename the shards to HF's names (model.safetensors when one) and write the index when several."""
    weight_map: Dict[str, str] = {}
    total = len(shards)
    for i, (tmp, names) in enumerate(shards):
        final = "model.safetensors" if total == 1 else f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        os.replace(tmp, os.path.join(path, final))
        weight_map.update({n: final for n in names})
    index = os.path.join(path, "model.safetensors.index.json")
    if total > 1:
        size = sum(os.path.getsize(os.path.join(path, f)) for f in set(weight_map.values()))
        with open(index, "w") as f:
            json.dump({"metadata": {"total_size": size}, "weight_map": weight_map}, f, indent=2)
    elif os.path.exists(index):
        os.remove(index)
    return weight_map


def export_checkpoint(
    checkpoint: str, out: str, *, model_path: Optional[str] = None, shard_bytes: int = SHARD_BYTES
) -> Dict[str, str]:
    """An HF folder at `out` from a megatron engine checkpoint at `checkpoint` (written at any TP/PP).

    Runs in this process as a world of one (gloo): megatron's distributed checkpoint is loaded resharded to
    TP=1, PP=1 on CPU in float32, then converted to HF names and written in the dtype it was trained in.
    Needs host memory for the model in float32.
    """
    from verl.engine_protocol import EngineConfig
    from verl.engine_skeleton import read_meta
    from verl.utils.world_of_one import world_of_one
    from verl_megatron.engine import MegatronEngine

    if model_path is not None:
        raise ValueError("--model: a megatron checkpoint holds every weight and its model's config; it needs no base")
    meta = read_meta(checkpoint, "megatron")
    hf_dir = os.path.join(checkpoint, "hf_config")
    with world_of_one():
        try:
            with warnings.catch_warnings():  # megatron's notes on falling back from apex/TransformerEngine
                warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")
                cfg = EngineConfig(model_path=hf_dir, kind=meta["kind"], device="cpu", dtype="float32")
                engine = MegatronEngine(cfg, weights_from="checkpoint")
                engine.load_checkpoint(checkpoint, model_only=True)
                dtype = getattr(torch, meta.get("dtype", "float32"))
                weights = ((name, t.to(dtype)) for name, t in engine.weights())
                return write_hf_folder(
                    weights, out, engine.hf_config, kind=cfg.kind, tokenizer_from=hf_dir, shard_bytes=shard_bytes
                )
        finally:
            from verl_megatron.parallel import destroy_model_parallel

            destroy_model_parallel()
