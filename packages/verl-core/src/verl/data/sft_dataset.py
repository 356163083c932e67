"""The SFT data set: parquet rows of prompt (chat messages) and response (str), for a warm start.

An example is the chat-templated prompt, then the response, then <eos>; the loss covers the response
and the <eos>, so the model learns both the answer and where to stop.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from verl.data.rows import MESSAGES_FORMAT, check_messages, read_columns, render_prompts, warn_dropped
from verl.embedded.arithmetic import resolve_data_files


class SFTDataset:
    """Tokenised prompt + response examples; those over `max_length` tokens are dropped and counted."""

    def __init__(
        self,
        files: Sequence[str],
        tokenizer: Any,
        *,
        max_length: int,
        prompt_key: str = "prompt",
        response_key: str = "response",
        filter_overlong: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 (a prompt token and <eos>), got {max_length}")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; SFT examples end with one")
        self.max_length = max_length
        self.files = resolve_data_files(files, cache_dir)
        if not self.files:
            raise ValueError("SFTDataset needs at least one data file; got an empty list")
        self.examples: list[tuple[list[int], int]] = []  # (token ids, number of prompt tokens)
        self.n_filtered = 0
        for path in self.files:
            self._load(path, tokenizer, prompt_key, response_key, filter_overlong)
        if not self.examples:
            raise ValueError(f"no examples left in {self.files}: all are longer than max_length={max_length} tokens")

    def _load(self, path: str, tokenizer: Any, prompt_key: str, response_key: str, filter_overlong: bool) -> None:
        required = {prompt_key: MESSAGES_FORMAT, response_key: "a str: the assistant's reply to learn"}
        columns = read_columns(path, required)
        conversations = [check_messages(v, path, i, prompt_key) for i, v in enumerate(columns[prompt_key])]
        responses = columns[response_key]
        for i, response in enumerate(responses):
            if not isinstance(response, str):
                raise ValueError(f"{path}: row {i}: column {response_key!r} must be a str, got {response!r}")
        texts = render_prompts(tokenizer, conversations)
        prompt_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        response_ids = tokenizer(responses, add_special_tokens=False)["input_ids"] if responses else []
        n_dropped = 0
        for i, (prompt, response) in enumerate(zip(prompt_ids, response_ids)):
            ids = prompt + response + [tokenizer.eos_token_id]
            if len(ids) > self.max_length:
                if not filter_overlong:
                    raise ValueError(
                        f"{path}: row {i}: example has {len(ids)} tokens, more than max_length={self.max_length}"
                    )
                n_dropped += 1
                continue
            self.examples.append((ids, len(prompt)))
        self.n_filtered += n_dropped
        warn_dropped(path, n_dropped, len(responses), f"examples longer than max_length={self.max_length}")

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """input_ids (prompt + response + eos) and loss_mask (1 on the response and eos tokens)."""
        ids, n_prompt = self.examples[index]
        loss_mask = torch.zeros(len(ids), dtype=torch.long)
        loss_mask[n_prompt:] = 1
        return {"input_ids": torch.tensor(ids, dtype=torch.long), "loss_mask": loss_mask}


def collate_sft(items: Sequence[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest example: input_ids, attention_mask, position_ids, loss_mask [B, L].

    loss_mask[b, t] = 1 marks input_ids[b, t] as a token to learn; a causal LM predicts it from the
    logits at t - 1, so the loss uses logits[:, :-1] against input_ids[:, 1:] masked by loss_mask[:, 1:].
    """
    if not items:
        raise ValueError("collate_sft needs at least one item")
    ids = [item["input_ids"] for item in items]
    input_ids = pad_sequence(ids, batch_first=True, padding_value=pad_id)
    attention_mask = pad_sequence([torch.ones_like(t) for t in ids], batch_first=True)
    loss_mask = pad_sequence([item["loss_mask"] for item in items], batch_first=True)
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    return dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, loss_mask=loss_mask)
