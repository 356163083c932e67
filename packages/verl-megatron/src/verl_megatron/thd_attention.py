"""megatron's local attention over the packed THD layout, so the layout TransformerEngine takes on GPU runs (and is
tested) without it.

With `PackedSeqParams(qkv_format="thd")` megatron hands the core attention queries, keys and values as
[tokens, heads, head_dim]: every sequence of the micro-batch one after another, their boundaries in `cu_seqlens`.
TransformerEngine's attention reads the boundaries itself; megatron's `DotProductAttention` refuses the layout.
`ThdLocalAttention` turns the boundaries into a block-diagonal causal mask (a token sees the earlier tokens of its
own sequence) and runs the local attention over one row; without packed parameters it is the local attention.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention


def block_causal_mask(cu_seqlens: torch.Tensor, tokens: int) -> torch.Tensor:
    """[1, 1, t, t] True where a query may NOT see a key (megatron's convention): another sequence, or later."""
    idx = torch.arange(tokens, device=cu_seqlens.device)
    segment = torch.bucketize(idx, cu_seqlens[1:].to(idx.dtype), right=True)
    allowed = (segment[:, None] == segment[None, :]) & (idx[None, :] <= idx[:, None])
    return ~allowed[None, None]


class ThdLocalAttention(DotProductAttention):
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Any = None,
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"packed sequences in format {packed_seq_params.qkv_format!r}; this attention takes thd")
        tokens = query.shape[0]  # [t, heads, head_dim]: one row of every sequence
        mask = block_causal_mask(packed_seq_params.cu_seqlens_q, tokens)
        out = super().forward(query[:, None], key[:, None], value[:, None], mask, attn_mask_type, attention_bias)
        return out  # [t, 1, heads * head_dim]
