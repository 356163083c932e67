"""The RL prompt data set: parquet files in verl's RL format, tokenised once with the chat template.

Expected columns: data_source (str), prompt (chat messages), reward_model ({"ground_truth": ...}, usually
{"style": "rule", ...}) and optionally extra_info (dict) and images (a list of images per row, each `<image>` in
the prompt marking where one goes: see verl.data.vision); other columns such as ability are ignored.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from verl.data.prompt_cache import cached_prompts
from verl.data.rows import MESSAGES_FORMAT, check_messages, read_columns, render_prompts, warn_dropped
from verl.data.sample_tools import row_tool_kwargs, row_tools
from verl.data.sources import resolve_data_files
from verl.data.vision import VisionProcessor, image_prompt, row_images
from verl.embedded.cache import settings_hash
from verl.protocol import DataProto

REQUIRED_COLUMNS = {
    "data_source": "a str naming the task (it selects the reward function)",
    "reward_model": "a dict like {'style': 'rule', 'ground_truth': '19'}",
}
RL_FORMAT = "verl's RL format (columns data_source, prompt, ability, reward_model, extra_info)"


class RLDataset:
    """Prompts ready for rollout; prompts over `max_prompt_length` tokens are dropped and counted.

    Files may be parquet paths or "embedded:NAME" data sets (see `verl.embedded.arithmetic`). With
    `filter_overlong_prompts=False` an overlong prompt is an error instead. `n_filtered` counts the
    dropped prompts over all files.
    """

    def __init__(
        self,
        files: Sequence[str],
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        max_prompt_length: int,
        filter_overlong_prompts: bool = True,
        cache_dir: str | os.PathLike | None = None,
        tools: list[dict[str, Any]] | None = None,
        processor: VisionProcessor | None = None,
    ) -> None:
        """tools: the agent's tools (JSON schemas), rendered into every prompt by the chat template (a row's
        extra_info.tools may name a subset; see verl.data.sample_tools). processor: a vision-language model's
        (verl.data.vision.load_vision_processor), needed by files with an `images` column."""
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
        self.max_prompt_length = max_prompt_length
        self.cache_dir, self.tools, self.processor = cache_dir, tools or None, processor
        self.files = resolve_data_files(files, cache_dir)
        if not self.files:
            raise ValueError("RLDataset needs at least one data file; got an empty list")
        self.rows: list[dict[str, Any]] = []  # input_ids (a list), raw_prompt, ground_truth, data_source, extra_info
        self.n_filtered = 0
        for path in self.files:
            self._load(path, tokenizer, prompt_key, filter_overlong_prompts)
        if not self.rows:
            raise ValueError(
                f"no prompts left in {self.files}: all are longer than max_prompt_length={max_prompt_length} tokens"
            )

    def _load(self, path: str, tokenizer: Any, prompt_key: str, filter_overlong: bool) -> None:
        required = {prompt_key: f"{MESSAGES_FORMAT} in {RL_FORMAT}", **REQUIRED_COLUMNS}
        columns = read_columns(path, required, optional=("extra_info", "images"))
        n_rows = len(columns[prompt_key])
        conversations = [check_messages(v, path, i, prompt_key) for i, v in enumerate(columns[prompt_key])]
        images = columns.get("images") or [None] * n_rows
        extra_infos = [dict(e or {}) for e in columns.get("extra_info") or [None] * n_rows]
        names = [t["function"]["name"] for t in self.tools or []]
        for i, extra in enumerate(extra_infos):  # per-sample tools, checked and normalised (verl.data.sample_tools)
            if self.tools is not None and "tools" in extra:
                extra["tools"] = row_tools(extra, names, path, i)
            if self.tools is not None and "tools_kwargs" in extra:
                extra["tools_kwargs"] = row_tool_kwargs(extra, names, path, i)

        def tokenise() -> tuple[list[str], list[list[int]]]:
            texts = [""] * n_rows
            subsets: dict[Any, list[int]] = {}  # rows by the tools their prompt shows (None: all)
            for i, extra in enumerate(extra_infos):
                subsets.setdefault(None if extra.get("tools") is None else tuple(extra["tools"]), []).append(i)
            for subset, rows in subsets.items():
                tools = self.tools if subset is None else [t for t in self.tools if t["function"]["name"] in subset]
                for i, text in zip(rows, render_prompts(tokenizer, [conversations[i] for i in rows], tools or None)):
                    texts[i] = text
            return texts, (tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])

        if any(images):
            texts, ids, conversations = self._image_prompts(path, tokenizer, conversations, images)
        else:
            key = prompt_key if self.tools is None else f"{prompt_key}+tools-{settings_hash(self.tools)}"
            texts, ids = cached_prompts(path, tokenizer, key, tokenise, self.cache_dir)
        n_dropped = 0
        for i in range(n_rows):
            truth = _ground_truth(columns["reward_model"][i], path, i)
            data_source = columns["data_source"][i]
            if not isinstance(data_source, str):
                raise ValueError(f"{path}: row {i}: column 'data_source' must be a str, got {data_source!r}")
            if len(ids[i]) == 0:
                raise ValueError(f"{path}: row {i}: the prompt renders to no tokens: {texts[i]!r}")
            if len(ids[i]) > self.max_prompt_length:
                if not filter_overlong:
                    raise ValueError(
                        f"{path}: row {i}: prompt has {len(ids[i])} tokens, more than "
                        f"max_prompt_length={self.max_prompt_length}; raise data.max_prompt_length or set "
                        "data.filter_overlong_prompts=true to drop such prompts"
                    )
                n_dropped += 1
                continue
            row = {"input_ids": ids[i], "raw_prompt": texts[i], "ground_truth": truth, "data_source": data_source}
            if images[i]:  # (kept encoded: decoded and processed when the row is drawn)
                row.update(images=images[i], source=(path, i))
            self.rows.append({**row, "extra_info": extra_infos[i], "messages": conversations[i]})
        self.n_filtered += n_dropped
        warn_dropped(path, n_dropped, n_rows, f"prompts longer than max_prompt_length={self.max_prompt_length}")

    def _image_prompts(
        self, path: str, tokenizer: Any, conversations: list, images: list
    ) -> tuple[list[str], list[list[int]], list]:
        """Texts, token ids and conversations with image parts of a file with images (verl.data.vision)."""
        rows = [
            image_prompt(self.processor, tokenizer, c, v, path, i, self.tools)
            for i, (c, v) in enumerate(zip(conversations, images))
        ]
        return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """One prompt; `index` is its position in this data set (extra_info keeps the file's own index)."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for an RLDataset of {len(self)} prompts")
        index = index % len(self)
        row = self.rows[index]
        item = {**row, "input_ids": torch.tensor(row["input_ids"], dtype=torch.long), "index": index}
        if "images" in row:
            assert self.processor is not None  # (rows with images are read only with one)
            path, i = row["source"]
            item["multi_modal_inputs"] = self.processor.pixels(row_images(row["images"], path, i))
        return item


def _ground_truth(reward_model: Any, path: str, row: int) -> Any:
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise ValueError(
            f"{path}: row {row}: column 'reward_model' must be {REQUIRED_COLUMNS['reward_model']}, got {reward_model!r}"
        )
    return reward_model["ground_truth"]


def collate_rl(items: Sequence[dict[str, Any]], tokenizer: Any, max_prompt_length: int) -> DataProto:
    """Left-pad prompts to the longest in the batch (not to max_prompt_length: shorter batches, same results).

    Tensors: input_ids, attention_mask, position_ids [B, P] (positions count real tokens only, so a prompt's
    first real token has position 0 whatever its padding). Non-tensors: raw_prompt, ground_truth,
    data_source, extra_info, index, messages (the prompt's conversation; object arrays), and with image prompts
    multi_modal_inputs (per row its images' pixel_values and image_grid_thw; an empty dict for a row without).
    """
    if not items:
        raise ValueError("collate_rl needs at least one item")
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token (e.g. to its eos token)")
    width = max(len(item["input_ids"]) for item in items)
    if width > max_prompt_length:
        raise ValueError(f"a prompt has {width} tokens, more than max_prompt_length={max_prompt_length}")
    ids = [torch.as_tensor(item["input_ids"], dtype=torch.long) for item in items]
    input_ids = pad_sequence(ids, batch_first=True, padding_value=pad_id, padding_side="left")
    attention_mask = pad_sequence([torch.ones_like(t) for t in ids], batch_first=True, padding_side="left")
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    keys = ("raw_prompt", "ground_truth", "data_source", "extra_info", "index")
    non_tensors = {key: [item[key] for item in items] for key in keys}  # lists become object arrays
    if all("messages" in item for item in items):
        non_tensors["messages"] = [item["messages"] for item in items]
    if any("multi_modal_inputs" in item for item in items):
        non_tensors["multi_modal_inputs"] = [item.get("multi_modal_inputs", {}) for item in items]
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors=non_tensors,
    )
