"""The embedded arithmetic task: row format, disjoint and stable splits, cached parquet files."""

from __future__ import annotations

import collections
from pathlib import Path

import pandas as pd
import pytest

from verl.data.sources import resolve_data_files
from verl.embedded.arithmetic import (
    ARITHMETIC_DATASETS,
    make_arithmetic_rows,
    make_sft_rows,
    pair_split,
    split_problems,
    write_arithmetic_parquet,
)

ALL_PAIRS = {(a, b) for a in range(50) for b in range(50)}


def test_row_format():
    row = make_arithmetic_rows(1, seed=0, split="train")[0]
    a, b = row["extra_info"]["a"], row["extra_info"]["b"]
    assert row == {
        "data_source": "embedded/arithmetic",
        "prompt": [{"role": "user", "content": f"{a}+{b}="}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": "train", "index": 0, "a": a, "b": b, "op": "+"},
    }


def test_other_operators():
    rows = make_arithmetic_rows(300, seed=0, split="train", ops=("-", "*"))
    assert {r["extra_info"]["op"] for r in rows} == {"-", "*"}
    for r in rows:
        a, b, op = r["extra_info"]["a"], r["extra_info"]["b"], r["extra_info"]["op"]
        assert r["reward_model"]["ground_truth"] == str(a - b if op == "-" else a * b)
    with pytest.raises(ValueError, match=r"ops: unknown operators \['/'\]"):
        make_arithmetic_rows(1, seed=0, split="train", ops=("/",))


def test_counting_has_a_long_tail_of_answer_lengths():
    """ "7..10=" -> "7 8 9 10": counts of 1 to COUNT_MAX numbers up to 999, each count k about COUNT_TAIL ** (k - 1)
    as common as a single number, so most answers are short and a few run to ~47 characters."""
    from verl.embedded.arithmetic import COUNT_MAX, COUNT_TAIL

    rows = make_arithmetic_rows(5000, seed=0, split="train", ops=("..",), max_operand=999)
    counts = collections.Counter()
    for r in rows:
        a, b = r["extra_info"]["a"], r["extra_info"]["b"]
        assert r["prompt"][0]["content"] == f"{a}..{b}="
        assert r["reward_model"]["ground_truth"].split() == [str(i) for i in range(a, b + 1)]
        counts[b - a + 1] += 1
    assert min(counts) == 1 and max(counts) == COUNT_MAX
    problems = collections.Counter(b - a + 1 for a, b, _ in split_problems("train", 999, ("..",)))
    for k in (2, 4, 8):  # problems of k numbers among those of one, against the tail's rate (within 15%)
        assert problems[k] / problems[1] == pytest.approx(COUNT_TAIL ** (k - 1) * (1000 - k + 1) / 1000, rel=0.15)
    lengths = sorted(len(r["reward_model"]["ground_truth"]) for r in rows)
    assert lengths[len(lengths) // 2] <= 15 and lengths[-1] >= 44  # median ~3 numbers, the longest 12


def test_splits_partition_the_pairs():
    train = {(a, b) for a, b, _ in split_problems("train", 49, "+")}
    val = {(a, b) for a, b, _ in split_problems("val", 49, "+")}
    assert not train & val
    assert train | val == ALL_PAIRS
    assert 0.05 < len(val) / len(ALL_PAIRS) < 0.15  # about VAL_PERCENT = 10% held out


@pytest.mark.parametrize("n", [1, 10, 300, 5000])
def test_split_of_a_pair_does_not_depend_on_n(n):
    for split in ("train", "val"):
        for r in make_arithmetic_rows(n, seed=n, split=split):
            assert pair_split(r["extra_info"]["a"], r["extra_info"]["b"], "+") == split


def test_answers_are_one_or_two_digits():
    answers = {r["reward_model"]["ground_truth"] for r in make_arithmetic_rows(20000, seed=0, split="train")}
    assert {len(a) for a in answers} == {1, 2}
    assert max(int(a) for a in answers) <= 98


def test_sampling_without_replacement_then_repeats():
    problems = split_problems("val", 49, "+")
    once = make_arithmetic_rows(len(problems), seed=3, split="val")
    assert collections.Counter((r["extra_info"]["a"], r["extra_info"]["b"]) for r in once) == collections.Counter(
        (a, b) for a, b, _ in problems
    )
    # 2 full passes plus 5 rows: every problem twice, 5 of them three times.
    counts = collections.Counter(
        (r["extra_info"]["a"], r["extra_info"]["b"])
        for r in make_arithmetic_rows(2 * len(problems) + 5, seed=3, split="val")
    )
    assert sorted(collections.Counter(counts.values()).items()) == [
        (2, len(problems) - 5),
        (3, 5),
    ]
    assert [r["extra_info"]["index"] for r in once] == list(range(len(problems)))


def test_seeded():
    assert make_arithmetic_rows(50, seed=1, split="train") == make_arithmetic_rows(50, seed=1, split="train")
    assert make_arithmetic_rows(50, seed=1, split="train") != make_arithmetic_rows(50, seed=2, split="train")


def test_bad_arguments():
    with pytest.raises(ValueError, match="split must be one of"):
        make_arithmetic_rows(1, seed=0, split="test")
    with pytest.raises(ValueError, match="n must be >= 0"):
        make_arithmetic_rows(-1, seed=0, split="train")


def test_sft_rows():
    rows = make_sft_rows(20, seed=0)
    for r in rows:
        a, b = r["extra_info"]["a"], r["extra_info"]["b"]
        assert r["prompt"] == [{"role": "user", "content": f"{a}+{b}="}]
        assert r["response"] == str(a + b)


def test_write_parquet_is_cached_and_readable(tmp_path):
    train, val = write_arithmetic_parquet(tmp_path, 100, 20, 0)
    mtimes = (Path(train).stat().st_mtime_ns, Path(val).stat().st_mtime_ns)
    assert write_arithmetic_parquet(tmp_path, 100, 20, 0) == (train, val)
    assert (Path(train).stat().st_mtime_ns, Path(val).stat().st_mtime_ns) == mtimes
    assert write_arithmetic_parquet(tmp_path, 101, 20, 0)[0] != train  # other settings, other file
    df = pd.read_parquet(train)  # the way verl's public preprocessing reads these files
    assert list(df.columns) == [
        "data_source",
        "prompt",
        "ability",
        "reward_model",
        "extra_info",
    ]
    assert len(df) == 100 and len(pd.read_parquet(val)) == 20
    assert df.to_dict("records")[0]["reward_model"]["style"] == "rule"
    assert pd.read_parquet(val)["extra_info"].map(lambda e: e["split"]).eq("val").all()


def test_resolve_data_files(tmp_path):
    paths = resolve_data_files(
        [
            "embedded:arithmetic",
            "embedded:arithmetic-val",
            "embedded:arithmetic-sft",
            "/data/gsm8k.parquet",
        ],
        tmp_path,
    )
    assert paths[3] == "/data/gsm8k.parquet"
    assert [len(pd.read_parquet(p)) for p in paths[:3]] == [20000, 200, 20000]
    assert ARITHMETIC_DATASETS["arithmetic"].n == 20000
    assert set(pd.read_parquet(paths[2]).columns) >= {"prompt", "response"}
    with pytest.raises(
        ValueError,
        match="unknown embedded data set 'embedded:gsm8k'.*embedded:arithmetic-val",
    ):
        resolve_data_files(["embedded:gsm8k"], tmp_path)
    with pytest.raises(TypeError, match=r"write \['embedded:arithmetic'\]"):
        resolve_data_files("embedded:arithmetic", tmp_path)
