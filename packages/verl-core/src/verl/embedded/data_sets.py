"""What "embedded:NAME" names in data.train_files / data.val_files (and in an SFT warm start's files): the
arithmetic task's files (verl.embedded.arithmetic) and the visual counting task's (verl.embedded.shapes)."""

from __future__ import annotations

from typing import Union

from verl.embedded.arithmetic import ARITHMETIC_DATASETS, ArithmeticFile
from verl.embedded.shapes import SHAPES_DATASETS, ShapesFile

EMBEDDED_DATASETS: dict[str, Union[ArithmeticFile, ShapesFile]] = {**ARITHMETIC_DATASETS, **SHAPES_DATASETS}
