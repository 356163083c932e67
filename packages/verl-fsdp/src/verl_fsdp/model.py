"""Build the Hugging Face module an FSDP engine trains: a causal LM (a vision-language model among them), or the same\ntrunk with a value head."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoModelForTokenClassification,
    PreTrainedModel,
)

from verl.data.vision import is_vision_model
from verl.engine_protocol import EngineConfig


def build_model(cfg: EngineConfig, dtype: torch.dtype) -> PreTrainedModel:
    """The role's model, loaded on CPU in `dtype` (FSDP moves shards to the device afterwards)."""
    hf_config = cfg.hf_config()
    kwargs = dict(config=hf_config, dtype=dtype, attn_implementation=cfg.attn_implementation)
    if cfg.kind == "causal_lm":
        auto = AutoModelForImageTextToText if is_vision_model(hf_config) else AutoModelForCausalLM  # (verl_fsdp.vision)
        return auto.from_pretrained(cfg.model_path, **kwargs)
    if cfg.kind == "value":
        # A scalar per token; dropout off so values are a deterministic function of the weights.
        hf_config.num_labels = 1
        hf_config.classifier_dropout = 0.0
        return AutoModelForTokenClassification.from_pretrained(cfg.model_path, **kwargs)
    raise ValueError(f"unknown model kind '{cfg.kind}': use causal_lm or value")


def decoder_layers(model: PreTrainedModel) -> list[torch.nn.Module]:
    """The repeated blocks FSDP shards one by one, found by the class names the model declares unsplittable."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot find its decoder layers")
    return layers
