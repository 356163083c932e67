"""`verl data prepare NAME`: the data sets users start with, written in verl's RL parquet format.

Each set is a converter registered in DATA_SETS: it turns one record of the set's own published layout into a row
with `data_source` (what `reward.fn: default` picks the scorer by), `prompt` (chat messages: the question and the
answer format the scorer reads), `ability`, `reward_model: {style: rule, ground_truth}` and `extra_info` (split,
index, the fields a scorer needs). Sources: a local file (parquet, .jsonl or .json, as the set publishes it) or a
Hugging Face dataset id (read with the `datasets` library, where the network allows). Generated sets
(reasoning-gym) take no input. Writes OUT/<split>.parquet.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from verl.registry import Registry

Converter = Callable[[Dict[str, Any], int, str], Optional[Dict[str, Any]]]

# name -> converter of one record (record, index, split) -> row or None (skipped, counted); attributes set by
# `register_data_set`: hub_id (where the set is published; None: generated), hub_config, layout (what a record
# holds, said when a file cannot be read). A generated set's function takes (split, size, seed, **options).
DATA_SETS = Registry("data set", builtins=("verl.data.sets",))


def register_data_set(name: str, *, hub_id: Optional[str], layout: str, hub_config: Optional[str] = None) -> Any:
    """Decorator: `verl data prepare <name>` converts records (or, with hub_id None, generates rows) with it."""
    return DATA_SETS.register(name, hub_id=hub_id, layout=layout, hub_config=hub_config)


def rl_row(
    source: str,
    text: str,
    ground_truth: str,
    split: str,
    index: int,
    ability: str = "math",
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """One row of verl's RL format: `text` as one user turn, the answer for the scorer, `extra` in extra_info."""
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": text}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": str(ground_truth)},
        "extra_info": {"split": split, "index": index, **(extra or {})},
    }


def read_records(source: str, split: str, name: str) -> List[Dict[str, Any]]:
    """The records of a local file (parquet, jsonl, json: a list of records or one record) or of a Hub dataset."""
    if os.path.isfile(source):
        if source.endswith(".parquet"):
            return pq.read_table(source).to_pylist()
        with open(source) as f:
            if source.endswith(".jsonl"):
                return [json.loads(line) for line in f if line.strip()]
            data = json.load(f)
        return data if isinstance(data, list) else [data]
    if os.path.isdir(source):  # MATH's own release: one json file per problem, in folders by subject
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(source) for f in fs if f.endswith(".json"))
        if not files:
            raise FileNotFoundError(f"{source}: a folder with no .json records in it")
        return [record for path in files for record in read_records(path, split, name)]
    try:
        import datasets  # pants: no-infer-dep (optional: reading from the Hub)
    except ImportError:
        raise FileNotFoundError(
            f"--input {source!r} is not a file here, and reading a Hub dataset needs the `datasets` package; "
            f"download the set ({DATA_SETS.attr(name, 'hub_id')}: {DATA_SETS.attr(name, 'layout')}) and pass the file"
        ) from None
    return list(datasets.load_dataset(source, DATA_SETS.attr(name, "hub_config"), split=split))


def prepare(
    name: str,
    out_dir: str,
    *,
    source: Optional[str] = None,
    split: str = "train",
    limit: Optional[int] = None,
    quiet: bool = False,
    **kw: Any,
) -> str:
    """Write OUT/<split>.parquet from `source` (a file or Hub id; default the set's Hub id) or, for a generated
    set, from `kw` (size, seed, task); returns the path. Records the converter skips are counted and said (unless
    `quiet`: the caller says where the file ends up)."""
    convert = DATA_SETS.get(name, key="verl data prepare")
    hub_id = DATA_SETS.attr(name, "hub_id")
    rows, skipped = [], 0
    if hub_id is None:  # generated
        rows = convert(split=split, **kw)
    else:
        where = source or hub_id
        for i, record in enumerate(read_records(where, split, name)):
            try:
                row = convert(record, i, split)
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(
                    f"{where}: record {i} is not in the {name} layout {DATA_SETS.attr(name, 'layout')} "
                    f"({type(e).__name__}: {e}); "
                    f"it has the fields {sorted(record) if isinstance(record, dict) else type(record).__name__}"
                ) from e
            if row is None:
                skipped += 1
            else:
                rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
    rows = rows[:limit]
    if not rows:
        raise ValueError(f"verl data prepare {name}: no records converted from {source or name} ({skipped} skipped)")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{split}.parquet")
    tmp = path + ".tmp"
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)  # (a reader never sees half a file)
    note = f" ({skipped} records without a usable answer skipped)" if skipped else ""
    if not quiet:
        print(f"verl data prepare {name}: {len(rows)} rows -> {path}{note}", flush=True)
    return path
