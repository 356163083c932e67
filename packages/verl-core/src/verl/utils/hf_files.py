"""Hugging Face model folders and checkpoints: the files that travel with exported weights, the experts a folder's
config declares, and tensors under the names a checkpoint gives them."""

from __future__ import annotations

import glob
import json
import os
import shutil
from typing import Any, Iterator, Optional, Tuple

# Everything a tokenizer (and generation defaults, and a vision-language model's image and video processors) is
# loaded from; weights and config are written anew.
TOKENIZER_GLOBS = (
    "tokenizer*",
    "special_tokens_map.json",
    "chat_template*",
    "vocab*",
    "merges.txt",
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)


def copy_tokenizer_files(src: str, dst: str) -> list[str]:
    """Copy the tokenizer, generation and processor files of folder `src` into `dst`; returns the names copied."""
    copied = []
    for pattern in TOKENIZER_GLOBS:
        for f in glob.glob(os.path.join(src, pattern)):
            if os.path.isfile(f):
                shutil.copy2(f, os.path.join(dst, os.path.basename(f)))
                copied.append(os.path.basename(f))
    return sorted(copied)


def folder_config(path: str) -> Optional[dict]:
    """The config.json in `path` as a dict (None: no readable one)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def folder_experts(path: str) -> Optional[int]:
    """Routed experts per layer that the config.json in `path` declares (0: a dense model; None: no readable config)."""
    config = folder_config(path)
    if config is None:
        return None
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


def folder_vision_model(path: str) -> Optional[str]:
    """The model type when the config.json in `path` declares a vision tower (a vision-language model), else None."""
    config = folder_config(path) or {}
    return str(config.get("model_type")) if config.get("vision_config") else None


def checkpoint_tensors(model: Any, name: str, tensor: Any) -> Iterator[Tuple[str, Any]]:
    """One parameter of a transformers model as `save_pretrained` writes it, by transformers' own reverse
    conversion: most pass through as they are; a mixture of experts' fused experts (`mlp.experts.gate_up_proj`
    [E, 2I, H], `down_proj`) come apart into one tensor per expert and projection under the checkpoint's names
    (Mixtral's under `block_sparse_moe`). The wire format every engine streams and the rollouts load."""
    from transformers.core_model_loading import revert_weight_conversion

    yield from revert_weight_conversion(model, {name: tensor}).items()
