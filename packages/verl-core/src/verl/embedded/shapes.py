"""The embedded visual task: count the coloured shapes in a small generated image ("<image>How many shapes?" -> "3").

Each image is SIZE x SIZE pixels on white, cut into a 2 x 2 grid of cells; 1 to 4 of the cells hold one filled square
or disc of a random colour, size and position inside its cell, so shapes never touch and the count is exact. Rows
are in verl's RL format with an `images` column (a list of {"bytes": PNG} per row, as upstream verl and Hugging Face
datasets store images) and an `<image>` placeholder where the image sits in the prompt. The train and val splits
draw from different seeds.
"""

from __future__ import annotations

import io
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

from verl.embedded.cache import cache_root, cached_file, settings_hash

DATA_SOURCE = "embedded/shapes"
FORMAT_VERSION = 1  # bump when the rows change, so old cache entries are not reused
SIZE = 56  # pixels a side: 4 x 4 patches of 14, 4 image tokens after Qwen2.5-VL's 2 x 2 merge
CELL = SIZE // 2
MAX_SHAPES = 4
QUESTION = "<image>How many shapes?"
COLOURS = {"red": (220, 40, 40), "green": (30, 160, 60), "blue": (40, 80, 220), "black": (20, 20, 20)}
SPLIT_SEEDS = {"train": 0, "val": 1_000_003}  # the splits' images come from different random streams


def draw_shapes(rng: np.random.Generator, count: int) -> Image.Image:
    """An RGB image with `count` shapes, one in each of `count` random cells of the 2 x 2 grid."""
    image = Image.new("RGB", (SIZE, SIZE), "white")
    pen = ImageDraw.Draw(image)
    colours = list(COLOURS.values())
    for cell in rng.choice(MAX_SHAPES, size=count, replace=False):
        side = int(rng.integers(10, CELL - 5))
        x = (cell % 2) * CELL + int(rng.integers(2, CELL - side - 1))
        y = (cell // 2) * CELL + int(rng.integers(2, CELL - side - 1))
        box = (x, y, x + side, y + side)
        fill = colours[int(rng.integers(len(colours)))]
        (pen.rectangle if rng.random() < 0.5 else pen.ellipse)(box, fill=fill)
    return image


def png_bytes(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def make_shapes_rows(n: int, *, split: str, seed: int = 0, kind: str = "rl") -> list[dict[str, Any]]:
    """`n` rows of the counting task: RL rows (data_source, prompt, images, ability, reward_model, extra_info), or
    with kind="sft" worked examples (prompt, images, response: the count)."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"split must be one of {sorted(SPLIT_SEEDS)}, got {split!r}")
    rng = np.random.default_rng([SPLIT_SEEDS[split], seed])
    rows = []
    for i in range(n):
        count = int(rng.integers(1, MAX_SHAPES + 1))
        prompt, images = [{"role": "user", "content": QUESTION}], [{"bytes": png_bytes(draw_shapes(rng, count))}]
        if kind == "sft":
            rows.append({"prompt": prompt, "images": images, "response": str(count)})
            continue
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": prompt,
                "images": images,
                "ability": "vision",
                "reward_model": {"style": "rule", "ground_truth": str(count)},
                "extra_info": {"split": split, "index": i},
            }
        )
    return rows


@dataclass(frozen=True)
class ShapesFile:
    """One cached parquet file of the counting task."""

    split: str
    n: int
    seed: int = 0
    kind: str = "rl"  # rl | sft

    def path(self, cache_dir: str | os.PathLike | None) -> Path:
        key = {"format": FORMAT_VERSION, "size": SIZE, **asdict(self)}
        return cache_root(cache_dir) / "data" / f"shapes-{self.kind}-{self.split}-{settings_hash(key)}.parquet"

    def materialize(self, cache_dir: str | os.PathLike | None = None) -> str:
        """The file's path, written on first use."""
        rows = lambda: make_shapes_rows(self.n, split=self.split, seed=self.seed, kind=self.kind)  # noqa: E731
        return str(cached_file(self.path(cache_dir), lambda tmp: pq.write_table(pa.Table.from_pylist(rows()), tmp)))


SHAPES_DATASETS: dict[str, ShapesFile] = {
    "shapes": ShapesFile(split="train", n=4000),
    "shapes-val": ShapesFile(split="val", n=200),
    "shapes-sft": ShapesFile(split="train", n=4000, seed=1, kind="sft"),  # worked examples for a warm start
}
