"""What an entry of data.train_files / data.val_files (or a warm start's files) names, as a local parquet file:

- a path, as it is;
- `embedded:NAME`, an embedded data set built here (verl.embedded);
- `prepare:NAME?key=value&...`, what `verl data prepare NAME` writes with those settings, written once into the
  cache (keyed by the settings and, for `input=FILE`, the file's size and time): `split` (default train),
  `input` (a file or Hub id), `limit`, and a generated set's settings, e.g.
  `prepare:reasoning_gym?task=chain_sum&size=2000&seed=0&max_terms=2`. A recipe names its data this way and
  needs no set-up step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple
from urllib.parse import parse_qsl

from verl.embedded.cache import cache_root, cached_dir, embedded_name, is_embedded, settings_hash
from verl.embedded.data_sets import EMBEDDED_DATASETS

PREFIX = "prepare:"


def is_prepared(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def option_value(text: str) -> Any:
    """A setting's value as written: an int, a float, true/false, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_prepared(spec: str) -> Tuple[str, str, Optional[str], Optional[int], Dict[str, Any]]:
    """(name, split, input, limit, settings) of `prepare:NAME?key=value&...`; the name must be a known set."""
    from verl.data.prepare import DATA_SETS

    name, _, query = spec[len(PREFIX) :].partition("?")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(
            f"'{spec}': write the settings as key=value joined by & (prepare:NAME?key=value&...)"
        ) from None
    DATA_SETS.get(name, key=f"'{spec}'")  # (an unknown set names the known ones)
    settings = {key: option_value(text) for key, text in pairs}
    split = str(settings.pop("split", "train"))
    source = settings.pop("input", None)
    limit = settings.pop("limit", None)
    return name, split, None if source is None else str(source), limit, settings


def prepared_file(spec: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the parquet file of `spec` is cached (whether or not it is there yet)."""
    name, split, source, _, _ = parse_prepared(spec)
    key: Dict[str, Any] = {"spec": spec}
    if source is not None and os.path.exists(source):  # (a changed input file is prepared again)
        st = os.stat(source)
        key["input"] = {"path": os.path.abspath(source), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return cache_root(cache_dir) / "prepared" / f"{name}-{split}-{settings_hash(key)}" / f"{split}.parquet"


def materialize_prepared(spec: str, cache_dir: str | os.PathLike | None = None) -> str:
    """The parquet file of `spec`, prepared on first use."""
    from verl.data.prepare import prepare

    name, split, source, limit, settings = parse_prepared(spec)
    path = prepared_file(spec, cache_dir)

    def write(folder: Path) -> None:
        prepare(name, str(folder), source=source, split=split, limit=limit, quiet=True, **settings)

    if not path.is_file():
        cached_dir(path.parent, write)
        print(f"data: {spec} prepared -> {path}", flush=True)
    return str(path)


def resolve_data_files(files: Sequence[str], cache_dir: str | os.PathLike | None = None) -> list[str]:
    """Local parquet paths for data-file entries (see the module docstring)."""
    if isinstance(files, str):
        raise TypeError(f"files must be a list of paths, got the string {files!r}; write [{files!r}]")
    paths = []
    for f in files:
        if is_embedded(f):
            f = EMBEDDED_DATASETS[embedded_name(f, EMBEDDED_DATASETS, "data set")].materialize(cache_dir)
        elif is_prepared(f):
            f = materialize_prepared(f, cache_dir)
        paths.append(f)
    return paths
