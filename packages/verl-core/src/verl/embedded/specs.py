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

    def cache_key(self) -> dict[str, Any]:
        """Everything that shapes the built folder; its hash names the cache entry."""
        from verl.embedded.tokenizer import CHARACTERS, CHAT_TEMPLATE, SPECIAL_TOKENS  # (imports transformers)

        return {
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
}
