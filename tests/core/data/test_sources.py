"""Data-file entries a recipe may name: `prepare:NAME?...` is what `verl data prepare` writes, prepared once."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from omegaconf import OmegaConf

from verl import cli
from verl.config.run_checks import check_run
from verl.config.schema import VerlConfig
from verl.data.sources import option_value, parse_prepared, prepared_file, resolve_data_files
from verl.registry import UnknownNameError

CHAIN = "prepare:reasoning_gym?task=chain_sum&size=30&seed=4&max_terms=2&max_digits=1&split=test"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_prepared_entry_is_what_the_command_writes_and_is_written_once(cache, tmp_path):
    (path,) = resolve_data_files([CHAIN])
    assert path == str(prepared_file(CHAIN)) and path.endswith("/test.parquet") and str(cache) in path
    args = ["data", "prepare", "reasoning_gym", "--task", "chain_sum", "--size", "30", "--seed", "4", "--split", "test"]
    options = ["--option", "max_terms=2", "--option", "max_digits=1"]
    assert cli.main([*args, *options, "--out", str(tmp_path / "cmd")]) == 0
    ours, theirs = pd.read_parquet(path), pd.read_parquet(tmp_path / "cmd" / "test.parquet")
    assert ours.to_json() == theirs.to_json() and len(ours) == 30
    entries = [json.loads(e["reasoning_gym"]["entry"]) for e in ours["extra_info"]]
    assert {e["metadata"]["num_terms"] for e in entries} == {2} and all(
        len(e["answer"].lstrip("-")) <= 2 for e in entries
    )
    written = os.stat(path).st_mtime_ns
    assert resolve_data_files([CHAIN]) == [path] and os.stat(path).st_mtime_ns == written  # (not prepared again)
    other = resolve_data_files([CHAIN.replace("seed=4", "seed=5")])[0]
    assert other != path and pd.read_parquet(other).to_json() != ours.to_json()


def test_an_input_file_is_prepared_again_when_it_changes(cache, tmp_path):
    source = tmp_path / "test.jsonl"
    source.write_text(json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"}) + "\n")
    spec = f"prepare:gsm8k?input={source}&split=test"
    (first,) = resolve_data_files([spec])
    assert list(pd.read_parquet(first)["reward_model"].map(lambda r: r["ground_truth"])) == ["2"]
    source.write_text(json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n" * 2)
    (second,) = resolve_data_files([spec])
    assert second != first and list(pd.read_parquet(second)["reward_model"].map(lambda r: r["ground_truth"])) == ["4"]


def test_settings_are_typed_and_bad_entries_are_named(cache):
    assert [option_value(v) for v in ("3", "0.5", "true", "False", "chain_sum")] == [3, 0.5, True, False, "chain_sum"]
    assert parse_prepared(CHAIN) == (
        "reasoning_gym",
        "test",
        None,
        None,
        {"task": "chain_sum", "size": 30, "seed": 4, "max_terms": 2, "max_digits": 1},
    )
    with pytest.raises(UnknownNameError, match="reasoning_gym"):  # (the known sets are listed)
        parse_prepared("prepare:reasoning-gym?task=chain_sum")
    with pytest.raises(ValueError, match="key=value joined by &"):
        parse_prepared("prepare:reasoning_gym?chain_sum")
    with pytest.raises(ValueError, match="reasoning_gym task 'chain_sum'.*max_term"):
        resolve_data_files(["prepare:reasoning_gym?task=chain_sum&size=3&max_term=2"])


def _problems(files):
    run = {"model": {"path": "embedded:tiny-llama"}, "data": {"train_files": files}, "reward": {"fn": "default"}}
    return check_run(OmegaConf.merge(OmegaConf.structured(VerlConfig), run), roles=[])


def test_validate_checks_the_entry_and_the_file_once_it_is_there(cache):
    assert _problems([CHAIN]) == []  # (not prepared yet: written in verl's format when the run starts)
    (p,) = _problems(["prepare:gsm9k?split=test"])
    assert p.key == "data.train_files[0]" and "gsm8k" in p.message
    path = resolve_data_files([CHAIN])[0]
    assert _problems([CHAIN]) == []
    pd.DataFrame({"x": [1]}).to_parquet(path)  # (a cached file damaged by hand is checked like any other)
    (p,) = _problems([CHAIN])
    assert "lacks the column(s)" in p.message


def test_a_warm_start_keys_a_prepared_file_by_its_settings_without_preparing_it(cache):
    from verl.trainer.warm_start import _file_identity

    identity = _file_identity(CHAIN)
    assert identity == [prepared_file(CHAIN).parent.name] and not prepared_file(CHAIN).exists()
    assert _file_identity(CHAIN.replace("seed=4", "seed=5")) != identity
