"""The engine batch layout (left-padded prompt + right-padded response) as megatron-core runs it.

Each row is rotated so its first real token sits at position 0: the real tokens then occupy positions
0..L-1, which are exactly the row's HF position_ids, and a plain causal mask is all the model needs (padding
lies after every real token, where causal attention never looks). So megatron's positional RoPE, the local
attention's default causal mask and TransformerEngine's/flash causal kernels all compute what HF computes with
its padding mask.

Packed rows (`model.shared_prefix`, local attention): the micro-batch packed by shared prompt as the FSDP engine
packs it (verl.utils.shared_prefix: each prompt once, its samples after it, no padding), with the pack's mask given
to the model as its attention mask; outputs are gathered back to [B, R] from the packed positions.

THD rows (`model.shared_prefix` with TransformerEngine, which takes no mask): every row's real tokens in one
stream (verl.utils.padding_free), the rows' boundaries as `cu_seqlens` for megatron's packed-sequence parameters;
no pad token computed except the few that round the stream up to what sequence parallelism splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch

from verl.utils.padding_free import padding_free
from verl_megatron.context_parallel import chunk_positions, local_index


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor  # [B, S'] rows rotated left by their padding (then zero-padded to S')
    position_ids: torch.Tensor  # [B, S'] 0..S'-1, S' the length padded to the multiple asked for
    predict_index: torch.Tensor  # [B, R] position whose hidden state predicts responses[:, t]
    labels: torch.Tensor  # [B, R] the response tokens


def rotation(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] where each position of a padded row comes from: row b's rotated position l holds its original position
    (l + leading padding) % S. A permutation of each row: every position, padding too, has one place."""
    s = attention_mask.shape[1]
    shift = (~attention_mask.bool()).long().cumprod(1).sum(1)
    return (torch.arange(s, device=attention_mask.device) + shift[:, None]) % s


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, responses: torch.Tensor, multiple: int = 1) -> Packed:
    """Rotate rows so real tokens start at 0; where each response token is predicted from afterwards.

    multiple: pad the sequence length to a multiple of it (sequence and context parallelism split sequences
    evenly); the padding goes after every real token, where causal attention never looks."""
    b, s = input_ids.shape
    r = responses.shape[1]
    mask = attention_mask.bool()
    shift = (~mask).long().cumprod(1).sum(1)  # leading padding per row
    idx = rotation(attention_mask)
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


@dataclass(frozen=True)
class Rows:
    """One micro-batch as the model runs it: padded rows (causal mask) or packed rows (their own mask)."""

    input_ids: torch.Tensor  # [G, L]
    position_ids: torch.Tensor  # [G, L]
    mask: Optional[torch.Tensor]  # [G, 1, L, L] True where a query may NOT see a key (megatron's convention); None:
    # causal
    hidden_row: torch.Tensor  # [B, R] the row whose hidden state predicts responses[b, t]
    predict_index: torch.Tensor  # [B, R] its position in that row
    valid: Optional[torch.Tensor]  # [B, R] False past a packed row's response (outputs zeroed there); None: all
    labels: torch.Tensor  # [B, R]
    cu_seqlens: Optional[torch.Tensor] = None  # THD rows: [sequences + 1] int32 boundaries in the one row
    source: Optional[torch.Tensor] = None  # [B, S] where each position of the micro-batch is computed: its flat
    # index in input_ids (row * L + col), -1 where nothing computes it (routing replay maps routes with it)


def padded_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, responses: torch.Tensor, multiple: int) -> Rows:
    """The padded layout (`pack`): a row per sample, rotated so its real tokens start at 0."""
    p = pack(input_ids, attention_mask, responses, multiple)
    b, s = input_ids.shape
    rows = torch.arange(b, device=input_ids.device)[:, None]
    # position s of row b sits where the rotation put it: (s - leading padding) % S
    shift = (~attention_mask.bool()).long().cumprod(1).sum(1)
    source = rows * p.input_ids.shape[1] + (torch.arange(s, device=input_ids.device) - shift[:, None]) % s
    return Rows(
        p.input_ids,
        p.position_ids,
        None,
        rows.expand_as(p.predict_index),
        p.predict_index,
        None,
        p.labels,
        source=source,
    )


def packed_rows(prefix_pack: Any, responses: torch.Tensor) -> Rows:
    """A shared-prefix pack (verl.utils.shared_prefix.PrefixPack) in megatron's terms: its mask inverted."""
    p = prefix_pack
    return Rows(p.input_ids, p.position_ids, ~p.allowed, p.rows, p.cols, p.valid, responses, source=p.source)


