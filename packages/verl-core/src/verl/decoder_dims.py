"""The sizes of a Hugging Face decoder's config that the memory and throughput models are made of."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Tuple


@dataclass(frozen=True)
class Dims:
    hidden: int
    intermediate: int  # a dense MLP's
    layers: int
    heads: int
    head_dim: int
    kv_heads: int
    vocab: int
    experts: int = 0  # routed experts of a mixture of experts (0: dense)
    top_k: int = 0
    expert_intermediate: int = 0  # one expert's MLP
    tied: bool = False
    routed: Tuple[bool, ...] = ()  # per layer: routes to experts (True) or a dense MLP

    @classmethod
    def of(cls, c: Any) -> "Dims":
        """The decoder's sizes; a vision-language model's are its language model's (`text_config`)."""
        c = c.get_text_config() if hasattr(c, "get_text_config") else c
        heads = int(c.num_attention_heads)
        experts = int(getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None) or 0)
        return cls(
            hidden=int(c.hidden_size),
            intermediate=int(c.intermediate_size),
            layers=int(c.num_hidden_layers),
            heads=heads,
            head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // heads),
            kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
            vocab=int(c.vocab_size),
            experts=experts,
            top_k=int(getattr(c, "num_experts_per_tok", 0) or 0) if experts else 0,
            expert_intermediate=int(getattr(c, "moe_intermediate_size", None) or c.intermediate_size) if experts else 0,
            tied=bool(getattr(c, "tie_word_embeddings", False)),
            routed=tuple(routed_layers(c)),
        )

    @property
    def q(self) -> int:
        """Query width: heads x head_dim (not always the hidden size)."""
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        """Key (or value) width: kv heads x head_dim."""
        return self.kv_heads * self.head_dim

    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        """A token's keys and values over every layer."""
        return 2 * self.layers * self.kv * dtype_bytes

    def parameters(self, active: bool = False) -> int:
        """Parameters from the config alone (norms left out); `active`: those a token passes through, its top-k
        experts of a routed layer."""
        attention = 2 * self.hidden * self.q + 2 * self.hidden * self.kv
        experts = self.top_k if active else self.experts
        mlp = sum(
            3 * self.hidden * (self.expert_intermediate * experts if r else self.intermediate) for r in self.routed
        )
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * attention + mlp + embed


def routed_layers(hf_config: Any) -> List[bool]:
    """Which decoder layers route to experts, by transformers' rule: a layer routes unless `mlp_only_layers` lists
    it, every `decoder_sparse_step`-th (Qwen-MoE; Mixtral has neither: every layer); all False for a dense model."""
    experts = int(getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None) or 0)
    n = int(hf_config.num_hidden_layers)
    dense = set(getattr(hf_config, "mlp_only_layers", None) or [])
    step = int(getattr(hf_config, "decoder_sparse_step", None) or 1)
    return [experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(n)]
