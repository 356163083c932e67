"""The SFT data set: parquet rows of prompt (chat messages) and response (str), or of whole conversations.

An example is the chat-templated prompt, then the response, then <eos>; the loss covers the response
and the <eos>, so the model learns both the answer and where to stop. A file with a `messages` column (and no
response column) holds multi-turn conversations (user, assistant, tool, ... messages, e.g. tool-use traces):
the loss covers every assistant turn through its <eos>; tool results and user turns are context. Prompt/response
rows may have an `images` column (a vision-language model's processor reads them: verl.data.vision).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, List, cast

import pyarrow.parquet as pq
import torch
from torch.nn.utils.rnn import pad_sequence

from verl.data.rows import MESSAGES_FORMAT, check_messages, read_columns, render_prompts, warn_dropped
from verl.data.sources import resolve_data_files
from verl.data.vision import VisionProcessor, image_prompt, row_images
from verl.protocol import DataProto


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
        processor: VisionProcessor | None = None,
    ) -> None:
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2 (a prompt token and <eos>), got {max_length}")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; SFT examples end with one")
        self.max_length, self.processor = max_length, processor
        self.files = resolve_data_files(files, cache_dir)
        if not self.files:
            raise ValueError("SFTDataset needs at least one data file; got an empty list")
        self.examples: list[tuple[list[int], list[int]]] = []  # (token ids, loss mask)
        self.images: dict[int, tuple[Any, str, int]] = {}  # example -> (its images as stored, file, row)
        self.n_filtered = 0
        for path in self.files:
            self._load(path, tokenizer, prompt_key, response_key, filter_overlong)
        if not self.examples:
            raise ValueError(f"no examples left in {self.files}: all are longer than max_length={max_length} tokens")

    def _load(self, path: str, tokenizer: Any, prompt_key: str, response_key: str, filter_overlong: bool) -> None:
        names = pq.read_schema(path).names if os.path.isfile(path) else []
        if response_key not in names and "messages" in names:
            examples = self._conversations(path, tokenizer)
        else:
            examples = self._pairs(path, tokenizer, prompt_key, response_key)
        n_dropped = 0
        for i, (ids, mask, images) in enumerate(examples):
            if len(ids) > self.max_length:
                if not filter_overlong:
                    raise ValueError(
                        f"{path}: row {i}: example has {len(ids)} tokens, more than max_length={self.max_length}"
                    )
                n_dropped += 1
                continue
            if images:
                self.images[len(self.examples)] = (images, path, i)
            self.examples.append((ids, mask))
        self.n_filtered += n_dropped
        warn_dropped(path, n_dropped, len(examples), f"examples longer than max_length={self.max_length}")

    def _pairs(self, path: str, tokenizer: Any, prompt_key: str, response_key: str) -> list[tuple[list, list, Any]]:
        """prompt (messages) + response (str) + eos, and the row's images; the loss covers the response and the
        eos."""
        required = {prompt_key: MESSAGES_FORMAT, response_key: "a str: the assistant's reply to learn"}
        columns = read_columns(path, required, optional=("images",))
        conversations = [check_messages(v, path, i, prompt_key) for i, v in enumerate(columns[prompt_key])]
        responses = columns[response_key]
        for i, response in enumerate(responses):
            if not isinstance(response, str):
                raise ValueError(f"{path}: row {i}: column {response_key!r} must be a str, got {response!r}")
        images = columns.get("images") or [None] * len(responses)
        if any(images):  # (each image's pad widened to its patches; the pixels are made when a row is drawn)
            prompt_ids = [
                image_prompt(self.processor, tokenizer, c, v, path, i)[1]
                for i, (c, v) in enumerate(zip(conversations, images))
            ]
        else:
            texts = render_prompts(tokenizer, conversations)
            prompt_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        response_ids = tokenizer(responses, add_special_tokens=False)["input_ids"] if responses else []
        return [
            (prompt + response + [tokenizer.eos_token_id], [0] * len(prompt) + [1] * (len(response) + 1), pictures)
            for prompt, response, pictures in zip(prompt_ids, response_ids, images)
        ]

    def _conversations(self, path: str, tokenizer: Any) -> list[tuple[list, list, Any]]:
        """Whole conversations (a `messages` column: user, assistant, tool, ... turns); the loss covers each
        assistant turn through its eos, as the model produced it in a multi-turn rollout."""
        columns = read_columns(path, {"messages": MESSAGES_FORMAT})
        return [
            (*conversation_ids(tokenizer, check_messages(v, path, i, "messages"), where=f"{path}: row {i}"), None)
            for i, v in enumerate(columns["messages"])
        ]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """input_ids and loss_mask (1 on the tokens to learn: the response(s) and their eos); an example with images
        also its multi_modal_inputs (pixel_values, image_grid_thw)."""
        ids, mask = self.examples[index]
        item: dict[str, Any] = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "loss_mask": torch.tensor(mask, dtype=torch.long),
        }
        if index in self.images:
            assert self.processor is not None  # (examples with images are read only with one)
            value, path, row = self.images[index]
            item["multi_modal_inputs"] = self.processor.pixels(row_images(value, path, row))
        return item


def conversation_ids(tokenizer: Any, messages: list[dict[str, str]], *, where: str = "") -> tuple[list, list]:
    """Token ids of a conversation as the chat template renders it, message by message, and the loss mask: 1 on
    each assistant message's tokens up to and including its eos (what follows the eos, and every other message,
    is context). Each prefix of the conversation must render as a prefix of the whole."""
    eos, ids, mask = tokenizer.eos_token_id, cast(List[int], []), cast(List[int], [])
    for k, message in enumerate(messages):
        before_assistant = k + 1 < len(messages) and messages[k + 1]["role"] == "assistant"
        text = tokenizer.apply_chat_template(messages[: k + 1], add_generation_prompt=before_assistant, tokenize=False)
        full = tokenizer(text, add_special_tokens=False)["input_ids"]
        if full[: len(ids)] != ids:
            raise ValueError(
                f"{where}: the chat template renders messages 0..{k - 1} differently once message {k} "
                f"({message['role']}) follows, so the turns cannot be told apart"
            )
        new = full[len(ids) :]
        train = [0] * len(new)
        if message["role"] == "assistant":
            end = new.index(eos) + 1 if eos in new else len(new)
            train = [1] * end + [0] * (len(new) - end)
        ids, mask = full, mask + train
    return ids, mask


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


def collate_sft_batch(items: Sequence[dict[str, Any]], pad_id: int) -> DataProto:
    """`collate_sft` in the engine's layout (`verl.engine_protocol`): every token after the first is a 'response' token,
    predicted from the logits before it, and counted where the loss mask says so (`response_mask`); examples with
    images carry them in the non-tensor multi_modal_inputs (an empty dict for a text example)."""
    batch = collate_sft(items, pad_id)
    images = (
        {"multi_modal_inputs": [item.get("multi_modal_inputs", {}) for item in items]}
        if any("multi_modal_inputs" in item for item in items)
        else {}
    )
    return DataProto.from_dict(
        {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "position_ids": batch["position_ids"],
            "responses": batch["input_ids"][:, 1:],
            "response_mask": batch["loss_mask"][:, 1:],
        },
        images,
    )
