"""Load a recipe: a YAML file plus `key=value` overrides, merged onto the `VerlConfig` schema.

Every problem is collected before anything is raised, so one run of the CLI shows them all:
YAML syntax, unknown keys (with a did-you-mean and the file:line:col of the key), wrong types,
required values left `???`, and interpolations that do not resolve.

We walk the user's data against the schema dataclasses ourselves instead of a single
`OmegaConf.merge`, because OmegaConf stops at the first bad key and knows nothing of file lines.
Each known key is still merged by OmegaConf, one at a time, so its conversion rules apply ("1" -> 1).
"""

from __future__ import annotations

import difflib
import functools
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Iterator, List, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, OmegaConfBaseException

from verl.config.errors import ConfigError, ConfigProblem, errors
from verl.config.recipe_text import KeyPath, describe, dotted_key, nest, parse_all, read_recipe
from verl.config.schema import REMOVED_KEYS, VerlConfig, field_types, is_section, strip_optional

Locate = Callable[[KeyPath], str | None]
Container = Any  # a DictConfig or ListConfig, walked by str or int keys (its stubs index a ListConfig by int only)

__all__ = ["load_config", "read_config", "parse_overrides", "to_yaml"]


def load_config(path: str | os.PathLike | Mapping, overrides: Sequence[str] = ()) -> DictConfig:
    """Recipe file (or a plain dict of sections) + key=value overrides merged onto the schema; raises
    ConfigError listing every problem."""
    cfg, problems = read_config(path, overrides)
    if cfg is None or errors(problems):
        raise ConfigError(problems)
    return cfg


def read_config(
    path: str | os.PathLike | Mapping, overrides: Sequence[str] = ()
) -> tuple[DictConfig | None, list[ConfigProblem]]:
    """Like `load_config`, but returns the problems instead of raising.

    The config comes back even with problems (bad keys are left at their defaults) so that a caller
    can go on to check the rest; it is None only when the file itself could not be read or parsed.
    """
    cfg = OmegaConf.structured(VerlConfig)
    if isinstance(path, DictConfig):  # a recipe given as data: the same checks, without file locations
        data: Any = OmegaConf.to_container(path, resolve=False)
        locations: dict[str, str] = {}
        problems: list[ConfigProblem] = []
    elif isinstance(path, Mapping):
        data, locations, problems = dict(path), {}, []
    else:
        data, locations, problems = read_recipe(path)
    if data:
        _apply_section(cfg, VerlConfig, data, (), lambda p: locations.get(dotted_key(p)), problems)
    parsed, override_problems = parse_all(overrides)
    problems += override_problems
    for text, key_path, value in parsed:
        where = f"override '{text}'"
        locations[dotted_key(key_path)] = where
        _apply_section(cfg, VerlConfig, nest(key_path, value), (), functools.partial(_fixed, where), problems)
    # An unreadable file would make every required key look missing: report only the file.
    if data is not None:
        problems += _missing_problems(cfg, locations, problems)
        problems += _interpolation_problems(cfg, locations)
    return (cfg if data is not None else None), problems


def _fixed(where: str, _path: Any) -> str:
    """A location function that names one place (an override) whatever the key."""
    return where


def parse_overrides(overrides: Sequence[str]) -> tuple[dict, list[ConfigProblem]]:
    """Parse `a.b.c=value` strings (values as YAML) into one nested dict, plus a problem per bad one.

    List indices stay as digit strings ("placement.pools.0.devices=4" -> {"placement": {"pools": {"0": ...}}});
    `load_config` applies them to the existing list elements.
    """
    nested: dict = {}
    parsed, problems = parse_all(overrides)
    for _text, key_path, value in parsed:
        node = nested
        for part in key_path[:-1]:
            if not isinstance(node.get(part), dict):  # a later override wins over an earlier scalar
                node[part] = {}
            node = node[part]
        node[key_path[-1]] = value
    return nested, problems


def to_yaml(cfg: DictConfig, resolve: bool = True) -> str:
    """The config as YAML for printing; with resolve=True every ${...} is replaced by its value."""
    try:
        return OmegaConf.to_yaml(cfg, resolve=resolve)
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        raise ConfigError(
            [ConfigProblem(key, f"cannot resolve: {_first_line(e)}", fix="point the interpolation at an existing key")]
        ) from None


def _list_element(tp: Any) -> Any | None:
    """The element type of List[X] (Any when bare), or None when tp is not a list type."""
    if typing.get_origin(tp) is list:
        args = typing.get_args(tp)
        return args[0] if args else Any
    return None


