"""Reading parquet data files and checking their rows, with errors that name the file, row and column."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import pyarrow.parquet as pq

from verl.embedded.cache import PREFIX
from verl.embedded.data_sets import EMBEDDED_DATASETS

logger = logging.getLogger(__name__)

MESSAGES_FORMAT = "a non-empty list of chat messages like [{'role': 'user', 'content': '12+7='}]"


def read_columns(path: str, required: Mapping[str, str], optional: tuple[str, ...] = ()) -> dict[str, list[Any]]:
    """Column name -> values (plain Python objects) of `path`; `required` maps a column to its expected format."""
    if not os.path.isfile(path):
        embedded = ", ".join(PREFIX + name for name in sorted(EMBEDDED_DATASETS))
        raise FileNotFoundError(f"data file {path!r} does not exist; data files are parquet paths or one of {embedded}")
    columns = pq.read_schema(path).names
    for name, expected in required.items():
        if name not in columns:
            raise ValueError(f"{path}: missing column {name!r}, expected {expected}; the file has columns {columns}")
    if "images" in columns and "images" not in optional:  # (not dropped in silence: the rows would lose them)
        raise ValueError(
            f"{path}: column 'images' holds images, and this data set reads text only (images are read from RL "
            "prompt data: data.train_files and data.val_files of a GRPO or PPO run); drop the column to train on "
            "the text alone"
        )
    wanted = list(required) + [c for c in optional if c in columns and c not in required]
    table = pq.read_table(path, columns=wanted)
    return {name: table.column(name).to_pylist() for name in wanted}


def check_messages(value: Any, path: str, row: int, column: str) -> list[dict[str, str]]:
    """`value` as a list of {role, content} messages, or an error naming the file, row and column."""
    ok = (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        )
    )
    if not ok:
        raise ValueError(f"{path}: row {row}: column {column!r} must be {MESSAGES_FORMAT}, got {_short(value)}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def render_prompts(tokenizer: Any, conversations: list[list[dict[str, str]]], tools: Any = None) -> list[str]:
    """The prompt text of each conversation: the tokenizer's chat template with the generation prompt (and the
    tools' schemas, when given)."""
    if not conversations:
        return []
    return tokenizer.apply_chat_template(conversations, tools=tools, add_generation_prompt=True, tokenize=False)


def warn_dropped(path: str, dropped: int, total: int, what: str) -> None:
    """One warning per file for the rows dropped as too long; `what` names them and the limit."""
    if dropped:
        logger.warning("%s: dropped %d of %d %s tokens", path, dropped, total, what)


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
