"""RLDataset and collate_rl: verl's parquet format, filtering, errors naming file and row, padding."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.data.rl_dataset import RLDataset, collate_rl
from verl.protocol import DataProto


def rl_row(content: str, answer: str, index: int) -> dict:
    return {
        "data_source": "test/arith",
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index},
    }


def write(tmp_path, rows, name="data.parquet") -> str:
    path = str(tmp_path / name)
    pd.DataFrame(rows).to_parquet(path)  # as verl's public preprocessing scripts write them
    return path


@pytest.fixture
def crafted(tmp_path):
    # Prompt lengths in characters (= tokens): 4, 5, 6, 8.
    return write(
        tmp_path,
        [
            rl_row("1+1=", "2", 0),
            rl_row("12+7=", "19", 1),
            rl_row("12+34=", "46", 2),
            rl_row("1234+567", "x", 3),
        ],
    )


def test_filtering_count_is_exact(crafted, char_tokenizer, caplog):
    with caplog.at_level(logging.WARNING):
        ds = RLDataset([crafted], char_tokenizer, max_prompt_length=5)
    assert ds.n_filtered == 2  # the 6- and 8-token prompts
    assert len(ds) == 2
    assert [ds[i]["raw_prompt"] for i in range(2)] == ["1+1=", "12+7="]
    assert f"{crafted}: dropped 2 of 4 prompts longer than max_prompt_length=5" in caplog.text
    assert RLDataset([crafted], char_tokenizer, max_prompt_length=8).n_filtered == 0


def test_overlong_is_an_error_without_filtering(crafted, char_tokenizer):
    with pytest.raises(
        ValueError,
        match=r"data.parquet: row 2: prompt has 6 tokens.*max_prompt_length=5",
    ):
        RLDataset(
            [crafted],
            char_tokenizer,
            max_prompt_length=5,
            filter_overlong_prompts=False,
        )


def test_item(crafted, char_tokenizer):
    ds = RLDataset([crafted, crafted], char_tokenizer, max_prompt_length=16)
    assert len(ds) == 8
    item = ds[5]  # second file, row 1
    assert item["input_ids"].dtype == torch.long
    assert item["input_ids"].tolist() == [5, 6, 14, 11, 18]  # "1" "2" "+" "7" "="
    assert item["raw_prompt"] == "12+7="
    assert item["ground_truth"] == "19"
    assert item["data_source"] == "test/arith"
    assert item["extra_info"] == {"split": "train", "index": 1}
    assert item["index"] == 5
    assert ds[-1]["index"] == 7
    with pytest.raises(IndexError):
        ds[8]


def test_missing_column_names_file_and_format(tmp_path, char_tokenizer):
    rows = [rl_row("1+1=", "2", 0)]
    del rows[0]["reward_model"]
    path = write(tmp_path, rows)
    with pytest.raises(
        ValueError,
        match=rf"{path}: missing column 'reward_model', expected a dict like",
    ):
        RLDataset([path], char_tokenizer, max_prompt_length=8)
    with pytest.raises(
        ValueError,
        match=r"missing column 'question', expected a non-empty list of chat messages",
    ):
        RLDataset(
            [write(tmp_path, [rl_row("1+1=", "2", 0)], "b.parquet")],
            char_tokenizer,
            prompt_key="question",
            max_prompt_length=8,
        )


@pytest.mark.parametrize(
    "bad_prompt",
    [
        [],  # no messages
        [{"role": "user", "content": None}],  # content missing
    ],
)
def test_malformed_prompt_names_file_and_row(tmp_path, char_tokenizer, bad_prompt):
    rows = [rl_row("1+1=", "2", 0), rl_row("2+2=", "4", 1), rl_row("3+3=", "6", 2)]
    rows[2]["prompt"] = bad_prompt
    path = write(tmp_path, rows)
    with pytest.raises(
        ValueError,
        match=rf"{path}: row 2: column 'prompt' must be a non-empty list of chat messages",
    ):
        RLDataset([path], char_tokenizer, max_prompt_length=8)


def test_string_prompt_is_malformed(tmp_path, char_tokenizer):
    rows = [{**rl_row("", "2", 0), "prompt": "1+1="}]
    with pytest.raises(ValueError, match=r"row 0: column 'prompt' must be .* got '1\+1='"):
        RLDataset([write(tmp_path, rows)], char_tokenizer, max_prompt_length=8)


def test_missing_ground_truth_names_row(tmp_path, char_tokenizer):
    rows = [rl_row("1+1=", "2", 0), rl_row("2+2=", "4", 1)]
    rows[1]["reward_model"] = {"style": "rule", "ground_truth": None}
    with pytest.raises(ValueError, match=r"row 1: column 'reward_model' must be a dict like"):
        RLDataset([write(tmp_path, rows)], char_tokenizer, max_prompt_length=8)


def test_missing_file_lists_embedded_names(char_tokenizer):
    with pytest.raises(FileNotFoundError, match=r"'nope.parquet' does not exist.*embedded:arithmetic"):
        RLDataset(["nope.parquet"], char_tokenizer, max_prompt_length=8)


def test_all_filtered_is_an_error(crafted, char_tokenizer):
    with pytest.raises(ValueError, match="no prompts left"):
        RLDataset([crafted], char_tokenizer, max_prompt_length=3)


def test_embedded_arithmetic(char_tokenizer, embedded_cache):
    ds = RLDataset(
        ["embedded:arithmetic-val"],
        char_tokenizer,
        max_prompt_length=16,
        cache_dir=embedded_cache,
    )
    assert (len(ds), ds.n_filtered) == (200, 0)
    item = ds[0]
    a, b = item["extra_info"]["a"], item["extra_info"]["b"]
    assert item["raw_prompt"] == f"{a}+{b}=" and item["ground_truth"] == str(a + b)


def test_collate_two_rows_by_hand(crafted, char_tokenizer):
    ds = RLDataset([crafted], char_tokenizer, max_prompt_length=5)
    batch = collate_rl([ds[0], ds[1]], char_tokenizer, max_prompt_length=5)
    assert isinstance(batch, DataProto) and len(batch) == 2
    # "1+1=" (4 tokens) is left-padded with one <pad> (id 0) to the batch's longest prompt, "12+7=" (5).
    assert batch.batch["input_ids"].tolist() == [[0, 5, 14, 5, 18], [5, 6, 14, 11, 18]]
    assert batch.batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    # Positions count real tokens: cumsum(mask) - 1 = [-1, 0, 1, 2, 3] -> clamped to [0, 0, 1, 2, 3].
    assert batch.batch["position_ids"].tolist() == [[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]]
    nt = batch.non_tensor_batch
    assert all(nt[k].dtype == object for k in ("raw_prompt", "ground_truth", "data_source", "extra_info", "index"))
    assert list(nt["raw_prompt"]) == ["1+1=", "12+7="]
    assert list(nt["ground_truth"]) == ["2", "19"]
    assert list(nt["index"]) == [0, 1]
    assert nt["extra_info"][1] == {"split": "train", "index": 1}
    np.testing.assert_array_equal(nt["data_source"], np.array(["test/arith"] * 2, dtype=object))


def test_collate_rejects_overlong(crafted, char_tokenizer):
    ds = RLDataset([crafted], char_tokenizer, max_prompt_length=8)
    with pytest.raises(ValueError, match="8 tokens, more than max_prompt_length=5"):
        collate_rl([ds[3]], char_tokenizer, max_prompt_length=5)


def test_left_padding_does_not_change_the_model_output(crafted, char_tokenizer, tiny_model_dir):
    # The padded row's logits at its real tokens equal those of the prompt alone: the attention mask
    # hides the padding. (RoPE is shift-invariant, so this cannot check the position ids; the
    # by-hand test above does.)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    ds = RLDataset([crafted], char_tokenizer, max_prompt_length=8)
    batch = collate_rl([ds[0], ds[3]], char_tokenizer, max_prompt_length=8).batch
    with torch.no_grad():
        padded = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}).logits
        alone = model(input_ids=ds[0]["input_ids"][None]).logits
    assert batch["attention_mask"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    torch.testing.assert_close(padded[0, 4:], alone[0], atol=1e-5, rtol=1e-5)


# A template that shows which tools a prompt was rendered with.
TOOLS_TEMPLATE = (
    "{% if tools %}{% for t in tools %}{{ t['function']['name'] }};{% endfor %}{% endif %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
SCHEMAS = [
    {"type": "function", "function": {"name": n, "description": "", "parameters": {"type": "object"}}}
    for n in ("calc", "check")
]


def tool_row(content: str, **extra) -> dict:
    row = rl_row(content, "1", 0)
    row["extra_info"] = {**row["extra_info"], **extra}
    return row


def test_a_rows_tools_narrow_its_prompt_and_its_tool_arguments_are_read(tmp_path, char_tokenizer):
    char_tokenizer = copy.deepcopy(char_tokenizer)  # (the fixture is the session's)
    char_tokenizer.chat_template = TOOLS_TEMPLATE
    rows = [
        tool_row("1+1=", tools=["check"], tools_kwargs={"check": {"answer": "2"}}),
        tool_row("2+2="),  # every tool (parquet gives it tools=None and tools_kwargs with None entries)
    ]
    path = write(tmp_path, rows)
    ds = RLDataset([path], char_tokenizer, max_prompt_length=64, tools=SCHEMAS)
    assert [ds[i]["raw_prompt"] for i in range(2)] == ["check;1+1=", "calc;check;2+2="]
    assert ds[0]["extra_info"]["tools"] == ["check"]
    assert ds[0]["extra_info"]["tools_kwargs"] == {"check": {"answer": "2"}}  # (calc: None in parquet, dropped)
    assert ds[1]["extra_info"]["tools"] is None and ds[1]["extra_info"]["tools_kwargs"] == {}
    as_json = write(tmp_path, [tool_row("3+3=", tools_kwargs='{"calc": {"precision": 2}}')], "json.parquet")  # read
    assert RLDataset([as_json], char_tokenizer, max_prompt_length=64, tools=SCHEMAS)[0]["extra_info"][
        "tools_kwargs"
    ] == {"calc": {"precision": 2}}


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"tools": ["search"]}, r"row 0: extra_info.tools names \['search'\], not among rollout.agent.tools"),
        ({"tools": "calc"}, r"row 0: extra_info.tools must be a list of tool names"),
        ({"tools_kwargs": {"search": {"q": "x"}}}, r"row 0: extra_info.tools_kwargs names tool 'search'"),
        ({"tools_kwargs": {"calc": "x"}}, r"row 0: extra_info.tools_kwargs\['calc'\] must be a \{keyword: value\}"),
        ({"tools_kwargs": "{nope"}, r"row 0: extra_info.tools_kwargs is a string but not JSON"),
    ],
)
def test_bad_per_sample_tools_name_the_file_and_row(tmp_path, char_tokenizer, extra, message):
    path = write(tmp_path, [tool_row("1+1=", **extra)])
    with pytest.raises(ValueError, match=message) as err:
        RLDataset([path], char_tokenizer, max_prompt_length=64, tools=SCHEMAS)
    assert path in str(err.value)
