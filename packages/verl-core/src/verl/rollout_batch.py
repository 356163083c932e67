"""The batch every rollout engine returns, built from what it generated (shared by hf, vllm and sglang, and by
the rollout service, which builds it from finished requests)."""

from __future__ import annotations

from typing import Sequence

import torch

from verl.protocol import DataProto


def left_padded(rows: Sequence[Sequence[int]], pad_id: int) -> DataProto:
    """Prompt rows of any lengths as a generate call's input: input_ids / attention_mask / position_ids, left-padded
    to the longest, positions counting real tokens."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
        mask[i, width - len(row) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def response_mask_until_eos(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 on every token up to and including the first eos of each row, 0 after it."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids, device=responses.device))
    # Tokens strictly after the first eos have at least one eos before them.
    eos_before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()
    return (eos_before == 0).to(torch.long)


def unpadded_prompts(prompts: DataProto) -> list[list[int]]:
    """Each row's prompt token ids without its left padding (what a serving engine takes)."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    return [row[keep].tolist() for row, keep in zip(ids, mask)]


def pad_rows(rows: Sequence[Sequence[float]], width: int, value: float, dtype: torch.dtype) -> torch.Tensor:
    """Right-pad variable-length rows into a [len(rows), width] tensor."""
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"row {i} has {len(row)} tokens, more than the response width {width}")
        out[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out


def assemble_rollout(
    prompts: DataProto,
    responses: torch.Tensor,
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    *,
    eos_ids: list[int],
) -> DataProto:
    """The rollout batch of `RolloutEngine.generate` from one generated row per prompt row.

    prompts: already repeated n times (samples of one prompt adjacent). responses/log_probs: [B, R] with
    R = max_new_tokens (fixed, so batches from different ranks concatenate); lengths [B]: tokens generated
    per row (the rest is padding). The response mask ends at the first eos, which it includes.
    """
    width = responses.shape[1]
    generated = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    response_mask = response_mask_until_eos(responses, eos_ids) * generated.long()
    tensors = rollout_tensors(prompts, responses, response_mask, log_probs.float() * response_mask, response_mask)
    return DataProto.from_dict(tensors, dict(prompts.non_tensor_batch), dict(prompts.meta_info))


def rollout_tensors(
    prompts: DataProto,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    log_probs: torch.Tensor,
    response_attention: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The rollout batch's tensors: the left-padded prompts, then the responses. `response_attention` marks the
    real response tokens (the response mask, or with agent trajectories also the inserted tokens it leaves out)."""
    ids, mask, pos = (prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    return {
        "prompts": ids,
        "responses": responses,
        "response_mask": response_mask,
        "rollout_log_probs": log_probs,
        "input_ids": torch.cat([ids, responses], 1),
        "attention_mask": torch.cat([mask, response_attention], 1),
        "position_ids": torch.cat([pos, pos[:, -1:] + torch.arange(1, responses.shape[1] + 1)], 1),
    }
