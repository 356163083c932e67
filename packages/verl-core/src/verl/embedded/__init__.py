"""Embedded assets built locally, with no model hub: a character tokenizer, tiny models (one of them a
vision-language model), the arithmetic task and a visual counting task.

Recipes name them as "embedded:NAME" (model.path: embedded:tiny-llama, data.train_files:
[embedded:arithmetic]); they are written once into a cache folder and loaded like any other files.
"""

from verl.embedded.arithmetic import (
    make_arithmetic_rows,
    make_sft_rows,
    write_arithmetic_parquet,
)
from verl.embedded.cache import cache_root, is_embedded
from verl.embedded.data_sets import EMBEDDED_DATASETS
from verl.embedded.models import (
    EMBEDDED_MODELS,
    build_embedded_model,
    materialize_embedded_model,
    parse_embedded,
    resolve_model_path,
)
from verl.embedded.tokenizer import build_char_tokenizer

__all__ = [
    "EMBEDDED_DATASETS",
    "EMBEDDED_MODELS",
    "build_char_tokenizer",
    "build_embedded_model",
    "cache_root",
    "is_embedded",
    "make_arithmetic_rows",
    "make_sft_rows",
    "materialize_embedded_model",
    "parse_embedded",
    "resolve_model_path",
    "write_arithmetic_parquet",
]
