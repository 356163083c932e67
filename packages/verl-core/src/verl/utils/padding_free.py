"""The padding-free layout: every row's real tokens one after another in a single row, position ids restarting at
0 where each row begins, and no attention mask.

Flash-attention takes no 4D mask, so shared-prefix packing (verl.utils.shared_prefix) cannot run on it; this is
what it takes instead. Hugging Face models read the sequence boundaries from the position ids of a batch of one
row: flash-attention's varlen kernels get them as cu_seqlens (no padding computed, no mask built), SDPA and eager
attention as a block-diagonal causal mask (which is how the layout is tested on CPU). Each prompt is computed
once per sample, but no pad token at all.
"""

from __future__ import annotations

import torch

from verl.utils.shared_prefix import PrefixPack


def padding_free(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int
) -> PrefixPack:
    """Rows `[B, P+R]` (prompt left-padded, response right-padded, position ids 0 at each row's first real token)
    as one row `[1, T]` of their T real tokens; `gather` puts per-position outputs back in `[B, R]`."""
    mask = attention_mask.bool()
    b, s = mask.shape
    p = s - response_length
    lengths = mask.sum(-1)
    offsets = torch.cumsum(lengths, 0) - lengths  # where each row starts in the stream
    flat_index = (mask.long().cumsum(-1) - 1).clamp(min=0) + offsets[:, None]  # a real token's place in the stream
    # responses[:, t] is predicted by the token before it: column p - 1 + t, real wherever response token t is
    valid = mask[:, p:]
    cols = torch.where(valid, flat_index[:, p - 1 : s - 1], torch.zeros_like(flat_index[:, p - 1 : s - 1]))
    return PrefixPack(
        input_ids=input_ids[mask][None],
        position_ids=position_ids[mask][None],
        allowed=None,
        rows=torch.zeros_like(cols),
        cols=cols,
        valid=valid,
        source=torch.where(mask, flat_index, torch.full_like(flat_index, -1)),
    )
