"""The embedded visual counting task: each image holds exactly the shapes its answer counts, the rows are in verl's
RL format with an images column, the splits differ, and the files are cached."""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from verl.embedded.data_sets import EMBEDDED_DATASETS
from verl.embedded.shapes import CELL, MAX_SHAPES, SIZE, make_shapes_rows
from verl.reward.dispatch import scorer_for


def _occupied_cells(png: bytes) -> int:
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert pixels.shape == (SIZE, SIZE, 3)
    ink = (pixels < 250).any(axis=-1)
    return sum(bool(ink[r * CELL : (r + 1) * CELL, c * CELL : (c + 1) * CELL].any()) for r in (0, 1) for c in (0, 1))


def test_each_image_holds_the_count_its_answer_says():
    rows = make_shapes_rows(300, split="train")
    counts = [int(r["reward_model"]["ground_truth"]) for r in rows]
    assert [_occupied_cells(r["images"][0]["bytes"]) for r in rows] == counts
    assert set(counts) == set(range(1, MAX_SHAPES + 1))
    assert all(abs(counts.count(k) / len(counts) - 1 / MAX_SHAPES) < 0.08 for k in range(1, MAX_SHAPES + 1))


def test_rows_are_verl_rl_format_with_one_image_placeholder():
    row = make_shapes_rows(1, split="val")[0]
    assert row["data_source"] == "embedded/shapes" and row["ability"] == "vision"
    assert row["prompt"] == [{"role": "user", "content": "<image>How many shapes?"}]
    assert len(row["images"]) == 1 and row["extra_info"] == {"split": "val", "index": 0}
    truth = row["reward_model"]["ground_truth"]
    assert scorer_for(row["data_source"])("", f"{truth}\n", truth, {}) == 1.0
    assert scorer_for(row["data_source"])("", "5", truth, {}) == 0.0


def test_same_seed_same_images_and_the_splits_differ():
    train = [r["images"][0]["bytes"] for r in make_shapes_rows(50, split="train")]
    assert train == [r["images"][0]["bytes"] for r in make_shapes_rows(50, split="train")]
    assert not set(train) & {r["images"][0]["bytes"] for r in make_shapes_rows(50, split="val")}


def test_embedded_files_are_written_once(embedded_cache):
    path = EMBEDDED_DATASETS["shapes-val"].materialize(embedded_cache)
    table = pq.read_table(path)
    assert table.num_rows == 200 and {"data_source", "prompt", "images", "reward_model"} <= set(table.column_names)
    assert EMBEDDED_DATASETS["shapes-val"].materialize(embedded_cache) == path
