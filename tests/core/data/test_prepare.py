"""`verl data prepare`: each set from a small file written in its published layout (hand-made records) to verl's
RL rows, which validate accepts and `reward.fn: default` scores; reasoning-gym generated from a seed."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl import cli
from verl.data.prepare import prepare
from verl.reward.functions import get_reward_fn

GSM8K = [
    {
        "question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
        "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 72",
    },
    {"question": "A shop had 1,200 pens and sold 200. How many are left?", "answer": "1,200 - 200 = 1,000\n#### 1,000"},
    {"question": "A record without a final answer", "answer": "no marker here"},
]
MATH = [
    {
        "problem": "What is $\\frac{1}{2}+\\frac{1}{4}$?",
        "level": "Level 1",
        "type": "Prealgebra",
        "solution": "Add: $\\frac{2}{4}+\\frac{1}{4}=\\boxed{\\frac{3}{4}}$.",
    },
    {
        "problem": "Simplify $\\sqrt{8}$.",
        "level": "Level 2",
        "type": "Algebra",
        "solution": "$\\sqrt{8}=\\boxed{2\\sqrt{2}}$.",
    },
]
MATH500 = [
    {
        "problem": "Compute $3^4$.",
        "solution": "$3^4=81$, so $\\boxed{81}$.",
        "answer": "81",
        "subject": "Algebra",
        "level": 1,
        "unique_id": "test/algebra/1.json",
    },
]
DAPO = [
    {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": "Solve: 2+2. Answer: $Answer"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": "4", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"},
    },
]
MMLU = [
    {"question": "What is 2+2?", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "22"], "answer": 1}
]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _rows(path):
    return pd.read_parquet(path).to_dict("records")


def test_gsm8k_from_its_jsonl(tmp_path):
    path = prepare("gsm8k", str(tmp_path / "out"), source=_jsonl(tmp_path / "test.jsonl", GSM8K), split="test")
    assert path.endswith("out/test.parquet")
    rows = _rows(path)
    assert len(rows) == 2  # the record without "####" is skipped (and said)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["72", "1000"]
    assert rows[0]["data_source"] == "openai/gsm8k" and rows[0]["ability"] == "math"
    assert list(rows[0]["prompt"]) == [
        {
            "role": "user",
            "content": GSM8K[0]["question"] + ' Let\'s think step by step and output the final answer after "####".',
        }
    ]
    assert rows[1]["extra_info"]["split"] == "test" and rows[1]["extra_info"]["index"] == 1


def test_math_from_the_release_folder_and_math500_and_dapo_and_mmlu(tmp_path):
    release = tmp_path / "MATH" / "train"
    for i, record in enumerate(MATH):
        (release / record["type"].lower()).mkdir(parents=True, exist_ok=True)
        (release / record["type"].lower() / f"{i}.json").write_text(json.dumps(record))
    rows = _rows(prepare("math", str(tmp_path / "math"), source=str(release)))
    assert sorted(r["reward_model"]["ground_truth"] for r in rows) == ["2\\sqrt{2}", "\\frac{3}{4}"]
    assert {r["data_source"] for r in rows} == {"lighteval/MATH"} and "\\boxed{}" in rows[0]["prompt"][0]["content"]
    (row,) = _rows(
        prepare("math500", str(tmp_path / "m5"), source=_jsonl(tmp_path / "m5.jsonl", MATH500), split="test")
    )
    assert row["reward_model"]["ground_truth"] == "81" and row["extra_info"]["unique_id"] == "test/algebra/1.json"
    pq.write_table(pa.Table.from_pylist(DAPO), tmp_path / "dapo.parquet")
    (row,) = _rows(prepare("dapo_math", str(tmp_path / "dapo"), source=str(tmp_path / "dapo.parquet")))
    assert row["data_source"] == "math_dapo" and row["reward_model"]["ground_truth"] == "4"
    assert row["prompt"][0]["content"] == "Solve: 2+2. Answer: $Answer"
    assert row["extra_info"]["source_index"] == "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"
    pq.write_table(pa.Table.from_pylist(MMLU), tmp_path / "mmlu.parquet")
    (row,) = _rows(prepare("mmlu", str(tmp_path / "mmlu"), source=str(tmp_path / "mmlu.parquet"), split="test"))
    assert row["reward_model"]["ground_truth"] == "B" and "\nB. 4\n" in row["prompt"][0]["content"]


def test_reasoning_gym_is_generated_from_its_seed_and_checked_by_its_own_checker(tmp_path):
    a = _rows(prepare("reasoning_gym", str(tmp_path / "a"), task="chain_sum", size=20, seed=1))
    again = _rows(prepare("reasoning_gym", str(tmp_path / "b"), task="chain_sum", size=20, seed=1))
    other = _rows(prepare("reasoning_gym", str(tmp_path / "c"), task="chain_sum", size=20, seed=2, split="test"))
    questions = [r["prompt"][0]["content"] for r in a]
    assert questions == [r["prompt"][0]["content"] for r in again] and questions != [
        r["prompt"][0]["content"] for r in other
    ]
    score = get_reward_fn("default")
    for row in a[:5]:
        truth, extra = row["reward_model"]["ground_truth"], {**row["extra_info"], "data_source": row["data_source"]}
        assert row["data_source"] == "reasoning_gym/chain_sum"
        assert score("", f"Adding up.\n{truth}", truth, extra)["acc"] == 1.0  # the last line is the answer
        assert score("", f"<answer>{truth}</answer>", truth, extra)["acc"] == 1.0
        assert score("", f"The final answer is {truth}.", truth, extra)["acc"] == 1.0  # the clause after " is "
        assert score("", f"{row['extra_info']['index']} + 0 = {truth}", truth, extra)["acc"] == 1.0  # after "="
        assert score("", f"{int(truth) + 1}", truth, extra)["acc"] == 0.0


def test_the_cli_writes_rows_validate_accepts_and_the_default_scorer_scores(tmp_path, capsys):
    source = _jsonl(tmp_path / "test.jsonl", GSM8K)
    out = tmp_path / "data"
    assert cli.main(["data", "prepare", "gsm8k", "--input", source, "--split", "test", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "gsm8k: 2 rows" in said and "(1 records without a usable answer skipped)" in said
    from omegaconf import OmegaConf

    from verl.config.run_checks import check_run
    from verl.config.schema import VerlConfig

    files = {"train_files": [str(out / "test.parquet")], "val_files": [str(out / "test.parquet")]}
    cfg = OmegaConf.merge(
        OmegaConf.structured(VerlConfig),
        {"model": {"path": "embedded:tiny-llama"}, "data": files, "reward": {"fn": "default"}},
    )
    assert check_run(cfg, roles=[]) == []
    row = _rows(out / "test.parquet")[0]
    extra = {**row["extra_info"], "data_source": row["data_source"]}
    assert get_reward_fn("default")("", "48 + 24 = 72\n#### 72", "72", extra) == 1.0


def test_bad_inputs_name_the_file_the_record_and_the_layout(tmp_path, capsys):
    assert cli.main(["data", "prepare", "gsm8k", "--input", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)]) == 2
    assert "is not a file here" in capsys.readouterr().err
    bad = _jsonl(tmp_path / "bad.jsonl", [{"q": "1+1", "a": "2"}])
    assert cli.main(["data", "prepare", "gsm8k", "--input", bad, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "record 0 is not in the gsm8k layout" in err and "'answer'" in err and "['a', 'q']" in err
    assert cli.main(["data", "prepare", "gsm9k", "--input", bad, "--out", str(tmp_path)]) == 2
    assert "gsm8k" in capsys.readouterr().err  # did you mean
    with pytest.raises(ValueError, match="no records converted"):
        prepare("gsm8k", str(tmp_path / "x"), source=_jsonl(tmp_path / "none.jsonl", GSM8K[2:]))


MBPP = [
    {
        "task_id": 602,
        "text": "Write a python function to find the first repeated character in a given string.",
        "code": "def first_repeated_char(str1):\n  for index,c in enumerate(str1):\n    if str1[:index+1].count(c) > 1:\n      return c\n  return None",
        "test_list": [
            'assert first_repeated_char("abcabc") == "a"',
            'assert first_repeated_char("abc") == None',
            'assert first_repeated_char("123123") == "1"',
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {"task_id": 1, "text": "No tests", "code": "pass", "test_list": [], "test_setup_code": ""},
]


def test_mbpp_from_its_jsonl_scored_by_running_its_tests(tmp_path):
    from verl.agents.sandbox import sandbox_problem

    (row,) = _rows(prepare("mbpp", str(tmp_path / "mbpp"), source=_jsonl(tmp_path / "mbpp.jsonl", MBPP), split="test"))
    assert row["data_source"] == "mbpp" and row["ability"] == "code" and row["extra_info"]["task_id"] == "602"
    assert json.loads(row["reward_model"]["ground_truth"]) == MBPP[0]["test_list"]
    prompt = row["prompt"][0]["content"]
    assert prompt.startswith(MBPP[0]["text"]) and MBPP[0]["test_list"][0] in prompt and "```python" in prompt
    if sandbox_problem() is not None:
        pytest.skip(f"no sandbox on this machine: {sandbox_problem()}")
    extra = {**row["extra_info"], "data_source": row["data_source"]}
    score = get_reward_fn("default")
    truth = row["reward_model"]["ground_truth"]
    assert score("", f"```python\n{MBPP[0]['code']}\n```", truth, extra)["acc"] == 1.0  # the set's own solution
    assert score("", "```python\ndef first_repeated_char(s):\n    return s[0]\n```", truth, extra)["acc"] == 0.0
