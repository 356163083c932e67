"""DataLoader and make_rl_dataloaders: DataProto batches from a config, resumable."""

from __future__ import annotations

import functools

import torch

from tests.support.fixtures import make_cfg
from verl.data import (
    DataLoader,
    ResumableSampler,
    RLDataset,
    collate_rl,
    make_rl_dataloaders,
)


def test_loader_resumes(char_tokenizer, embedded_cache):
    ds = RLDataset(
        ["embedded:arithmetic-val"],
        char_tokenizer,
        max_prompt_length=16,
        cache_dir=embedded_cache,
    )
    collate = functools.partial(collate_rl, tokenizer=char_tokenizer, max_prompt_length=16)

    def make():
        return DataLoader(ds, ResumableSampler(len(ds), batch_size=16, shuffle=True, seed=3), collate)

    loader = make()
    assert len(loader) == 12  # 200 // 16
    expected = [loader.next_batch() for _ in range(30)]  # crosses two epoch boundaries
    assert loader.epoch == 2
    first = make()
    for _ in range(13):
        first.next_batch()
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    for want in expected[13:]:
        got = resumed.next_batch()
        assert torch.equal(got.batch["input_ids"], want.batch["input_ids"])
        assert list(got.non_tensor_batch["index"]) == list(want.non_tensor_batch["index"])


def test_rl_dataloaders_from_config(char_tokenizer, embedded_cache):
    cfg = make_cfg(
        {
            "data": {
                "train_files": ["embedded:arithmetic"],
                "val_files": ["embedded:arithmetic-val"],
                "max_prompt_length": 16,
                "train_batch_size": 16,
            }
        }
    )
    train, val = make_rl_dataloaders(cfg.data, char_tokenizer, seed=1, cache_dir=embedded_cache)
    assert isinstance(train, DataLoader) and len(train) == 20000 // 16
    batch = train.next_batch()
    assert batch.batch["input_ids"].shape[0] == 16
    assert set(batch.non_tensor_batch) == {
        "raw_prompt",
        "ground_truth",
        "data_source",
        "extra_info",
        "index",
        "messages",  # the prompt's conversation, before rendering (what an external agent program is given)
    }
    assert batch.non_tensor_batch["messages"][0] == [
        {"role": "user", "content": batch.non_tensor_batch["raw_prompt"][0]}
    ]
    val_batches = list(val)
    assert len(val_batches) == 1 and len(val_batches[0]) == 200  # val_batch_size None: the whole set
    assert list(val_batches[0].non_tensor_batch["index"]) == list(range(200))  # in file order


def test_no_val_files(char_tokenizer, embedded_cache):
    cfg = make_cfg(
        {
            "data": {
                "train_files": ["embedded:arithmetic-val"],
                "max_prompt_length": 16,
                "train_batch_size": 8,
            }
        }
    )
    train, val = make_rl_dataloaders(cfg.data, char_tokenizer, seed=1, cache_dir=embedded_cache)
    assert val is None and len(train) == 25


def test_dataset_from_config_target(char_tokenizer, embedded_cache):
    # data.dataset names the class to build; it gets the same arguments as RLDataset.
    cfg = make_cfg(
        {
            "data": {
                "train_files": ["embedded:arithmetic-val"],
                "max_prompt_length": 4,
                "train_batch_size": 8,
                "dataset": {"_target_": "verl.data.RLDataset"},
            }
        }
    )
    train, _ = make_rl_dataloaders(cfg.data, char_tokenizer, seed=1, cache_dir=embedded_cache)
    # max_prompt_length=4 reached the dataset: only "a+b=" prompts with one-digit operands remain.
    assert 0 < len(train.dataset) < 200 and train.dataset.n_filtered == 200 - len(train.dataset)
    assert all(len(train.dataset[i]["raw_prompt"]) == 4 for i in range(len(train.dataset)))