def thd_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    responses: torch.Tensor,
    multiple: int,
) -> Rows:
    """The THD layout: one row [1, T] of every row's real tokens, `cu_seqlens` their boundaries, T rounded up to a
    multiple of `multiple` by a padding sequence of its own."""
    pack = padding_free(input_ids, attention_mask, position_ids, responses.shape[1])
    lengths = attention_mask.sum(-1).to(torch.int32)
    cu = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0, dtype=torch.int32)])
    rows = Rows(pack.input_ids, pack.position_ids, None, pack.rows, pack.cols, pack.valid, responses, cu, pack.source)
    t = pack.input_ids.shape[1]
    return pad_rows(rows, 1, -(-t // multiple) * multiple)


def pad_rows(rows: Rows, count: int, length: int) -> Rows:
    """`rows` grown to [count, length] (the pipeline schedule sends one shape for every micro-batch; sequence and
    context parallelism split lengths evenly): added tokens are never read; in packed rows they see only
    themselves, in padded rows (causal) they lie after every real token or in rows of their own."""
    g, s = rows.input_ids.shape
    if (g, s) == (count, length):
        return rows
    grow = (0, length - s, 0, count - g)
    cu = rows.cu_seqlens
    if cu is not None:  # THD: the added tokens are a sequence of their own, seen by nothing else
        if count != 1:
            raise ValueError(f"THD rows are one row; cannot grow them to {count}")
        cu = torch.cat([cu, cu.new_tensor([length])]) if length > s else cu
    mask = None
    if rows.mask is not None:
        mask = torch.ones(count, 1, length, length, dtype=torch.bool, device=rows.mask.device)
        mask[:g, :, :s, :s] = rows.mask
        idx = torch.arange(length, device=mask.device)
        fresh = torch.ones(count, length, dtype=torch.bool, device=mask.device)
        fresh[:g, :s] = False
        mask[:, 0, idx, idx] &= ~fresh  # a padding query sees itself, so its softmax has a key
    return Rows(
        torch.nn.functional.pad(rows.input_ids, grow),
        torch.nn.functional.pad(rows.position_ids, grow),
        mask,
        rows.hidden_row,
        rows.predict_index,
        rows.valid,
        rows.labels,
        cu,
        None if rows.source is None else torch.where(rows.source >= 0, rows.source // s * length + rows.source % s, -1),
    )


def rank_inputs(rows: Rows, layout: Any, device: Any) -> Dict[str, Any]:
    """The model inputs of one micro-batch on this rank (its context-parallel part of each sequence)."""
    out = {
        "input_ids": rows.input_ids,
        "position_ids": rows.position_ids,
        "attention_mask": rows.mask,
        "hidden_row": rows.hidden_row,
        "predict_index": rows.predict_index,
        "valid": rows.valid,
        "labels": rows.labels,
    }
    if layout.cp > 1:
        seq, cp, rank = rows.input_ids.shape[1], layout.cp, layout.cp_rank
        mine = chunk_positions(seq, cp, rank)
        out.update(input_ids=rows.input_ids[:, mine], position_ids=rows.position_ids[:, mine])
        if rows.mask is not None:  # this rank's queries over the keys as the group gathers them (rank order)
            keys = torch.cat([chunk_positions(seq, cp, r) for r in range(cp)])
            out["attention_mask"] = rows.mask[:, :, mine][:, :, :, keys]
        out["local_index"] = local_index(rows.predict_index, seq, cp, rank)
    if rows.cu_seqlens is not None:
        from megatron.core.packed_seq_params import PackedSeqParams

        cu = rows.cu_seqlens.to(device)
        longest = int((rows.cu_seqlens[1:] - rows.cu_seqlens[:-1]).max())
        out["packed_seq_params"] = PackedSeqParams(
            qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest
        )
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def rows_kind(rows: Rows) -> str:
    """thd, padded or packed: which layout `rows` are in."""
    return "thd" if rows.cu_seqlens is not None else "padded" if rows.mask is None else "packed"


def zero_past(outputs: Dict[str, torch.Tensor], mb: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """Packed rows hold no position past a response's end: outputs there are 0 (padded rows compute them)."""
    valid = mb["valid"]
    if valid is None:
        return outputs
    return {k: v * valid.to(v.dtype) for k, v in outputs.items()}


def hf_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Hugging Face's position ids of left-padded rows: 0 at each row's first real token."""
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)
