"""The on-disk cache of embedded assets (models, data sets) and the "embedded:NAME" strings naming them.

Assets are built locally from code, so a cache entry's name carries a short hash of every setting that
shapes it: changing a setting builds a new entry instead of reusing a stale one. Entries are written to a
temporary path and renamed into place, so a reader never sees a half-written entry and processes that
build the same entry at the same time all end up with one complete copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

PREFIX = "embedded:"
CACHE_ENV = "VERL_CACHE"


def is_embedded(path: str) -> bool:
    """Whether `path` names an embedded asset ("embedded:NAME") rather than a file or folder."""
    return isinstance(path, str) and path.startswith(PREFIX)


def embedded_name(path: str, known: Collection[str], what: str) -> str:
    """NAME from "embedded:NAME" (or a bare NAME), checked against the `known` names of `what` assets."""
    name = path[len(PREFIX) :] if is_embedded(path) else path
    if name not in known:
        listed = ", ".join(f"{PREFIX}{k}" for k in sorted(known))
        raise ValueError(f"unknown embedded {what} {path!r}; known embedded {what}s: {listed}")
    return name


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where embedded assets live: `cache_dir`, else $VERL_CACHE, else ~/.cache/verl; plus "embedded"."""
    root = cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "verl"
    return Path(root).expanduser() / "embedded"


def settings_hash(settings: Any) -> str:
    """A short, stable hash of JSON-serialisable settings (key order does not matter)."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def cached_dir(final: Path, write: Callable[[Path], None]) -> Path:
    """`final`, first filled by `write(tmp_dir)` and renamed into place unless it already exists."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        write(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the entry is meant to be shared
        os.replace(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        # Another process renamed its copy into place first (renaming onto a non-empty folder fails).
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def cached_file(final: Path, write: Callable[[Path], None]) -> Path:
    """`final`, first filled by `write(tmp_file)` and renamed into place unless it already exists."""
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)  # replacing a file is atomic; a concurrent writer wrote the same bytes
    finally:
        tmp.unlink(missing_ok=True)
    return final
