"""Shared-prefix packing: the samples of a prompt computed as one sequence, the prompt once, and no padding.

GRPO-style batches hold n responses per prompt, and the padded layout (`verl.engine_protocol`) runs the prompt n times.
Packed, each group of rows with the same prompt becomes one sequence `[prompt, response_1, ..., response_n]`
with an attention mask under which the prompt is causal and each response sees the prompt and its own earlier
tokens only, at the positions it had in its padded row. Every response token is then predicted from exactly
the hidden states it was predicted from in its own row, so log-probs, values and gradients are those of the
padded batch up to float summation order, for (P + nR) instead of n(P + R) tokens. The sequences, without
their padding, then share packed rows no longer than a padded row (or the longest sequence), each masked off
from the others: short responses of a long-tail batch cost their own length, not the longest one's.

`pack_shared_prefixes` builds the packed inputs and, for each (row, response token), where in the packed batch
the output that predicts it sits; a gather with those indices gives outputs in the padded `[B, R]` layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Optional, Sequence

import torch


@dataclass
class PrefixPack:
    input_ids: torch.Tensor  # [G, L] packed rows: prompt groups' sequences side by side, right-padded
    position_ids: torch.Tensor  # [G, L] the positions the tokens had in their padded rows
    allowed: Optional[torch.Tensor]  # [G, 1, L, L] bool: query i may attend key j; None: the sequences' own
    # boundaries, read from position ids that restart at 0 (verl.utils.padding_free)
    rows: torch.Tensor  # [B, R] the packed row holding the output that predicts responses[b, t]
    cols: torch.Tensor  # [B, R] its position there
    valid: torch.Tensor  # [B, R] bool: t is within the response (up to and including eos)
    source: Optional[torch.Tensor] = None  # [B, P+R] where each position of a row is computed: its flat index in
    # the packed rows (row * L + col), -1 where nothing computes it (padding; a row's last token, which predicts none)

    @property
    def tokens(self) -> int:
        """Tokens the packed batch computes (padding included)."""
        return self.input_ids.numel()

    def attention_mask(self, attn_implementation: str, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """The 4D mask a Hugging Face model takes as given: bool for SDPA, additive for eager attention; None for a
        padding-free pack (the model finds the sequences from the position ids)."""
        if self.allowed is None:
            return None
        if attn_implementation == "eager":
            zeros = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
            return zeros.masked_fill(~self.allowed, torch.finfo(dtype).min)
        return self.allowed

    def gather(self, per_position: torch.Tensor) -> torch.Tensor:
        """[G, L, ...] outputs of the packed batch -> [B, R, ...] aligned with `responses` (0 past the response)."""
        out = take_positions(per_position, self.rows, self.cols)
        valid = self.valid.view(*self.valid.shape, *([1] * (out.dim() - 2)))
        return out * valid.to(out.dtype)


def take_positions(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """`x[rows, cols]` for x [G, L, ...], by index_select: the same values, and a backward that adds up the gradients
    of a position taken several times (a prompt's last token predicts every sample's first response token) in a fixed
    order. Advanced indexing's backward (index_put_ with accumulate) adds them in an order that depends on the
    threads on CPU, which made two seeded runs at 2 threads part after a few steps."""
    flat = (rows * x.shape[1] + cols).reshape(-1)
    return x.flatten(0, 1).index_select(0, flat).view(*rows.shape, *x.shape[2:])


def attention_weight_of(config) -> float:
    """One query-key pair's cost (~4 flops per hidden unit per layer, scores and values) over one token's dense
    cost (~2 flops per weight, ~12 hidden^2 weights per layer): ~1/(6 hidden)."""
    return 1.0 / (6.0 * float(getattr(config, "hidden_size", 1024)))


# Attention implementations that take an arbitrary 4D mask (flash-attention kernels take none).
MASKABLE_ATTENTION = ("sdpa", "eager")


def pack_shared_prefixes(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    attention_weight: float = 0.0,
    prompt_keys: Optional[Sequence[Hashable]] = None,
) -> Optional[PrefixPack]:
    """Pack rows `[B, P+R]` (prompt left-padded, response right-padded): the rows of one prompt into one
    sequence, and those sequences, padding dropped, into packed rows of at most max(P+R, the longest sequence)
    tokens (first fit, longest first), so a packed row never attends over more than a padded one.

    None when that would not be cheaper: a row has no prompt, or the packed rows' cost (tokens, plus their
    masked attention over the whole packed length) is not below 0.9x the padded batch's.

    attention_weight: the cost of one query-key pair relative to one token through the model's dense layers
    (`attention_weight_of`); 0 counts tokens only.

    prompt_keys: per row, what else its prompt is made of beyond its tokens (its images: equal placeholder tokens
    stand for different pixels); rows share a prompt only where these are equal too."""
    r = response_length
    p = input_ids.shape[1] - r
    ids, mask, pos = input_ids.cpu(), attention_mask.cpu().bool(), position_ids.cpu()
    groups: dict = {}
    for b in range(ids.shape[0]):
        keep = mask[b, :p]
        if not bool(keep.any()):
            return None
        extra = prompt_keys[b] if prompt_keys is not None else None
        key = (tuple(ids[b, :p][keep].tolist()), tuple(pos[b, :p][keep].tolist()), extra)
        groups.setdefault(key, []).append(b)

    resp_len = mask[:, p:].sum(1).tolist()
    items = [_group_sequence(ids, mask, pos, p, members, resp_len) for members in groups.values()]
    width = max(p + r, max(len(it.tokens) for it in items))
    bins: list = []  # [tokens used, item indices]
    for i in sorted(range(len(items)), key=lambda i: -len(items[i].tokens)):
        n = len(items[i].tokens)
        room = next((bn for bn in bins if bn[0] + n <= width), None)
        if room is None:
            bins.append([n, [i]])
        else:
            room[0] += n
            room[1].append(i)
    length = max(bn[0] for bn in bins)
    padded_cost = ids.shape[0] * (p + r) * (1 + attention_weight * (p + r))
    if len(bins) * length * (1 + attention_weight * length) > 0.9 * padded_cost:
        return None

    rows = torch.zeros(ids.shape[0], r, dtype=torch.long)
    cols = torch.zeros(ids.shape[0], r, dtype=torch.long)
    packed = torch.zeros(len(bins), length, dtype=torch.long)
    packed_pos = torch.zeros(len(bins), length, dtype=torch.long)
    source = torch.full(ids.shape, -1, dtype=torch.long)
    seg = torch.full((len(bins), length), -1, dtype=torch.long)  # which sequence piece a token belongs to
    root = torch.full((len(bins), length), -1, dtype=torch.long)  # the prompt piece of its group
    for row, (_, members) in enumerate(bins):
        offset, base = 0, 0
        for i in members:
            it = items[i]
            span = slice(offset, offset + len(it.tokens))
            packed[row, span], packed_pos[row, span] = it.tokens, it.positions
            seg[row, span], root[row, span] = it.pieces + base, base
            prompt_at = row * length + offset + torch.arange(it.prompt_length)
            for b, start, k in it.members:
                rows[b] = row
                source[b, :p][mask[b, :p]] = prompt_at  # (every member's prompt is the group's one prompt)
                source[b, p : p + k] = row * length + offset + start + torch.arange(k)
                cols[b, 0] = offset + it.prompt_length - 1  # the first response token: from the prompt's last
                cols[b, 1 : k + 1] = torch.arange(offset + start, offset + start + k)
            offset += len(it.tokens)
            base += int(it.pieces.max()) + 1
    q_seg, q_root, k_seg = seg[:, :, None], root[:, :, None], seg[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    # A token sees the earlier tokens of its own piece and of its group's prompt, nothing of other groups.
    allowed = causal & (k_seg >= 0) & ((k_seg == q_seg) | (k_seg == q_root))
    # A padding query sees itself only, so its softmax has a key (its output is never read).
    allowed |= torch.eye(length, dtype=torch.bool) & (q_seg < 0)
    valid = torch.arange(r)[None, :] < torch.tensor(resp_len)[:, None]
    device = input_ids.device
    return PrefixPack(
        input_ids=packed.to(device),
        position_ids=packed_pos.to(device),
        allowed=allowed[:, None].to(device),
        rows=rows.to(device),
        cols=cols.to(device),
        valid=valid.to(device),
        source=source.to(device),
    )


@dataclass
class _Sequence:
    """One group as a sequence: its prompt once, then each member's response inputs."""

    tokens: torch.Tensor
    positions: torch.Tensor
    pieces: torch.Tensor  # 0 on the prompt, j + 1 on member j's response
    prompt_length: int
    members: list  # (row, start of its response inputs in the sequence, their count)


def _group_sequence(ids, mask, pos, p: int, members: list, resp_len: list) -> _Sequence:
    keep = mask[members[0], :p]
    plen = int(keep.sum())
    tokens, where, pieces = (
        [ids[members[0], :p][keep]],
        [pos[members[0], :p][keep]],
        [torch.zeros(plen, dtype=torch.long)],
    )
    placed, offset = [], plen
    for j, b in enumerate(members):
        # Response tokens 0..l-2 are inputs (token t is predicted from token t-1; the last predicts nothing).
        k = max(int(resp_len[b]) - 1, 0)
        tokens.append(ids[b, p : p + k])
        where.append(pos[b, p : p + k])
        pieces.append(torch.full((k,), j + 1, dtype=torch.long))
        placed.append((b, offset, k))
        offset += k
    return _Sequence(torch.cat(tokens), torch.cat(where), torch.cat(pieces), plen, placed)
