"""Per-sample tools in an RL data row's `extra_info` (verl's multi-turn format):

- `tools`: the names of the agent's tools this sample may call (default: all of them). Its prompt is rendered
  with those schemas only, and a call to another is answered as an unknown tool.
- `tools_kwargs`: `{tool name: {keyword: value}}`, arguments the tool receives on every call of this sample
  besides the model's (a sample's answer key, a file, a seed): the model neither sees nor sets them (they win
  over a model argument of the same name). A JSON string holding that mapping is read too, since parquet
  struct columns give every row every key (a tool the row does not name comes back as None and is skipped).

Both are checked when the data is read, with the file, the row and what would fix it.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence


def row_tools(extra: Dict[str, Any], names: Sequence[str], path: str, row: int) -> Optional[List[str]]:
    """The row's tool names (None: every tool), each one of `names`."""
    value = extra.get("tools")
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{path}: row {row}: extra_info.tools must be a list of tool names, got {value!r}")
    unknown = [v for v in value if v not in names]
    if unknown:
        raise ValueError(
            f"{path}: row {row}: extra_info.tools names {unknown}, not among rollout.agent.tools {list(names)}; "
            "list the tool in rollout.agent.tools or drop it from the row"
        )
    return list(value)


def row_tool_kwargs(extra: Dict[str, Any], names: Sequence[str], path: str, row: int) -> Dict[str, Dict[str, Any]]:
    """The row's hidden tool arguments by tool name ({} when it has none)."""
    value = extra.get("tools_kwargs")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"{path}: row {row}: extra_info.tools_kwargs is a string but not JSON: {e}") from None
    if value is None:
        return {}
    where = f"{path}: row {row}: extra_info.tools_kwargs"
    if not isinstance(value, dict):
        raise ValueError(f"{where} must map tool names to {{keyword: value}}, got {value!r}")
    out = {}
    for name, kwargs in value.items():
        if kwargs is None:
            continue
        if name not in names:
            raise ValueError(f"{where} names tool {name!r}, not among rollout.agent.tools {list(names)}")
        if not isinstance(kwargs, dict):
            raise ValueError(f"{where}[{name!r}] must be a {{keyword: value}} mapping, got {kwargs!r}")
        out[name] = dict(kwargs)
    return out
