"""Embedded models: small Llama-style models (and a Qwen3-MoE) built locally from a seed, written as HF folders.

`model.path: embedded:tiny-llama` in a recipe resolves, through `resolve_model_path`, to a folder in the
cache (see `verl.embedded.cache`) that `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained` load like
any other. The weights are random (a fixed seed), so a run needs a short SFT warm start before RL learns.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from verl.embedded.cache import (
    cache_root,
    cached_dir,
    embedded_name,
    settings_hash,
)
from verl.embedded.specs import EMBEDDED_MODELS, EmbeddedModelSpec
from verl.embedded.tokenizer import build_char_tokenizer

logger = logging.getLogger(__name__)

__all__ = ["EMBEDDED_MODELS", "EmbeddedModelSpec", "build_embedded_model", "materialize_embedded_model"]


def parse_embedded(path: str) -> str:
    """The model NAME in "embedded:NAME"; an unknown name raises an error listing the known ones."""
    return embedded_name(path, EMBEDDED_MODELS, "model")


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build_embedded_model(name: str) -> tuple[PreTrainedModel, Any]:
    """(model, tokenizer) for an embedded model, built in memory in float32 from the spec's seed."""
    spec = EMBEDDED_MODELS[parse_embedded(name)]
    tokenizer = build_char_tokenizer(model_max_length=spec.settings.get("max_position_embeddings"))
    config = AutoConfig.for_model(
        spec.model_type,
        **spec.settings,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model, tokenizer


def materialize_embedded_model(name: str, cache_dir: str | os.PathLike | None = None) -> str:
    """The cached Hugging Face folder of an embedded model ("tiny-llama" or "embedded:tiny-llama").

    Built once per setting hash (config, safetensors weights, tokenizer, generation config) and reused
    afterwards; see `verl.embedded.cache.cache_root` for where the cache lives.
    """
    name = parse_embedded(name)
    spec = EMBEDDED_MODELS[name]
    final = cache_root(cache_dir) / f"{name}-{settings_hash(spec.cache_key())}"

    def write(folder: Path) -> None:
        model, tokenizer = build_embedded_model(name)
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        logger.info(
            "built embedded model %s: %d parameters, in %s",
            name,
            num_parameters(model),
            final,
        )

    return str(cached_dir(final, write))


def resolve_model_path(path: str, cache_dir: str | os.PathLike | None = None) -> str:
    """A loadable folder for `model.path`: embedded models materialised, Hub ids and GGUF files as
    `verl.model_source.resolve_model_source` resolves them, folders as they are."""
    from verl.model_source import resolve_model_source

    return resolve_model_source(path, cache_dir)
