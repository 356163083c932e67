"""The train and val loaders of an RL run, from the `data` section of its config."""

from __future__ import annotations

import functools
import os
from typing import Any

from verl.config.instantiate import instantiate
from verl.data.loader import DataLoader
from verl.data.preference_dataset import PreferenceDataset, collate_preference
from verl.data.rl_dataset import RLDataset, collate_rl
from verl.data.sampler import ResumableSampler
from verl.data.sft_dataset import SFTDataset, collate_sft_batch


def make_rl_dataset(
    data: Any,
    files: list[str],
    tokenizer: Any,
    cache_dir: str | os.PathLike | None = None,
    tools: Any = None,
    processor: Any = None,
) -> Any:
    """RLDataset over `files`, or the class `data.dataset` names (called with the same arguments; `tools`, the
    agent's tool schemas for the chat template, and `processor`, a vision-language model's, only when given)."""
    kwargs = {
        "prompt_key": data.prompt_key,
        "max_prompt_length": data.max_prompt_length,
        "filter_overlong_prompts": data.filter_overlong_prompts,
        "cache_dir": cache_dir,
        **({"tools": tools} if tools else {}),
        **({"processor": processor} if processor is not None else {}),
    }
    if getattr(data, "dataset", None):
        return instantiate(data.dataset, list(files), tokenizer, key="data.dataset", **kwargs)
    return RLDataset(list(files), tokenizer, **kwargs)


def make_rl_dataloaders(
    data: Any,
    tokenizer: Any,
    *,
    seed: int,
    cache_dir: str | os.PathLike | None = None,
    tools: Any = None,
    processor: Any = None,
) -> tuple[DataLoader, DataLoader | None]:
    """(train loader, val loader or None when data.val_files is empty).

    Train batches have data.train_batch_size prompts (a last partial batch is dropped, so every step sees
    the same number); val batches have data.val_batch_size prompts, or the whole val set when it is None,
    in file order with the last partial batch kept.
    """
    collate = functools.partial(collate_rl, tokenizer=tokenizer, max_prompt_length=data.max_prompt_length)
    train = make_rl_dataset(data, data.train_files, tokenizer, cache_dir, tools, processor)
    train_sampler = ResumableSampler(len(train), batch_size=data.train_batch_size, shuffle=data.shuffle, seed=seed)
    return DataLoader(train, train_sampler, collate), make_val_loader(
        data, tokenizer, seed=seed, cache_dir=cache_dir, tools=tools, processor=processor
    )


def make_val_loader(
    data: Any,
    tokenizer: Any,
    *,
    seed: int,
    cache_dir: str | os.PathLike | None = None,
    tools: Any = None,
    processor: Any = None,
) -> DataLoader | None:
    """The held-out prompts of data.val_files (None when empty), in file order, the last partial batch kept."""
    if not data.val_files:
        return None
    collate = functools.partial(collate_rl, tokenizer=tokenizer, max_prompt_length=data.max_prompt_length)
    val = make_rl_dataset(data, data.val_files, tokenizer, cache_dir, tools, processor)
    val_sampler = ResumableSampler(
        len(val), batch_size=data.val_batch_size or len(val), shuffle=False, seed=seed, drop_last=False
    )
    return DataLoader(val, val_sampler, collate)


def make_sft_loader(
    data: Any,
    files: list[str],
    tokenizer: Any,
    *,
    seed: int,
    batch_size: int | None,
    train: bool,
    cache_dir: str | os.PathLike | None = None,
    processor: Any = None,
) -> DataLoader:
    """SFT examples of `files` (prompt/response or messages) in the engine's layout, up to data.max_prompt_length +
    data.max_response_length tokens each (`processor`: a vision-language model's, for examples with images). train:
    shuffled (data.shuffle), whole batches; else in file order, the last partial batch kept, `batch_size` None for
    all at once."""
    examples = SFTDataset(
        list(files),
        tokenizer,
        max_length=data.max_prompt_length + data.max_response_length,
        prompt_key=data.prompt_key,
        filter_overlong=data.filter_overlong_prompts,
        cache_dir=cache_dir,
        processor=processor,
    )
    sampler = ResumableSampler(
        len(examples),
        batch_size=batch_size or len(examples),
        shuffle=train and data.shuffle,
        seed=seed,
        drop_last=train,
    )
    return DataLoader(examples, sampler, functools.partial(collate_sft_batch, pad_id=tokenizer.pad_token_id))


def make_preference_loader(
    data: Any, tokenizer: Any, *, seed: int, cache_dir: str | os.PathLike | None = None
) -> DataLoader:
    """DPO's train loader: data.train_batch_size (chosen, rejected) pairs of data.train_files per batch."""
    pairs = PreferenceDataset(
        data.train_files,
        tokenizer,
        max_prompt_length=data.max_prompt_length,
        max_response_length=data.max_response_length,
        prompt_key=data.prompt_key,
        filter_overlong=data.filter_overlong_prompts,
        cache_dir=cache_dir,
    )
    sampler = ResumableSampler(len(pairs), batch_size=data.train_batch_size, shuffle=data.shuffle, seed=seed)
    return DataLoader(pairs, sampler, functools.partial(collate_preference, pad_id=tokenizer.pad_token_id))
