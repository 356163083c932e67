"""The embedded arithmetic task ("12+7=" -> "19"; "7..10=" -> "7 8 9 10", counting, whose answers have a long tail
of lengths) as parquet files in verl's RL and SFT formats.

RL rows have verl's public columns: data_source, prompt (chat messages), ability, reward_model
({"style": "rule", "ground_truth": ...}) and extra_info. SFT rows have prompt and response; preference rows
prompt, chosen and rejected. Whether an
operand pair belongs to the train or the val split depends only on a hash of the pair, so the splits are
disjoint and stable whatever the number of rows asked for.
"""

from __future__ import annotations

import hashlib
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from verl.embedded.cache import (
    cache_root,
    cached_file,
    settings_hash,
)

DATA_SOURCE = "embedded/arithmetic"
FORMAT_VERSION = 1  # bump when the rows change, so old cache entries are not reused
VAL_PERCENT = 10  # share of operand pairs held out for validation
SPLITS = ("train", "val")
COUNT_TAIL = 0.8  # "..": a count of k numbers is kept with probability COUNT_TAIL ** (k - 1) (a long tail)
COUNT_MAX = 12  # "..": at most this many numbers (47 characters with 3-digit numbers)


def count_up(a: int, b: int) -> str:
    """ "7..10=" -> "7 8 9 10": answers from 1 to 47 characters (numbers up to 999), most of them short."""
    return " ".join(str(i) for i in range(a, b + 1))


