"""What every config check shares: the context it reads and how it words a problem."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence

from omegaconf import DictConfig

from verl.config.errors import ConfigProblem
from verl.config.plan import Draft


@dataclass(frozen=True)
class Context:
    cfg: DictConfig
    strict: bool
    installed: Optional[Mapping[str, Any]]  # backends by name (verl.backends.BackendSpec)
    draft: Draft


Check = Callable[[Context], List[ConfigProblem]]


def error_at(key: str, message: str, fix: str = "") -> ConfigProblem:
    return ConfigProblem(key, message, fix)


def warning_at(key: str, message: str, fix: str = "") -> ConfigProblem:
    return ConfigProblem(key, message, fix, severity="warning")


def not_one_of(key: str, got: Any, allowed: Sequence[str]) -> List[ConfigProblem]:
    if got in allowed:
        return []
    close = difflib.get_close_matches(str(got), allowed, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return [
        error_at(key, f"'{got}' is not one of {', '.join(allowed)}", f"{hint}set {key} to one of {', '.join(allowed)}")
    ]
