"""PreferenceDataset and collate_preference: (chosen, rejected) row pairs in the engine layout, errors by row."""

from __future__ import annotations

import logging

import pandas as pd
import pytest
import torch

from verl.data.preference_dataset import PreferenceDataset, collate_preference
from verl.embedded.arithmetic import make_preference_rows


def write(tmp_path, rows, name="pairs.parquet") -> str:
    path = str(tmp_path / name)
    pd.DataFrame(rows).to_parquet(path)
    return path


def pair(prompt, chosen, rejected, **extra) -> dict:
    return {"prompt": [{"role": "user", "content": prompt}], "chosen": chosen, "rejected": rejected, **extra}


def dataset(path, tokenizer, **kw) -> PreferenceDataset:
    return PreferenceDataset([path], tokenizer, **{"max_prompt_length": 16, "max_response_length": 8, **kw})


def test_rows_by_hand_and_the_collated_layout(tmp_path, char_tokenizer):
    # "1+1=" -> 5 14 5 18; "12+7=" -> 5 6 14 11 18; "2" -> 6, "3" -> 7, "19" -> 5 13, "20" -> 6 4; eos 2, pad 0.
    plain = write(tmp_path, [pair("1+1=", "2", "3")], "plain.parquet")
    # TRL's conversational form: a reply is a list with one assistant message
    chat = write(tmp_path, [pair("12+7=", *[[{"role": "assistant", "content": t}] for t in ("19", "20")])])
    ds = PreferenceDataset([plain, chat], char_tokenizer, max_prompt_length=16, max_response_length=8)
    assert ds[0]["prompt"] == [5, 14, 5, 18] and ds[0]["chosen"] == [6, 2] and ds[0]["rejected"] == [7, 2]
    assert ds[1]["chosen"] == [5, 13, 2] and ds[1]["rejected"] == [6, 4, 2] and ds.has_ref is False
    b = collate_preference([ds[0], ds[1]], pad_id=0).batch
    assert b["responses"].tolist() == [[6, 2, 0], [7, 2, 0], [5, 13, 2], [6, 4, 2]]
    assert b["response_mask"].tolist() == [[1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]]
    assert b["input_ids"][0].tolist() == [0, 5, 14, 5, 18, 6, 2, 0]  # left-padded prompt, right-padded reply
    assert b["attention_mask"][0].tolist() == [0, 1, 1, 1, 1, 1, 1, 0]
    assert b["position_ids"][0].tolist() == [0, 0, 1, 2, 3, 4, 5, 6]
    assert b["is_chosen"].tolist() == [1, 0, 1, 0]
    assert torch.equal(b["input_ids"][0, :5], b["input_ids"][1, :5])  # a pair shares its prompt (packed once)
    assert "ref_seq_log_probs" not in b.keys()


def test_plain_prompts_and_precomputed_reference_log_probs(tmp_path, char_tokenizer):
    rows = [{"prompt": "1+1=", "chosen": "2", "rejected": "3", "ref_chosen_logps": -1.5, "ref_rejected_logps": -2.0}]
    ds = dataset(write(tmp_path, rows), char_tokenizer)
    assert ds[0]["prompt"] == [5, 14, 5, 18] and ds.has_ref  # a str prompt is used as it is (no chat template)
    b = collate_preference([ds[0]], pad_id=0).batch
    assert b["ref_seq_log_probs"].tolist() == [-1.5, -2.0]


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"prompt": "1+1=", "chosen": "2"}], "missing column 'rejected'"),
        ([pair("1+1=", 2, "3")], r"row 0: column 'chosen' must be a str \(the reply\)"),
        ([pair("1+1=", "2", [{"role": "user", "content": "3"}])], "row 0: column 'rejected' must be a str"),
        (
            [{"prompt": 7, "chosen": "2", "rejected": "3"}],
            "row 0: column 'prompt' must be a str or a non-empty list of chat messages",
        ),
        (
            [pair("1+1=", "2", "3", ref_chosen_logps=-1.0)],
            r"has \['ref_chosen_logps'\] but not \['ref_rejected_logps'\]",
        ),
        (
            [pair("1+1=", "2", "3", ref_chosen_logps=float("nan"), ref_rejected_logps=-1.0)],
            "row 0: column 'ref_chosen_logps' must be a finite number",
        ),
    ],
)
def test_bad_rows_name_the_file_row_and_column(tmp_path, char_tokenizer, rows, message):
    path = write(tmp_path, rows)
    with pytest.raises(ValueError, match=message) as e:
        dataset(path, char_tokenizer)
    assert path in str(e.value)


def test_reference_columns_in_some_files_only_are_refused(tmp_path, char_tokenizer):
    with_ref = write(tmp_path, [pair("1+1=", "2", "3", ref_chosen_logps=-1.0, ref_rejected_logps=-2.0)], "a.parquet")
    without = write(tmp_path, [pair("1+2=", "3", "4")], "b.parquet")
    with pytest.raises(ValueError, match="precompute them for every file or for none"):
        PreferenceDataset([with_ref, without], char_tokenizer, max_prompt_length=16, max_response_length=8)


def test_overlong_pairs_are_dropped_and_counted(tmp_path, char_tokenizer, caplog):
    path = write(tmp_path, [pair("1+1=", "2", "3"), pair("1+1=", "2", "3333333")])  # 8 tokens with eos
    with caplog.at_level(logging.WARNING):
        ds = dataset(path, char_tokenizer, max_response_length=7)
    assert (len(ds), ds.n_filtered) == (1, 1)
    assert "dropped 1 of 2 pairs" in caplog.text
    with pytest.raises(
        ValueError, match="row 1: the rejected reply has 8 tokens, more than data.max_response_length=7"
    ):
        dataset(path, char_tokenizer, max_response_length=7, filter_overlong=False)


def test_embedded_pairs_prefer_the_right_answer_over_a_near_miss():
    rows = make_preference_rows(50, seed=0)
    for r in rows:
        a, b = r["extra_info"]["a"], r["extra_info"]["b"]
        assert r["chosen"] == str(a + b)
        assert int(r["rejected"]) - (a + b) in (-10, -2, -1, 1, 2, 10) and int(r["rejected"]) >= 0