OPS: dict[str, Callable[[int, int], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "..": count_up,
}


def in_domain(a: int, b: int, op: str) -> bool:
    """Whether (a, b) is a problem of `op`: every pair, but for counting b >= a, at most COUNT_MAX numbers, and a
    count of k kept with probability COUNT_TAIL ** (k - 1) (by a hash of the pair, so the set is stable)."""
    if op != "..":
        return True
    k = b - a + 1
    if not 1 <= k <= COUNT_MAX:
        return False
    digest = hashlib.sha256(f"keep{a}{op}{b}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < COUNT_TAIL ** (k - 1)


def pair_split(a: int, b: int, op: str) -> str:
    """ "train" or "val" for one problem, from a hash of the problem (not of its position)."""
    digest = hashlib.sha256(f"{a}{op}{b}".encode()).digest()
    return "val" if int.from_bytes(digest[:8], "big") % 100 < VAL_PERCENT else "train"


def split_problems(split: str, max_operand: int, ops: Sequence[str]) -> list[tuple[int, int, str]]:
    """Every (a, b, op) with operands in 0..max_operand that belongs to `split`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(f"ops: unknown operators {unknown}; known: {list(OPS)}")
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    problems = [
        (a, b, op)
        for op in ops
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
        if in_domain(a, b, op) and pair_split(a, b, op) == split
    ]
    if not problems:
        raise ValueError(f"no {split!r} problems with max_operand={max_operand} and ops={list(ops)}; raise max_operand")
    return problems


def make_arithmetic_rows(
    n: int, *, seed: int, split: str, max_operand: int = 49, ops: Sequence[str] = ("+",)
) -> list[dict[str, Any]]:
    """`n` RL rows of `split`: every problem once in a seeded order, then again in a new order, and so on."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    problems = split_problems(split, max_operand, ops)
    rng = np.random.default_rng(seed)
    rounds = -(-n // len(problems))  # ceil: how many passes over the problems fill n rows
    order = np.concatenate([rng.permutation(len(problems)) for _ in range(rounds)] or [np.zeros(0, int)])[:n]
    rows = []
    for i, k in enumerate(order.tolist()):
        a, b, op = problems[k]
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{a}{op}{b}="}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(OPS[op](a, b))},
                "extra_info": {"split": split, "index": i, "a": a, "b": b, "op": op},
            }
        )
    return rows


def make_sft_rows(
    n: int,
    *,
    seed: int,
    split: str = "train",
    max_operand: int = 49,
    ops: Sequence[str] = ("+",),
) -> list[dict[str, Any]]:
    """`n` SFT rows (prompt messages and the answer as response) for a warm start before RL."""
    rows = make_arithmetic_rows(n, seed=seed, split=split, max_operand=max_operand, ops=ops)
    return [
        {
            "prompt": r["prompt"],
            "response": r["reward_model"]["ground_truth"],
            "extra_info": r["extra_info"],
        }
        for r in rows
    ]


def make_tool_sft_rows(
    n: int,
    *,
    seed: int,
    split: str = "train",
    max_operand: int = 49,
    ops: Sequence[str] = ("*",),
    tool_share: float = 1.0,
) -> list[dict[str, Any]]:
    """`n` conversations (a `messages` column). A share `tool_share` are tool-use traces: the model calls the
    calculator (`calc(37*45)`, the `plain` tool-call format), reads its result and answers with it; the others
    answer at once (right, but a model this small cannot do that for problems it has not memorised)."""
    rows = make_arithmetic_rows(n, seed=seed, split=split, max_operand=max_operand, ops=ops)
    uses_tool = np.random.default_rng(seed + 1).random(len(rows)) < tool_share
    out = []
    for r, tool in zip(rows, uses_tool.tolist()):
        question, answer = r["prompt"][0]["content"], r["reward_model"]["ground_truth"]
        messages = [{"role": "user", "content": question}]
        if tool:
            messages += [
                {"role": "assistant", "content": f"calc({question.rstrip('=')})"},
                {"role": "tool", "content": answer},
            ]
        messages.append({"role": "assistant", "content": answer})
        out.append({"messages": messages, "extra_info": r["extra_info"]})
    return out


NEAR_MISSES = (-10, -2, -1, 1, 2, 10)  # what a small model gets wrong: a carry or a last digit


def make_preference_rows(
    n: int, *, seed: int, split: str = "train", max_operand: int = 49, ops: Sequence[str] = ("+",)
) -> list[dict[str, Any]]:
    """`n` preference rows for DPO: the right answer is chosen over a near miss (off by 1, 2 or 10, >= 0)."""
    rows = make_arithmetic_rows(n, seed=seed, split=split, max_operand=max_operand, ops=ops)
    rng = np.random.default_rng(seed + 2)
    out = []
    for r in rows:
        answer = int(r["reward_model"]["ground_truth"])
        misses = [answer + d for d in NEAR_MISSES if answer + d >= 0]
        out.append(
            {
                "prompt": r["prompt"],
                "chosen": str(answer),
                "rejected": str(misses[rng.integers(len(misses))]),
                "extra_info": r["extra_info"],
            }
        )
    return out


@dataclass(frozen=True)
class ArithmeticFile:
    """One cached parquet file of the task: which rows, how many, in which format."""

    split: str
    n: int
    seed: int
    kind: str = "rl"  # rl | sft | tools_sft | preference
    max_operand: int = 49
    ops: tuple[str, ...] = ("+",)
    tool_share: float = 1.0  # tools_sft: the share of conversations that call the calculator

    def rows(self) -> list[dict[str, Any]]:
        makers: Dict[str, Callable[..., list[dict[str, Any]]]] = {
            "rl": make_arithmetic_rows,
            "sft": make_sft_rows,
            "tools_sft": make_tool_sft_rows,
            "preference": make_preference_rows,
        }
        make = makers[self.kind]
        extra = {"tool_share": self.tool_share} if self.kind == "tools_sft" else {}
        return make(self.n, seed=self.seed, split=self.split, max_operand=self.max_operand, ops=self.ops, **extra)

    def path(self, cache_dir: str | os.PathLike | None) -> Path:
        key = {"format": FORMAT_VERSION, **asdict(self)}
        if self.kind != "tools_sft":
            del key["tool_share"]  # (the cache keys of the other files stay as they were)
        if ".." in self.ops:
            key["count"] = [COUNT_MAX, COUNT_TAIL]
        return cache_root(cache_dir) / "data" / f"arithmetic-{self.kind}-{self.split}-{settings_hash(key)}.parquet"

    def materialize(self, cache_dir: str | os.PathLike | None = None) -> str:
        """The file's path, written on first use."""
        return str(
            cached_file(
                self.path(cache_dir),
                lambda tmp: pq.write_table(pa.Table.from_pylist(self.rows()), tmp),
            )
        )


# The arithmetic task's files among what "embedded:NAME" names (verl.embedded.data_sets).
ARITHMETIC_DATASETS: dict[str, ArithmeticFile] = {
    "arithmetic": ArithmeticFile(split="train", n=20000, seed=0),
    "arithmetic-val": ArithmeticFile(split="val", n=200, seed=0),
    "arithmetic-sft": ArithmeticFile(split="train", n=20000, seed=1, kind="sft"),
    "arithmetic-sft-val": ArithmeticFile(split="val", n=200, seed=1, kind="sft"),
    # DPO pairs: the right answer over a near miss
    "arithmetic-pairs": ArithmeticFile(split="train", n=20000, seed=3, kind="preference"),
    # products of two numbers up to 49, which the tiny model cannot compute itself but a calculator can
    "arithmetic-products": ArithmeticFile(split="train", n=20000, seed=0, ops=("*",)),
    "arithmetic-products-val": ArithmeticFile(split="val", n=200, seed=0, ops=("*",)),
    # counting ("7..10=" -> "7 8 9 10"): answers of 1 to 47 characters, most short (a long tail of lengths)
    "counting": ArithmeticFile(split="train", n=20000, seed=0, ops=("..",), max_operand=999),
    "counting-val": ArithmeticFile(split="val", n=200, seed=0, ops=("..",), max_operand=999),
    "counting-sft": ArithmeticFile(split="train", n=20000, seed=1, kind="sft", ops=("..",), max_operand=999),
    # 600 conversations: 30% call the calculator, the others answer at once
    "arithmetic-tools-sft": ArithmeticFile(split="train", n=600, seed=1, kind="tools_sft", ops=("*",), tool_share=0.3),
}


def write_arithmetic_parquet(
    cache_dir: str | os.PathLike | None,
    n_train: int,
    n_val: int,
    seed: int,
    *,
    max_operand: int = 49,
) -> tuple[str, str]:
    """(train_path, val_path) of RL parquet files with these settings, cached under `cache_dir`."""
    train = ArithmeticFile(split="train", n=n_train, seed=seed, max_operand=max_operand)
    val = ArithmeticFile(split="val", n=n_val, seed=seed, max_operand=max_operand)
    return train.materialize(cache_dir), val.materialize(cache_dir)
