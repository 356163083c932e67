"""SFTDataset and collate_sft: prompt + response + <eos>, loss on the response and <eos> only."""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from verl.data.sft_dataset import SFTDataset, collate_sft


def write(tmp_path, rows) -> str:
    path = str(tmp_path / "sft.parquet")
    pd.DataFrame(rows).to_parquet(path)
    return path


def sft_row(prompt: str, response: str) -> dict:
    return {"prompt": [{"role": "user", "content": prompt}], "response": response}


@pytest.fixture
def two_rows(tmp_path):
    return write(tmp_path, [sft_row("1+1=", "2"), sft_row("12+7=", "19")])


def test_items_by_hand(two_rows, char_tokenizer):
    ds = SFTDataset([two_rows], char_tokenizer, max_length=16)
    # "1+1=" -> 5 14 5 18, "2" -> 6, <eos> -> 2; the loss covers "2" and <eos>.
    assert ds[0]["input_ids"].tolist() == [5, 14, 5, 18, 6, 2]
    assert ds[0]["loss_mask"].tolist() == [0, 0, 0, 0, 1, 1]
    # "12+7=" -> 5 6 14 11 18, "19" -> 5 13, <eos> -> 2.
    assert ds[1]["input_ids"].tolist() == [5, 6, 14, 11, 18, 5, 13, 2]
    assert ds[1]["loss_mask"].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]


def test_collate_right_pads(two_rows, char_tokenizer):
    ds = SFTDataset([two_rows], char_tokenizer, max_length=16)
    batch = collate_sft([ds[0], ds[1]], pad_id=char_tokenizer.pad_token_id)
    assert batch["input_ids"].tolist() == [
        [5, 14, 5, 18, 6, 2, 0, 0],
        [5, 6, 14, 11, 18, 5, 13, 2],
    ]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 0, 0], [1] * 8]
    assert batch["loss_mask"].tolist() == [
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 1, 1],
    ]
    # cumsum(mask) - 1 = [0 1 2 3 4 5 5 5]: real tokens count up from 0, padding repeats the last (it is masked).
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 5, 5], list(range(8))]


def test_overlong_examples_are_dropped_and_counted(two_rows, char_tokenizer, caplog):
    with caplog.at_level(logging.WARNING):
        ds = SFTDataset([two_rows], char_tokenizer, max_length=7)  # the second example has 8 tokens
    assert (len(ds), ds.n_filtered) == (1, 1)
    assert f"{two_rows}: dropped 1 of 2 examples longer than max_length=7" in caplog.text
    with pytest.raises(ValueError, match="row 1: example has 8 tokens, more than max_length=7"):
        SFTDataset([two_rows], char_tokenizer, max_length=7, filter_overlong=False)


def test_bad_rows(tmp_path, char_tokenizer):
    path = write(
        tmp_path,
        [
            sft_row("1+1=", "2"),
            {"prompt": [{"role": "user", "content": "2+2="}], "response": None},
        ],
    )
    with pytest.raises(ValueError, match=rf"{path}: row 1: column 'response' must be a str"):
        SFTDataset([path], char_tokenizer, max_length=16)
    path = write(tmp_path, [{"question": [{"role": "user", "content": "1+1="}], "response": "2"}])
    with pytest.raises(ValueError, match=rf"{path}: missing column 'prompt'"):
        SFTDataset([path], char_tokenizer, max_length=16)
    assert len(SFTDataset([path], char_tokenizer, max_length=16, prompt_key="question")) == 1


def test_embedded_sft_data(char_tokenizer, embedded_cache):
    ds = SFTDataset(
        ["embedded:arithmetic-sft"],
        char_tokenizer,
        max_length=16,
        cache_dir=embedded_cache,
    )
    assert (len(ds), ds.n_filtered) == (20000, 0)
    item = ds[0]
    text = char_tokenizer.decode(item["input_ids"])
    prompt, answer = text.removesuffix("<eos>").split("=")
    a, b = map(int, prompt.split("+"))
    assert int(answer) == a + b
    assert int(item["loss_mask"].sum()) == len(answer) + 1
