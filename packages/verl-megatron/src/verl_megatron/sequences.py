"""The engine batch layout (left-padded prompt + right-padded response) as megatron-core runs it.

Each row is rotated so its first real token sits at position 0: the real tokens then occupy positions
0..L-1, which are exactly the row's HF position_ids, and a plain causal mask is all the model needs (padding
lies after every real token, where causal attention never looks). So megatron's positional RoPE, the local
attention's default causal mask and TransformerEngine's/flash causal kernels all compute what HF computes with
its padding mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor  # [B, S'] rows rotated left by their padding (then zero-padded to S')
    position_ids: torch.Tensor  # [B, S'] 0..S'-1, S' the length padded to the multiple asked for
    predict_index: torch.Tensor  # [B, R] position whose hidden state predicts responses[:, t]
    labels: torch.Tensor  # [B, R] the response tokens


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, responses: torch.Tensor, multiple: int = 1) -> Packed:
    """Rotate rows so real tokens start at 0; where each response token is predicted from afterwards.

    multiple: pad the sequence length to a multiple of it (sequence and context parallelism split sequences
    evenly); the padding goes after every real token, where causal attention never looks."""
    b, s = input_ids.shape
    r = responses.shape[1]
    mask = attention_mask.bool()
    shift = (~mask).long().cumprod(1).sum(1)  # leading padding per row
    idx = (torch.arange(s, device=input_ids.device) + shift[:, None]) % s
    rotated_mask = torch.gather(mask, 1, idx)
    # Real tokens must be one run: after rotation, no real token may follow a padding one.
    if bool((rotated_mask[:, 1:] & ~rotated_mask[:, :-1]).any()):
        rows = ((rotated_mask[:, 1:] & ~rotated_mask[:, :-1]).any(1)).nonzero().flatten().tolist()
        raise ValueError(
            f"attention_mask rows {rows[:8]} have padding between real tokens; the megatron engine expects "
            "left-padded prompts followed by right-padded responses"
        )
    p = s - r
    if bool((shift >= p).any()):
        raise ValueError("every row needs at least one real prompt token (attention_mask is all padding in a prompt)")
    # responses[:, t] sits at s - r + t; it is predicted by the state one position earlier, rotated by the shift.
    predict = (p - 1 + torch.arange(r, device=input_ids.device))[None, :] - shift[:, None]
    rotated = torch.gather(input_ids, 1, idx)
    padded = -(-s // multiple) * multiple
    if padded > s:
        rotated = torch.nn.functional.pad(rotated, (0, padded - s))
    return Packed(
        input_ids=rotated,
        position_ids=torch.arange(padded, device=input_ids.device).expand(b, padded),
        predict_index=predict,
        labels=responses,
    )


def take(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """hidden [B, S, H] at positions index [B, R] -> [B, R, H]."""
    return torch.gather(hidden, 1, index[..., None].expand(-1, -1, hidden.shape[-1]))
