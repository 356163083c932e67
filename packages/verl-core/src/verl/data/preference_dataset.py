"""The preference data set of DPO: parquet rows of prompt, chosen and rejected, as (chosen, rejected) row pairs.

Columns: `prompt` (chat messages, rendered with the chat template and its generation prompt; or a plain str used
as it is), `chosen` and `rejected` (the preferred and the dispreferred reply: a str, or a list holding one
assistant message, TRL's conversational form). Optional `ref_chosen_logps` and `ref_rejected_logps` (floats):
the reference model's summed log-probs of each reply, precomputed, so a run needs no reference model.

A batch is the engine layout (`verl.engine_protocol`) with each pair's two rows adjacent, chosen first: the prompt
left-padded, then the reply and its eos right-padded; prompts of a pair are equal, so shared-prefix packing
computes each prompt once for both replies.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from verl.data.rows import MESSAGES_FORMAT, check_messages, read_columns, render_prompts, warn_dropped
from verl.data.sources import resolve_data_files
from verl.protocol import DataProto
from verl.rollout_batch import pad_rows, rollout_tensors

REPLY_FORMAT = "a str (the reply), or a list with one assistant message like [{'role': 'assistant', 'content': '19'}]"
REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")


class PreferenceDataset:
    """Tokenised (prompt, chosen, rejected) triples; pairs whose prompt or a reply is too long are dropped and
    counted (`n_filtered`), or, with `filter_overlong=False`, an error naming the row."""

    def __init__(
        self,
        files: Sequence[str],
        tokenizer: Any,
        *,
        max_prompt_length: int,
        max_response_length: int,
        prompt_key: str = "prompt",
        filter_overlong: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; each reply ends with one")
        self.max_prompt_length, self.max_response_length = max_prompt_length, max_response_length
        self.files = resolve_data_files(files, cache_dir)
        if not self.files:
            raise ValueError("PreferenceDataset needs at least one data file; got an empty list")
        self.rows: list[dict[str, Any]] = []
        self.n_filtered = 0
        self.has_ref: bool | None = None  # whether the rows carry the reference's log-probs (all files or none)
        for path in self.files:
            self._load(path, tokenizer, prompt_key, filter_overlong)
        if not self.rows:
            raise ValueError(
                f"no pairs left in {self.files}: every prompt is over max_prompt_length={max_prompt_length} or a "
                f"reply over max_response_length={max_response_length} tokens"
            )

    def _load(self, path: str, tokenizer: Any, prompt_key: str, filter_overlong: bool) -> None:
        required = {
            prompt_key: f"{MESSAGES_FORMAT}, or a str",
            "chosen": REPLY_FORMAT,
            "rejected": REPLY_FORMAT,
        }
        columns = read_columns(path, required, optional=REF_COLUMNS)
        has_ref = all(c in columns for c in REF_COLUMNS)
        if any(c in columns for c in REF_COLUMNS) and not has_ref:
            missing = [c for c in REF_COLUMNS if c not in columns]
            raise ValueError(f"{path}: has {[c for c in REF_COLUMNS if c in columns]} but not {missing}: give both")
        if self.has_ref is not None and has_ref != self.has_ref:
            raise ValueError(
                f"{path}: {'has' if has_ref else 'lacks'} the columns {list(REF_COLUMNS)} and {self.files[0]} "
                f"{'lacks' if has_ref else 'has'} them: precompute them for every file or for none"
            )
        self.has_ref = has_ref
        n = len(columns[prompt_key])
        texts = [_prompt_text(v, tokenizer, path, i, prompt_key) for i, v in enumerate(columns[prompt_key])]
        prompts = tokenizer(texts, add_special_tokens=False)["input_ids"] if n else []
        replies = {}
        for side in ("chosen", "rejected"):
            text = [_reply_text(v, path, i, side) for i, v in enumerate(columns[side])]
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] if n else []
            replies[side] = [r + [tokenizer.eos_token_id] for r in ids]
        dropped = 0
        for i in range(n):
            too_long = _too_long(len(prompts[i]), self.max_prompt_length, "prompt", "data.max_prompt_length") or next(
                (
                    _too_long(len(replies[s][i]), self.max_response_length, f"{s} reply", "data.max_response_length")
                    for s in ("chosen", "rejected")
                    if len(replies[s][i]) > self.max_response_length
                ),
                None,
            )
            if not prompts[i]:
                raise ValueError(f"{path}: row {i}: the prompt renders to no tokens: {texts[i]!r}")
            if too_long:
                if not filter_overlong:
                    raise ValueError(f"{path}: row {i}: {too_long}, or set data.filter_overlong_prompts=true")
                dropped += 1
                continue
            row = {"prompt": prompts[i], "chosen": replies["chosen"][i], "rejected": replies["rejected"][i]}
            if has_ref:
                row["ref"] = [_number(columns[c][i], path, i, c) for c in REF_COLUMNS]
            self.rows.append(row)
        self.n_filtered += dropped
        warn_dropped(path, dropped, n, "pairs with a prompt or a reply over their length limit in")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {**self.rows[index], "index": index}


def _prompt_text(value: Any, tokenizer: Any, path: str, row: int, column: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{path}: row {row}: column {column!r} must be a str or {MESSAGES_FORMAT}, got {value!r:.120}")
    return render_prompts(tokenizer, [check_messages(value, path, row, column)])[0]


def _reply_text(value: Any, path: str, row: int, column: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 1:
        (message,) = check_messages(value, path, row, column)
        if message["role"] == "assistant":
            return message["content"]
    raise ValueError(f"{path}: row {row}: column {column!r} must be {REPLY_FORMAT}, got {value!r:.120}")


def _number(value: Any, path: str, row: int, column: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise ValueError(
            f"{path}: row {row}: column {column!r} must be a finite number (a summed log-prob), got {value!r}"
        )
    return float(value)


def _too_long(n: int, limit: int, what: str, key: str) -> str | None:
    return f"the {what} has {n} tokens, more than {key}={limit}" if n > limit else None


def collate_preference(items: Sequence[dict[str, Any]], pad_id: int) -> DataProto:
    """2 x len(items) rows in the engine's layout, each pair's chosen row then its rejected row. Prompts are
    left-padded to the longest prompt, replies right-padded to the longest reply. Tensors also hold `is_chosen`
    [2B] (1, 0, 1, 0, ...) and, when the data has them, `ref_seq_log_probs` [2B]."""
    if not items:
        raise ValueError("collate_preference needs at least one item")
    prompts = [torch.tensor(item["prompt"], dtype=torch.long) for item in items for _ in range(2)]
    replies = [item[side] for item in items for side in ("chosen", "rejected")]
    ids = pad_sequence(prompts, batch_first=True, padding_value=pad_id, padding_side="left")
    mask = pad_sequence([torch.ones_like(p) for p in prompts], batch_first=True, padding_side="left")
    prompt_batch = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )
    width = max(len(r) for r in replies)
    responses = pad_rows(replies, width, pad_id, torch.long)
    response_mask = pad_rows([[1] * len(r) for r in replies], width, 0, torch.long)
    tensors = rollout_tensors(prompt_batch, responses, response_mask, torch.zeros(responses.shape), response_mask)
    del tensors["rollout_log_probs"]  # (not sampled: nothing to compare the trainer's log-probs with)
    tensors["is_chosen"] = torch.tensor([1, 0] * len(items), dtype=torch.long)
    if "ref" in items[0]:
        tensors["ref_seq_log_probs"] = torch.tensor([v for item in items for v in item["ref"]], dtype=torch.float64)
    return DataProto.from_dict(tensors, {"index": [item["index"] for item in items for _ in range(2)]})
