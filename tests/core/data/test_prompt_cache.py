"""The prompt cache: a second load of the same file with the same tokenizer reads the tokenised prompts back;
an edited file, another tokenizer or another column gets a new entry; an unwritable cache only costs time."""

from __future__ import annotations

import os

import pandas as pd

from verl.data.prompt_cache import cached_prompts, tokenizer_fingerprint
from verl.data.rl_dataset import RLDataset


def _file(tmp_path, contents, name="data.parquet") -> str:
    rows = [
        {"data_source": "t", "prompt": [{"role": "user", "content": c}], "reward_model": {"ground_truth": "1"}}
        for c in contents
    ]
    path = str(tmp_path / name)
    pd.DataFrame(rows).to_parquet(path)
    return path


def _counting(tokenizer, texts):
    calls = []

    def compute():
        calls.append(1)
        return texts, [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    return compute, calls


def test_a_second_load_reads_the_cache(tmp_path, char_tokenizer):
    path = _file(tmp_path, ["1+1=", "12+7="])
    first = RLDataset([path], char_tokenizer, max_prompt_length=16, cache_dir=tmp_path / "cache")
    (entry,) = (tmp_path / "cache" / "prompts").iterdir()
    compute, calls = _counting(char_tokenizer, ["never", "used"])
    texts, ids = cached_prompts(path, char_tokenizer, "prompt", compute, tmp_path / "cache")
    assert not calls and entry.suffix == ".parquet"
    assert texts == [r["raw_prompt"] for r in first.rows] and ids == [r["input_ids"] for r in first.rows]
    again = RLDataset([path], char_tokenizer, max_prompt_length=16, cache_dir=tmp_path / "cache")
    assert again.rows == first.rows


def test_an_edited_file_or_another_tokenizer_gets_a_new_entry(tmp_path, char_tokenizer):
    cache = tmp_path / "cache"
    path = _file(tmp_path, ["1+1="])
    a = RLDataset([path], char_tokenizer, max_prompt_length=16, cache_dir=cache)
    os.utime(path, ns=(1, 1))  # same bytes, another modification time: treated as edited
    _file(tmp_path, ["2+2=9"])
    os.utime(path, ns=(2, 2))
    b = RLDataset([path], char_tokenizer, max_prompt_length=16, cache_dir=cache)
    assert a.rows[0]["raw_prompt"] != b.rows[0]["raw_prompt"]
    other = char_tokenizer.__class__.from_pretrained(_saved(char_tokenizer, tmp_path))
    other.chat_template = "Q: {{ messages[0]['content'] }} A:"
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(char_tokenizer)
    c = RLDataset([path], other, max_prompt_length=32, cache_dir=cache)
    assert c.rows[0]["raw_prompt"] == "Q: 2+2=9 A:"
    assert len(list((cache / "prompts").glob("*.parquet"))) == 3


def _saved(tokenizer, tmp_path) -> str:
    folder = tmp_path / "tok"
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_an_unwritable_cache_costs_only_time(tmp_path, char_tokenizer, caplog):
    path = _file(tmp_path, ["3+4="])
    cache = tmp_path / "a-file"  # a cache "folder" that is a file: no entry can be made under it, even as root
    cache.write_text("")
    data = RLDataset([path], char_tokenizer, max_prompt_length=16, cache_dir=cache)
    assert "3+4=" in data.rows[0]["raw_prompt"]
    assert "prompt cache" in caplog.text and "tokenised each run" in caplog.text