def _apply_section(
    node: DictConfig, schema: type, data: Mapping, path: KeyPath, locate: Locate, problems: list[ConfigProblem]
) -> None:
    """Merge user data into one schema section key by key: unknown keys and bad values become problems."""
    fields = field_types(schema)
    for raw_key, value in data.items():
        key = str(raw_key)
        key_path = path + (key,)
        if key not in fields:
            problems.append(_unknown_key(key_path, list(fields), locate(key_path)))
            continue
        _apply_value(node, key, fields[key], value, key_path, locate, problems)


def _apply_value(
    parent: Container, key: str | int, tp: Any, value: Any, path: KeyPath, locate: Locate, problems: list[ConfigProblem]
) -> None:
    base = strip_optional(tp)
    element = _list_element(base)
    if is_section(base) and isinstance(value, Mapping):
        if not _make_section(parent, key, tp, path, locate, problems):
            return
        _apply_section(parent[key], base, value, path, locate, problems)
    elif is_section(element) and isinstance(value, list):
        # Lay down default elements, then fill each one so a bad key inside gets its own path and line.
        if _merge(parent, key, [{} for _ in value], tp, path, locate, problems):
            for index, item in enumerate(value):
                _apply_value(parent[key], index, element, item, path + (index,), locate, problems)
    elif isinstance(value, Mapping) and value and all(_is_index(k) for k in value) and _is_list(parent, key):
        _apply_indices(parent[key], element if element is not None else Any, value, path, locate, problems)
    else:
        _merge(parent, key, value, tp, path, locate, problems)


def _make_section(
    parent: Container, key: str | int, tp: Any, path: KeyPath, locate: Locate, problems: list[ConfigProblem]
) -> bool:
    """Give a None or interpolated section a concrete value, so keys can be merged into it."""
    if OmegaConf.is_interpolation(parent, key):
        # ref.parallel: ${actor.parallel} then ref.parallel.tp=2 means "the actor's layout with tp=2".
        try:
            start = OmegaConf.to_container(parent[key], resolve=True)
        except OmegaConfBaseException:
            start = {}
        return _merge(parent, key, start if start is not None else {}, tp, path, locate, problems)
    if OmegaConf.is_missing(parent, key) or parent[key] is None:
        return _merge(parent, key, {}, tp, path, locate, problems)
    return True


def _apply_indices(
    node: ListConfig, element: Any, value: Mapping, path: KeyPath, locate: Locate, problems: list[ConfigProblem]
) -> None:
    """Overrides such as placement.pools.0.devices=4 address elements of an existing list."""
    for raw_index, item in value.items():
        index = int(raw_index)
        if not 0 <= index < len(node):
            problems.append(
                ConfigProblem(
                    dotted_key(path + (index,)),
                    f"list index {index} out of range: the list has {len(node)} element(s)",
                    fix=f"use an index below {len(node)}, or set the whole list {dotted_key(path)}=[...]",
                    location=locate(path + (index,)),
                )
            )
            continue
        _apply_value(node, index, element, item, path + (index,), locate, problems)


def _merge(
    parent: Container, key: str | int, value: Any, tp: Any, path: KeyPath, locate: Locate, problems: list[ConfigProblem]
) -> bool:
    """Let OmegaConf convert and check one value; a failure becomes a problem at that key."""
    try:
        if isinstance(parent, ListConfig):
            # OmegaConf.update converts list elements without the deprecated implicit-assignment path.
            OmegaConf.update(parent, str(key), value, merge=True)
        else:
            parent.merge_with({key: value})
        return True
    except OmegaConfBaseException as e:
        problems.append(_type_problem(path, tp, value, e, locate(path)))
        return False


def _is_index(key: Any) -> bool:
    return isinstance(key, int) or (isinstance(key, str) and key.isdigit())


def _is_list(parent: Container, key: str | int) -> bool:
    if OmegaConf.is_missing(parent, key) or OmegaConf.is_interpolation(parent, key):
        return False
    return isinstance(parent[key], ListConfig)


@functools.cache
def _schema_keys(schema: type, prefix: str = "") -> tuple[str, ...]:
    """Every dotted key of the schema (sections recursed into)."""
    keys: list[str] = []
    for name, tp in field_types(schema).items():
        tp = strip_optional(tp)
        keys += _schema_keys(tp, f"{prefix}{name}.") if is_section(tp) else [f"{prefix}{name}"]
    return tuple(keys)


