"""Plugin modules: user code imported before a run, so its `@REGISTRY.register(...)` entries exist by name.

A recipe lists them under `trainer.plugins` (importable module names: an installed package, or a module on
PYTHONPATH); `verl.config.validate` loads them before anything looks a name up.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

from verl.config.errors import ConfigError, ConfigProblem

__all__ = ["load_plugins"]


def load_plugins(modules: Sequence[str], *, key: str = "trainer.plugins") -> list[ModuleType]:
    """Import each module (once: Python caches it); every one that fails is reported, as a ConfigError."""
    if isinstance(modules, str):  # a bare string would be imported letter by letter
        modules = [modules]
    loaded, problems = [], []
    for i, name in enumerate(modules):
        item_key = f"{key}.{i}"
        if not isinstance(name, str) or not name.strip():
            message = f"expected a module name such as 'my_pkg.estimators', got {name!r}"
            problems.append(ConfigProblem(item_key, message, "give a dotted module name"))
            continue
        module = name.strip()
        try:
            loaded.append(importlib.import_module(module))
        except Exception as e:  # noqa: BLE001 - anything the module raises (a duplicate registration, a typo)
            message = f"plugin module '{name}' failed to import: {type(e).__name__}: {e}"
            fix = "fix the error in the plugin module"
            if isinstance(e, ModuleNotFoundError):
                if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
                    message = f"plugin module '{name}' not found ({e})"
                    fix = "check the spelling; the module must be importable: installed, or on PYTHONPATH"
                else:  # the module exists but imports something missing
                    fix = f"install '{e.name}' or fix the import in the plugin"
            problems.append(ConfigProblem(item_key, message, fix))
    if problems:
        raise ConfigError(problems)
    return loaded
