"""A recipe as data: the YAML file read with each key's file:line:column, and `key=value` overrides parsed.

What the loader merges onto the schema (`verl.config.loader`); problems name the file position or override.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, List

import yaml

from verl.config.errors import ConfigProblem

KeyPath = tuple[str | int, ...]  # str for mapping keys, int for list indices


class RecipeLoader(yaml.SafeLoader):
    """SafeLoader with OmegaConf's scalar rules: `1e-6` is a float, dates stay strings."""


RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)
RecipeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in RecipeLoader.yaml_implicit_resolvers.items()
}


def read_recipe(path: str | os.PathLike) -> tuple[Mapping | None, dict[str, str], list[ConfigProblem]]:
    """The file's data (None when unusable), "file:line:col" of every key by dotted path, and problems."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        fix = f"check the path (relative paths start at {os.getcwd()})"
        return None, {}, [ConfigProblem("", f"recipe file '{name}' not found", fix=fix, location=name)]
    except (OSError, UnicodeDecodeError) as e:
        return None, {}, [ConfigProblem("", f"cannot read recipe file '{name}': {e}", location=name)]

    loader = RecipeLoader(text)
    try:
        # Compose first: the node tree keeps each key's line/column, the plain data does not.
        node = loader.get_single_node()
        locations: dict[str, str] = {}
        problems: list[ConfigProblem] = []
        if node is not None:
            _record_locations(node, (), name, locations, problems, set())
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        return None, {}, [_yaml_problem(e, name)]
    except yaml.YAMLError as e:
        return None, {}, [ConfigProblem("", f"invalid YAML: {e}", location=name)]
    finally:
        loader.dispose()

    if data is None:  # an empty recipe: everything comes from defaults and overrides
        data = {}
    if not isinstance(data, Mapping):
        message = f"the top level must be a mapping of sections, got {describe(data)}"
        fix = "start the file with sections such as 'model:', 'data:', 'actor:'"
        return None, {}, [ConfigProblem("", message, fix=fix, location=f"{name}:1:1")]
    return data, locations, problems


def _yaml_problem(e: yaml.MarkedYAMLError, name: str) -> ConfigProblem:
    mark = e.problem_mark or e.context_mark
    message = f"invalid YAML: {e.problem or e.context or 'syntax error'}"
    if e.context and e.problem:
        message += f" ({e.context})"
    if mark is None:
        return ConfigProblem("", message, location=name)
    fix = f"fix the YAML at line {mark.line + 1}, column {mark.column + 1}"
    return ConfigProblem("", message, fix=fix, location=_mark(name, mark))


def _mark(name: str, mark: yaml.Mark) -> str:
    return f"{name}:{mark.line + 1}:{mark.column + 1}"  # yaml marks are 0-based


def _record_locations(
    node: yaml.Node, path: KeyPath, name: str, out: dict[str, str], problems: list[ConfigProblem], active: set
) -> None:
    """Walk the composed node tree: dotted key path -> location of the key (list items: of the item)."""
    if id(node) in active:  # a recursive alias (&a [*a]) would loop forever
        return
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_seen: dict[str, yaml.Mark] = {}
        for key_node, value_node in node.value:
            # '<<' merge keys and complex keys have no key path of their own.
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key_path = path + (key_node.value,)
            dotted = dotted_key(key_path)
            if key_node.value in first_seen:
                line = first_seen[key_node.value].line + 1
                problems.append(
                    ConfigProblem(
                        dotted,
                        f"duplicate key: this value would silently replace the one on line {line}",
                        fix="keep only one of them",
                        location=_mark(name, key_node.start_mark),
                    )
                )
            first_seen[key_node.value] = key_node.start_mark
            out[dotted] = _mark(name, key_node.start_mark)
            _record_locations(value_node, key_path, name, out, problems, active)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out[dotted_key(path + (index,))] = _mark(name, item.start_mark)
            _record_locations(item, path + (index,), name, out, problems, active)
    active.discard(id(node))


def parse_all(overrides: Sequence[str]) -> tuple[list[tuple[str, KeyPath, Any]], list[ConfigProblem]]:
    """Parse every `a.b.c=value` override; the good ones as (text, ("a", "b", "c"), value parsed as YAML),
    a problem naming the override per bad one."""
    parsed: List[Any] = []
    problems: List[ConfigProblem] = []
    for text in overrides:
        where = f"override '{text}'"
        key, sep, raw = text.partition("=")
        key = key.strip()
        parts = tuple(key.split("."))
        if text[:1] in ("+", "~"):
            problems.append(
                ConfigProblem(
                    text.lstrip("+~").split("=", 1)[0],
                    f"'{text[0]}' overrides are not supported: every key must already exist in the schema",
                    fix="drop the prefix and use KEY=VALUE with a key the schema defines",
                    location=where,
                )
            )
        elif not sep or not key or any(not part for part in parts):
            problems.append(
                ConfigProblem(
                    key if sep else "",
                    f"malformed override '{text}': " + ("empty key or key part" if sep else "expected KEY=VALUE"),
                    fix="write it as KEY=VALUE, e.g. actor.ppo_epochs=2",
                    location=where,
                )
            )
        elif raw.strip() == "???":  # merging OmegaConf's "missing" marker leaves the old value: it would do nothing
            problems.append(
                ConfigProblem(
                    key,
                    "'???' sets no value (it marks a required value in a schema)",
                    fix=f"give {key} a value, or drop the override to keep the recipe's",
                    location=where,
                )
            )
        elif raw == "":  # `key=` means the empty string, as in Hydra; write key=null for None
            parsed.append((text, parts, ""))
        else:
            try:
                parsed.append((text, parts, yaml.load(raw, Loader=RecipeLoader)))
            except yaml.YAMLError as e:
                reason = getattr(e, "problem", None) or str(e)
                message = f"cannot parse value {raw!r} as YAML: {reason}"
                problems.append(ConfigProblem(key, message, fix="quote the value, e.g. key='text'", location=where))
    return parsed, problems


def nest(key_path: KeyPath, value: Any) -> dict:
    for part in reversed(key_path):
        value = {part: value}
    return value


def describe(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def dotted_key(path: KeyPath) -> str:
    return ".".join(str(part) for part in path)