def _unknown_key(path: KeyPath, valid: list[str], location: str | None) -> ConfigProblem:
    key = str(path[-1])
    if dotted_key(path) in REMOVED_KEYS:
        return ConfigProblem(
            dotted_key(path), f"'{dotted_key(path)}' was removed", fix=REMOVED_KEYS[dotted_key(path)], location=location
        )
    guess = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    section = dotted_key(path[:-1]) or "the top level"
    if guess:
        message = f"unknown key '{key}'; did you mean '{guess[0]}'?"
        fix = f"rename it to {dotted_key(path[:-1] + (guess[0],))}"
    else:
        message = f"unknown key '{key}' in {section}"
        fix = f"valid keys in {section}: {', '.join(sorted(valid))}"
    elsewhere = [k for k in _schema_keys(VerlConfig) if k.rpartition(".")[2] == key]
    if elsewhere:  # the right name in the wrong section: trainer.save_every for checkpoint.save_every
        message += f" ({' and '.join(elsewhere)} {'exists' if len(elsewhere) == 1 else 'exist'})"
        fix = f"move it to {elsewhere[0]}" + (f", or {fix}" if guess else "")
    return ConfigProblem(dotted_key(path), message, fix=fix, location=location)


def _type_problem(path: KeyPath, tp: Any, value: Any, error: Exception, location: str | None) -> ConfigProblem:
    expected = _type_name(tp)
    message = f"expected {expected}, got {describe(value)}"
    if isinstance(value, (list, dict)):  # say which element failed; for scalars the line above says it all
        message += f" ({_first_line(error)})"
    return ConfigProblem(
        dotted_key(path), message, fix=f"give {dotted_key(path)} a value of type {expected}", location=location
    )


def _type_name(tp: Any) -> str:
    if tp is Any:
        return "any value"
    base = strip_optional(tp)
    if base is not tp:
        return f"{_type_name(base)} or null"
    element = _list_element(tp)
    if element is not None:
        return f"list of {_type_name(element)}"
    if typing.get_origin(tp) is dict:
        return "mapping"
    if is_section(tp):
        return f"mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _nearest_location(locations: dict[str, str], path: KeyPath) -> str | None:
    """The location of the key, or of its closest ancestor that the user wrote."""
    for end in range(len(path), 0, -1):
        where = locations.get(dotted_key(path[:end]))
        if where:
            return where
    return None


def _walk(node: Container, path: Tuple[Any, ...] = ()) -> Iterator[Tuple[Any, Any, Tuple[Any, ...]]]:
    """Yield (parent, key, path) for every key, without resolving interpolations or missing values."""
    keys: List[Any] = list(node.keys()) if isinstance(node, DictConfig) else list(range(len(node)))
    for key in keys:
        key_path = path + (key,)
        yield node, key, key_path
        if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
            continue
        child = node[key]
        if isinstance(child, (DictConfig, ListConfig)):
            yield from _walk(child, key_path)


def _missing_problems(cfg: DictConfig, locations: dict[str, str], found: list[ConfigProblem]) -> list[ConfigProblem]:
    reported = {p.key for p in found}
    problems = []
    for parent, key, path in _walk(cfg):
        dotted = dotted_key(path)
        if not OmegaConf.is_missing(parent, key) or _suggested(dotted, found):
            continue
        # A key (or section) that already failed to merge keeps its default ???: one problem is enough.
        if any(dotted_key(path[:end]) in reported for end in range(1, len(path) + 1)):
            continue
        problems.append(
            ConfigProblem(
                dotted,
                "missing required value",
                fix=f"set {dotted} in the recipe or pass {dotted}=VALUE",
                location=_nearest_location(locations, path),
            )
        )
    return problems


def _suggested(dotted: str, found: list[ConfigProblem]) -> bool:
    """True when a typo'd key already suggests this one: its rename fix covers the missing value."""
    parent, _, leaf = dotted.rpartition(".")
    return any(p.key.rpartition(".")[0] == parent and f"did you mean '{leaf}'?" in p.message for p in found)


def _interpolation_problems(cfg: DictConfig, locations: dict[str, str]) -> list[ConfigProblem]:
    problems = []
    for parent, key, path in _walk(cfg):
        if not OmegaConf.is_interpolation(parent, key):
            continue
        try:
            parent[key]
        except InterpolationToMissingValueError:
            continue  # the missing key it points at is reported on its own
        except OmegaConfBaseException as e:
            raw = OmegaConf.to_container(parent, resolve=False)[key]
            problems.append(
                ConfigProblem(
                    dotted_key(path),
                    f"cannot resolve interpolation {raw!r}: {_first_line(e)}",
                    fix="point it at an existing key with a value of the right type, e.g. ${tracking.project}",
                    location=_nearest_location(locations, path),
                )
            )
    return problems
