"""The embedded character tokenizer: exact round trips, the chat template, save/load."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from verl.embedded.tokenizer import CHARACTERS, SPECIAL_TOKENS

# Ids: <pad>=0 <bos>=1 <eos>=2 <unk>=3, then "0".."9" = 4..13, "+"=14 "-"=15 "*"=16 "/"=17 "="=18, " "=19, ...
IDS_12_PLUS_7 = [5, 6, 14, 11, 18]  # "1" "2" "+" "7" "="

TASK_STRINGS = [f"{a}{op}{b}=" for a in range(50) for b in range(50) for op in "+-*"] + [
    str(v) for v in range(-49, 2402)
]
OTHER_STRINGS = [
    "",
    " ",
    "  a  b ",
    "What is 12+7?\nAnswer: 19.",
    'x;y:z,("quoted") don\'t!',
    "\n\n",
]


def test_special_and_character_ids(char_tokenizer):
    tok = char_tokenizer
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id] == [
        0,
        1,
        2,
        3,
    ]
    assert tok.padding_side == "left"
    assert len(tok) == len(SPECIAL_TOKENS) + len(CHARACTERS) == 83  # 4 + 10 + 5 + 1 + 26 + 26 + 11
    ids = [tok.convert_tokens_to_ids(c) for c in CHARACTERS]
    assert ids == list(range(4, 83))  # every character its own id, none of them <unk>


def test_known_ids(char_tokenizer):
    assert char_tokenizer("12+7=", add_special_tokens=False)["input_ids"] == IDS_12_PLUS_7
    assert char_tokenizer("12+7=")["input_ids"] == IDS_12_PLUS_7  # no <bos>/<eos> added either way


@pytest.mark.parametrize("strings", [TASK_STRINGS, OTHER_STRINGS], ids=["task", "other"])
def test_round_trip_one_token_per_character(char_tokenizer, strings):
    encoded = char_tokenizer(strings, add_special_tokens=False)["input_ids"]
    for text, ids in zip(strings, encoded):
        assert len(ids) == len(text), text
        assert char_tokenizer.unk_token_id not in ids, text
        assert char_tokenizer.decode(ids) == text


def test_unknown_character_and_special_decoding(char_tokenizer):
    assert char_tokenizer("1é", add_special_tokens=False)["input_ids"] == [5, 3]
    # "19" then <eos>: skip_special_tokens drops the <eos> and nothing else.
    assert char_tokenizer.decode([5, 13, 2]) == "19<eos>"
    assert char_tokenizer.decode([0, 0, 5, 13, 2], skip_special_tokens=True) == "19"


def test_chat_template_is_the_contents(char_tokenizer):
    prompt = [{"role": "user", "content": "12+7="}]
    text = char_tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    assert text == "12+7="
    # Several turns: contents in order, each assistant turn closed by <eos>.
    chat = prompt + [
        {"role": "assistant", "content": "19"},
        {"role": "user", "content": "1+1="},
    ]
    text = char_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert text == "12+7=19<eos>1+1="
    assert char_tokenizer(text)["input_ids"] == IDS_12_PLUS_7 + [5, 13, 2] + [
        5,
        14,
        5,
        18,
    ]


def test_left_padding(char_tokenizer):
    enc = char_tokenizer(["1+1=", "12+7="], padding=True, return_tensors="pt")
    assert enc["input_ids"].tolist() == [[0, 5, 14, 5, 18], IDS_12_PLUS_7]
    assert enc["attention_mask"].tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]


def test_save_and_load_round_trip(char_tokenizer, tmp_path):
    char_tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.padding_side == "left"
    assert [
        loaded.pad_token_id,
        loaded.bos_token_id,
        loaded.eos_token_id,
        loaded.unk_token_id,
    ] == [0, 1, 2, 3]
    assert loaded.get_vocab() == char_tokenizer.get_vocab()
    strings = TASK_STRINGS[:500] + OTHER_STRINGS
    assert loaded(strings)["input_ids"] == char_tokenizer(strings)["input_ids"]
    for text in OTHER_STRINGS:
        assert loaded.decode(loaded(text)["input_ids"]) == text
    chat = [{"role": "user", "content": "12+7="}]
    assert loaded.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == "12+7="
