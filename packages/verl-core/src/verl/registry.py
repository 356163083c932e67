"""Registry: the one type of every extension point (advantage estimators, policy losses, KL, aggregation, reward
functions, tools, agent loops, tool-call parsers, loggers, trainers, controllers), so a recipe names an entry and a
user adds one without editing the code that looks it up.

A recipe selects an entry by name (`algorithm.adv_estimator: grpo`), or points at any function with
`{_target_: pkg.module.fn, **kwargs}` (kwargs are bound with functools.partial). Code adds entries with
the decorator:

    @ADV_ESTIMATORS.register("my_baseline", requires=("index",))
    def my_baseline(token_level_rewards, response_mask, *, index, config, **_): ...

One rule everywhere: a name taken by another entry is refused (the same function again is not: re-importing a
plugin is harmless); an unknown name is an UnknownNameError naming the closest one (did you mean ...?); a
`_target_` whose signature cannot take the call the extension point makes is refused when it is looked up, at
validation. Built-ins that live in modules of their own are named by the registry (`builtins`) and imported on its
first lookup, so no module imports its registrants back.

Extra keyword arguments of `register` (here `requires`) are set as attributes on the function, so a
`_target_` reference to the same function carries them too (`Registry.attr` reads them).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["Registry", "UnknownNameError"]


class UnknownNameError(KeyError):
    """A name that no entry of a registry has; the message lists the names there are."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class Registry:
    """Named entries (functions, classes, factories) for one extension point."""

    def __init__(
        self,
        kind: str,
        args: tuple[str, ...] = (),
        always: tuple[str, ...] = (),
        offered: tuple[str, ...] = (),
        *,
        builtins: tuple[str, ...] = (),
    ):
        """`args`: what the caller passes by position; `always`: keywords it always passes; `offered`: keywords
        passed only to a function that names them. A `_target_` or callable whose signature cannot take that
        call is refused when it is looked up (at validation), not on the first batch. `builtins`: modules that
        register built-in entries, imported on the first lookup."""
        self.kind = kind  # what an entry is, for messages: "advantage estimator"
        self.args, self.always, self.offered = args, always, offered
        self._entries: dict[str, Callable[..., Any]] = {}
        self._builtins, self._loaded = builtins, not builtins

    def _load_builtins(self) -> None:
        if not self._loaded:
            self._loaded = True  # (first: a built-in module that looks an entry up while importing)
            for module in self._builtins:
                importlib.import_module(module)

    def register(self, name: str, *, aliases: Iterable[str] = (), **attrs: Any) -> Callable[[F], F]:
        """Decorator adding a function under `name` (and `aliases`); a name already taken is a ValueError.

        Registering the same function again (or a reloaded copy of it: same module and qualified name)
        is allowed, so re-importing a plugin module is harmless.
        """
        names = (name, *aliases)
        for n in names:
            if not isinstance(n, str) or not n.strip():
                raise ValueError(f"a {self.kind} name must be a non-empty string, got {n!r}")

        def decorator(fn: F) -> F:
            if not callable(fn):
                raise TypeError(f"@register({name!r}) decorates a function, got {type(fn).__name__}")
            for n in names:  # check every name before adding any, so a failure leaves nothing behind
                taken = self._entries.get(n)
                if taken is not None and not _same_function(taken, fn):
                    raise ValueError(
                        f"{self.kind} '{n}' is already registered ({_describe(taken)}); "
                        f"choose another name for {_describe(fn)}, or unregister('{n}') first"
                    )
            for key, value in attrs.items():
                setattr(fn, key, value)
            for n in names:
                self._entries[n] = fn
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        """Remove one name (tests and notebooks); an unknown name is an UnknownNameError."""
        if name not in self._entries:
            raise self._unknown(name, key="")
        del self._entries[name]

    def get(self, spec: Any, *, key: str = "") -> Callable[..., Any]:
        """The function `spec` selects: a registered name, a `{_target_: ..., **kwargs}` mapping, or a callable.

        `key` is the config key the spec came from (e.g. "algorithm.adv_estimator"), named in errors.
        """
        if isinstance(spec, str):
            self._load_builtins()
            fn = self._entries.get(spec)
            if fn is None:
                raise self._unknown(spec, key)
            return fn
        if isinstance(spec, Mapping):
            return self._from_target(spec, key)
        if callable(spec):
            self._check_call(spec, key)
            return spec
        where = f"{key}: " if key else ""
        raise TypeError(
            f"{where}a {self.kind} is selected by a registered name ({', '.join(self.names())}), "
            f"a {{_target_: pkg.module.fn, ...}} mapping, or a callable; got {type(spec).__name__} {spec!r}"
        )

    def attr(self, spec: Any, name: str, default: Any = None, *, key: str = "") -> Any:
        """An attribute `register` set on the function `spec` selects (looking through functools.partial)."""
        fn = self.get(spec, key=key)
        while isinstance(fn, functools.partial) and not hasattr(fn, name):
            fn = fn.func
        return getattr(fn, name, default)

    def names(self) -> list[str]:
        """Every registered name (aliases included), sorted."""
        self._load_builtins()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._entries

    def __getitem__(self, name: str) -> Callable[..., Any]:
        """The entry registered as `name` (an UnknownNameError, with did-you-mean, when there is none)."""
        return self.get(name) if isinstance(name, str) else self.get(str(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"

    def _unknown(self, name: str, key: str) -> UnknownNameError:
        names = self.names()
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        where = f"{key}: " if key else ""
        return UnknownNameError(
            f"{where}unknown {self.kind} '{name}'{hint} Registered: {', '.join(names) or '(none)'}. "
            f"Add one with the registry's @register(name) decorator (in a module listed in trainer.plugins), "
            f"or give {{_target_: pkg.module.fn}}"
        )

    def _from_target(self, spec: Mapping, key: str) -> Callable[..., Any]:
        from omegaconf import DictConfig

        from verl.config.errors import ConfigError, ConfigProblem
        from verl.config.instantiate import instantiate, resolve_target  # lazy: keeps this module light

        if isinstance(spec, DictConfig):  # user code gets plain values
            from verl.config.placement import to_dict

            spec = to_dict(spec)
        if "_target_" not in spec:
            where = f"{key}: " if key else ""
            raise ValueError(
                f"{where}a {self.kind} given as a mapping needs '_target_' (pkg.module.fn), got keys {list(spec)}"
            )
        kwargs = {k: v for k, v in spec.items() if k != "_target_"}
        target_key = f"{key}._target_" if key else "_target_"
        target = spec["_target_"]
        if not callable(target):
            target = resolve_target(target, key=target_key)
            if not callable(target):  # e.g. a module constant: calling it would fail mid-run
                message = f"'{spec['_target_']}' is a {type(target).__name__}, not a callable {self.kind}"
                raise ConfigError([ConfigProblem(target_key, message, "name a function (pkg.module.fn)")])
        self._check_call(target, key or target_key, kwargs)
        if not kwargs:  # the function itself, so its attributes stay visible
            return target
        return instantiate({**spec, "_target_": target, "_partial_": True}, key=key)

    def _check_call(self, fn: Callable[..., Any], key: str, bound: Mapping[str, Any] | None = None) -> None:
        """ConfigError when `fn` (with the recipe's `bound` keywords) cannot take the call this extension point makes."""
        from verl.config.errors import ConfigError, ConfigProblem

        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without a signature: the first call will tell
            return
        try:
            call = signature.bind_partial(*self.args, **{**dict.fromkeys(self.always), **(bound or {})})
            missing = [
                p.name
                for p in signature.parameters.values()
                if p.name not in call.arguments
                and p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
                and p.name not in self.offered
            ]
            if missing:
                raise TypeError(f"nothing passes its required argument(s) {', '.join(map(repr, missing))}")
        except TypeError as e:
            shape = ", ".join(
                [*self.args, *([f"*, {', '.join(self.always + self.offered)}"] if self.always or self.offered else [])]
            )
            message = f"{_describe(fn)}{signature} cannot be called as a {self.kind} fn({shape}): {e}"
            fix = f"give it the signature fn({shape}) (keywords it does not use may be left out)"
            raise ConfigError([ConfigProblem(key or self.kind, message, fix)]) from None


def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    """The same object, or a reloaded copy of it (same module and qualified name)."""
    if a is b:
        return True
    ident_a = (getattr(a, "__module__", None), getattr(a, "__qualname__", None))
    ident_b = (getattr(b, "__module__", None), getattr(b, "__qualname__", None))
    return ident_a == ident_b and None not in ident_a


def _describe(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
