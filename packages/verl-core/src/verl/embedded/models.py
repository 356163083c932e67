"""Embedded models: small Llama-style models (a Qwen3-MoE, a Qwen2.5-VL) built locally from a seed, written as HF
folders.

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
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    GenerationConfig,
    PreTrainedModel,
)

from verl.embedded.cache import (
    cache_root,
    cached_dir,
    embedded_name,
    settings_hash,
)
from verl.embedded.specs import EMBEDDED_MODELS, EmbeddedModelSpec
from verl.embedded.tokenizer import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, build_char_tokenizer

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
    tokenizer = build_char_tokenizer(spec.text_settings.get("max_position_embeddings"), vision=spec.vision)
    ids = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if spec.vision:  # the ids go to the text model; the vision tokens' to the model
        token_ids = {
            f"{what}_token_id": tokenizer.convert_tokens_to_ids(token)
            for what, token in (
                ("image", IMAGE_PAD),
                ("video", VIDEO_PAD),
                ("vision_start", VISION_START),
                ("vision_end", VISION_END),
            )
        }
        settings = {**spec.settings, "text_config": {**spec.text_settings, **ids}}
        config = AutoConfig.for_model(spec.model_type, **settings, **token_ids)
    else:
        config = AutoConfig.for_model(spec.model_type, **spec.settings, **ids)
    auto = AutoModelForImageTextToText if spec.vision else AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(spec.seed)
        model = auto.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
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
        if spec.vision:  # (the PIL image processor: transformers' default one needs torchvision)
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

            Qwen2VLImageProcessorPil(**spec.image_processor).save_pretrained(folder)
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
