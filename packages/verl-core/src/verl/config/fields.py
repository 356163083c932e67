"""What a config field states beyond its type (`one_of`, `at_least`, `checked`, ...: read by
`verl.config.validate`), and how the schema is read (`field_types`, `strip_optional`, `is_section`)."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import field
from functools import cache
from typing import Any, Callable, Dict, Optional, Union


def one_of(default: Any, *choices: str) -> Any:
    """A field whose value must be one of `choices` (checked by validate, with a did-you-mean)."""
    return field(default=default, metadata={"choices": choices})


def checked(default: Any, ok: Callable[[Any], bool], message: str, fix: str) -> Any:
    """A field whose value (when set) must pass `ok`; `message` and `fix` may name {key} and {v} (the value)."""
    if isinstance(default, (list, dict)):  # a mutable default needs a factory
        return field(default_factory=lambda: type(default)(default), metadata={"check": (ok, message, fix)})
    return field(default=default, metadata={"check": (ok, message, fix)})


def at_least(default: Any, bound: int) -> Any:
    """A numeric field whose value (when set) must be >= bound."""
    return checked(default, lambda v: v >= bound, f"must be >= {bound}, got {{v}}", f"set {{key}}={bound} or more")


def positive(default: Any) -> Any:
    """A number that must be > 0."""
    return checked(default, lambda v: v > 0, "must be > 0, got {v}", "set {key} to a positive value")


def non_negative(default: Any) -> Any:
    """A number that must be >= 0."""
    return checked(default, lambda v: v >= 0, "must be >= 0, got {v}", "set {key} to 0 or a positive value")


def fraction(default: Any) -> Any:
    """A number in [0, 1]."""
    return checked(default, lambda v: 0 <= v <= 1, "must be in [0, 1], got {v}", "set {key} to a value in [0, 1]")


def any_finite(default: Optional[float]) -> Any:
    """A float whose range another check states (or any finite value: NaN and inf are refused for every float)."""
    return checked(default, lambda v: True, "", "")


def sampling_temperature(default: float) -> Any:
    """A sampling temperature: >= 0, where 0 is greedy."""
    return checked(default, lambda v: v >= 0, "must be >= 0, got {v}", "set {key}=0 (greedy) or a positive value")


# Sizes the placement arithmetic needs before anything else (verl.config.placement checks them, >= 1).
def size(default: Any) -> Any:
    """A device or parallel size, checked by the placement arithmetic (>= 1)."""
    return field(default=default, metadata={"checked_by": "placement"})


@cache
def field_types(cls: type) -> Dict[str, Any]:
    """Field name -> resolved type (this module uses `from __future__ import annotations`, so strings)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def strip_optional(tp: Any) -> Any:
    """X for Optional[X] and X | None; any other type as it is."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)
