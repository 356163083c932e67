"""What each embedded model is (architecture settings and init seed), readable without importing transformers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Bump when the folder layout or build procedure changes, so old cache entries are not reused.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class EmbeddedModelSpec:
    """How to build one embedded model: its model type, architecture settings and init seed."""

    model_type: str  # transformers' model_type: the config class that builds it
    settings: Mapping[str, Any] = field(default_factory=dict)  # config kwargs besides vocab and special ids
    seed: int = 0
    # a vision-language model's image processor (Qwen2-VL's kwargs); its text model's settings are in
    # settings["text_config"], its vision tower's in settings["vision_config"]
    image_processor: Mapping[str, Any] = field(default_factory=dict)

    @property
    def vision(self) -> bool:
        return bool(self.image_processor)

    @property
    def text_settings(self) -> Mapping[str, Any]:
        return self.settings.get("text_config", self.settings)

    def cache_key(self) -> dict[str, Any]:
        """Everything that shapes the built folder; its hash names the cache entry."""
        from verl.embedded.tokenizer import (  # (imports transformers)
            CHARACTERS,
            CHAT_TEMPLATE,
            SPECIAL_TOKENS,
            VISION_CHAT_TEMPLATE,
            VISION_TOKENS,
        )

        key: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "model_type": self.model_type,
            "settings": dict(self.settings),
            "seed": self.seed,
            "tokenizer": {
                "special": list(SPECIAL_TOKENS),
                "chars": CHARACTERS,
                "template": CHAT_TEMPLATE,
            },
        }
        if self.vision:  # (a text model's key stays what it was before vision models existed)
            key["vision"] = {"tokens": list(VISION_TOKENS), "template": VISION_CHAT_TEMPLATE}
            key["image_processor"] = dict(self.image_processor)
        return key


EMBEDDED_MODELS: dict[str, EmbeddedModelSpec] = {
    # ~0.8M parameters: learns 2-digit addition with a short SFT warm start plus GRPO in minutes on one core.
    "tiny-llama": EmbeddedModelSpec(
        model_type="llama",
        settings={
            "hidden_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 384,
            "max_position_embeddings": 64,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
        },
        seed=0,
    ),
    # ~1.4M parameters (~0.5M active per token): tiny-llama's shape with every MLP a mixture of 8 experts, top-2
    # renormalised (Qwen3-MoE), so a mixture of experts trains end to end on CPU with expert parallelism.
    "tiny-qwen3-moe": EmbeddedModelSpec(
        model_type="qwen3_moe",
        settings={
            "hidden_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "intermediate_size": 384,  # (unused: every layer routes)
            "moe_intermediate_size": 96,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "max_position_embeddings": 64,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
        },
        seed=0,
    ),
    # ~0.9M parameters: a Qwen2.5-VL with tiny-llama's text shape and a 2-block vision tower (14-pixel patches,
    # 2 x 2 merged: a 56 x 56 image is 4 image tokens); multimodal rotary positions over (time, height, width).
    "tiny-qwen2.5-vl": EmbeddedModelSpec(
        model_type="qwen2_5_vl",
        settings={
            "text_config": {
                "hidden_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 384,
                "max_position_embeddings": 128,
                "rms_norm_eps": 1e-5,
                "tie_word_embeddings": False,
                # head_dim 32: 16 rotary frequencies, split between time, height and width
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
            },
            "vision_config": {
                "depth": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_heads": 2,
                "out_hidden_size": 128,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "window_size": 56,
                "fullatt_block_indexes": [1],
            },
            "tie_word_embeddings": False,
        },
        image_processor={
            "size": {"shortest_edge": 56 * 56, "longest_edge": 56 * 56},  # (pixels: every image becomes 56 x 56)
            "patch_size": 14,
            "merge_size": 2,
            "temporal_patch_size": 2,
        },
        seed=0,
    ),
    # ~1M parameters: a Qwen3-VL with a Qwen3 text model of tiny-llama's shape (q/k norms) and a 2-block vision
    # tower (16-pixel patches, 2 x 2 merged: a 64 x 64 image is 4 image tokens) whose blocks' features are also
    # added to the first two text layers' image positions (deepstack); interleaved multimodal rotary positions.
    "tiny-qwen3-vl": EmbeddedModelSpec(
        model_type="qwen3_vl",
        settings={
            "text_config": {
                "hidden_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "intermediate_size": 384,
                "max_position_embeddings": 128,
                "rms_norm_eps": 1e-5,
                "tie_word_embeddings": False,
                # 16 rotary frequencies, interleaved between time, height and width (Qwen3-VL's 24/20/20 of 64)
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "mrope_section": [6, 5, 5],
                    "mrope_interleaved": True,
                },
            },
            "vision_config": {
                "depth": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_heads": 2,
                "out_hidden_size": 128,
                "patch_size": 16,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "num_position_embeddings": 16,  # (a 4 x 4 grid of learned positions, interpolated to the image)
                "deepstack_visual_indexes": [0, 1],
            },
            "tie_word_embeddings": False,
        },
        image_processor={
            "size": {"shortest_edge": 64 * 64, "longest_edge": 64 * 64},  # (pixels: every image becomes 64 x 64)
            "patch_size": 16,
            "merge_size": 2,
            "temporal_patch_size": 2,
        },
        seed=0,
    ),
}
