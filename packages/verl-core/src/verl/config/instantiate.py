"""`_target_` instantiation for user components (reward function, reward model, dataset).

`{_target_: pkg.module.name, other: 1}` imports `pkg.module` and calls `name(*args, other=1, **kwargs)`;
`_partial_: true` returns a functools.partial instead. Nested mappings with their own `_target_` are
instantiated first (set `_recursive_: false` to pass them through as plain dicts), and `_args_` gives
positional arguments. A small stand-in for hydra.utils.instantiate, which verl does not depend on.

Every failure names the config key it came from, as a ConfigError, so the CLI prints it like any other
configuration problem.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig
from omegaconf.errors import OmegaConfBaseException

from verl.config.errors import ConfigError, ConfigProblem
from verl.config.placement import to_dict

__all__ = ["instantiate", "resolve_target"]

_RESERVED = ("_target_", "_partial_", "_recursive_", "_args_")


def instantiate(spec: Mapping | DictConfig, *args: Any, key: str = "", **kwargs: Any) -> Any:
    """Build the object `spec` describes; `key` (e.g. "reward.fn") is named in every error."""
    if isinstance(spec, (DictConfig, ListConfig)):
        try:
            spec = to_dict(spec)  # user code gets plain dicts and lists
        except OmegaConfBaseException as e:
            raise _error(key, f"cannot resolve the spec: {e}", "fix the ${...} interpolation it uses") from None
    if not isinstance(spec, Mapping):
        raise _error(
            key,
            f"expected a mapping with '_target_', got {type(spec).__name__} {spec!r}",
            "write it as {_target_: pkg.module.name, ...}",
        )
    if "_target_" not in spec:
        raise _error(key, "'_target_' missing", "add _target_: pkg.module.name (the callable to build)")

    target_key = _join(key, "_target_")
    target = spec["_target_"]
    fn = target if callable(target) else resolve_target(target, key=target_key)
    if not callable(fn):
        raise _error(
            target_key, f"'{target}' is a {type(fn).__name__}, not callable", "point _target_ at a function or class"
        )

    recursive = spec.get("_recursive_", True)
    spec_args = spec.get("_args_", [])
    if not isinstance(spec_args, (list, tuple)):
        raise _error(_join(key, "_args_"), f"expected a list, got {type(spec_args).__name__}", "write _args_: [a, b]")
    spec_kwargs = {k: v for k, v in spec.items() if k not in _RESERVED}
    if recursive:
        spec_args = [_build_nested(v, _join(key, f"_args_.{i}")) for i, v in enumerate(spec_args)]
        spec_kwargs = {k: _build_nested(v, _join(key, str(k))) for k, v in spec_kwargs.items()}
    call_args = (*args, *spec_args)
    call_kwargs = {**spec_kwargs, **kwargs}  # the caller's kwargs win over the recipe's

    partial = bool(spec.get("_partial_", False))
    _check_signature(fn, call_args, call_kwargs, partial, key, target)
    if partial:
        return functools.partial(fn, *call_args, **call_kwargs)
    try:
        return fn(*call_args, **call_kwargs)
    except Exception as e:
        # The user's own error, kept as is (type and traceback) with a note saying which component failed.
        e.add_note(f"while instantiating {key or 'a component'} ({_name(target)})")
        raise


def resolve_target(dotted: str, key: str = "") -> Any:
    """The object at "pkg.mod:attr.sub" or "pkg.mod.attr.sub"; errors name `key` and the module tried."""
    if not isinstance(dotted, str) or not dotted.strip():
        raise _error(
            key, f"expected a dotted path such as 'pkg.module.name', got {dotted!r}", "set it to 'pkg.module.name'"
        )
    dotted = dotted.strip()
    if ":" in dotted:
        module_name, _, attr_path = dotted.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            raise _import_error(module_name, e, key) from e
        return _get_attrs(module, module_name, attr_path.split(".") if attr_path else [], key)
    module, module_name, rest = _import_longest(dotted, key)
    return _get_attrs(module, module_name, rest, key)


def _import_longest(dotted: str, key: str) -> tuple[Any, str, list]:
    """Import the longest module prefix of `dotted`; the rest are attributes (pkg.mod.Class.method)."""
    parts = dotted.split(".")
    first_error = None
    for end in range(len(parts) - 1 if len(parts) > 1 else 1, 0, -1):
        name = ".".join(parts[:end])
        try:
            return importlib.import_module(name), name, parts[end:]
        except ModuleNotFoundError as e:
            # Only "this path is not a module" moves on to a shorter prefix; a module that exists
            # but fails to import (a missing dependency inside it) is reported as it is.
            if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
                raise _import_error(name, e, key) from e
            first_error = first_error or (name, e)
        except Exception as e:  # noqa: B014  # SyntaxError, ImportError or anything raised at import time
            raise _import_error(name, e, key) from e
    name, missing = first_error
    raise _import_error(name, missing, key) from missing


def _get_attrs(obj: Any, owner: str, attrs: list, key: str) -> Any:
    for attr in attrs:
        if not hasattr(obj, attr):
            raise _error(
                key, f"'{owner}' has no attribute '{attr}'", f"check the spelling; '{owner}' defines: {_public(obj)}"
            )
        obj = getattr(obj, attr)
        owner = f"{owner}.{attr}"
    return obj


def _check_signature(fn: Any, args: tuple, kwargs: dict, partial: bool, key: str, target: Any) -> None:
    """Catch a wrong argument before calling, so it reads as a config problem and not a crash inside fn."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature; the call itself will tell
        return
    try:
        (signature.bind_partial if partial else signature.bind)(*args, **kwargs)
    except TypeError as e:
        raise _error(
            key,
            f"cannot call {_name(target)} with these arguments (TypeError: {e})",
            f"its signature is {_name(target)}{signature}",
        ) from None


def _build_nested(value: Any, key: str) -> Any:
    if isinstance(value, Mapping) and "_target_" in value:
        return instantiate(value, key=key)
    if isinstance(value, Mapping):
        return {k: _build_nested(v, _join(key, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_build_nested(v, _join(key, str(i))) for i, v in enumerate(value)]
    return value


def _import_error(module_name: str, e: BaseException, key: str) -> ConfigError:
    return _error(
        key,
        f"cannot import module '{module_name}' ({type(e).__name__}: {e})",
        "check the module path; a module of your own is found in the working directory or beside the recipe "
        "(`verl train`), else put its folder on PYTHONPATH or install its package",
    )


def _error(key: str, message: str, fix: str = "") -> ConfigError:
    return ConfigError([ConfigProblem(key, message, fix=fix)])


def _public(obj: Any) -> str:
    names = [n for n in dir(obj) if not n.startswith("_")]
    return ", ".join(names[:20]) + (", ..." if len(names) > 20 else "") if names else "(nothing public)"


def _name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__qualname__", repr(target))


def _join(key: str, part: str) -> str:
    return f"{key}.{part}" if key else part
