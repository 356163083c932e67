"""Rendered and tokenised prompts kept between runs.

Rendering a data file's chat template and tokenising it is most of a small run's data loading (20k prompts:
~2 s on a 2-core machine; a large corpus takes minutes), and the result depends only on the file and the
tokenizer. An entry is keyed by the file (path, size, modification time) and the tokenizer's full definition
(its serialised pipeline, vocabulary and chat template), so an edited file or another tokenizer gets a new
entry; entries are written whole and renamed into place (`verl.embedded.cache.cached_file`). A tokenizer
that cannot be serialised (a slow, Python-only one) is not cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

from verl.embedded.cache import cache_root, cached_file

logger = logging.getLogger(__name__)
FORMAT_VERSION = 1
Prompts = Tuple[List[str], List[List[int]]]  # texts, token ids


def tokenizer_fingerprint(tokenizer: Any) -> Optional[str]:
    """A hash of everything that decides how a text becomes ids and a conversation becomes text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    parts = [type(tokenizer).__name__, backend.to_str(), str(tokenizer.chat_template)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _key(path: str, tokenizer_hash: str, column: str) -> str:
    stat = os.stat(path)
    entry = {
        "format": FORMAT_VERSION,
        "file": os.path.realpath(path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "column": column,
        "tokenizer": tokenizer_hash,
    }
    return hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:20]


def cached_prompts(
    path: str,
    tokenizer: Any,
    column: str,
    compute: Callable[[], Prompts],
    cache_dir: str | os.PathLike | None = None,
) -> Prompts:
    """`compute()` (the texts and ids of `path`'s prompts), from the cache when this file and tokenizer made it
    before; a cache that cannot be written only costs the recomputation."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint is None:
        return compute()
    final = cache_root(cache_dir).parent / "prompts" / f"{_key(path, fingerprint, column)}.parquet"
    result: dict = {}

    def write(tmp: Path) -> None:
        result["prompts"] = texts, ids = compute()
        pq.write_table(pa.table({"text": texts, "ids": ids}), tmp)

    try:
        cached_file(final, write)
    except OSError as err:  # a read-only or full cache: tokenise without it
        logger.warning("prompt cache %s not written (%s); prompts are tokenised each run", final, err)
        return result.get("prompts") or compute()
    if "prompts" in result:
        return result["prompts"]
    table = pq.read_table(final)
    return table.column("text").to_pylist(), table.column("ids").to_pylist()
