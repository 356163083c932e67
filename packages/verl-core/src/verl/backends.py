"""Backend discovery: which training, rollout and kernel backends are installed.

Backend packages (verl-fsdp, verl-megatron, verl-rollout, verl-kernels) declare `BackendSpec`s and
register them under the entry-point group `verl.backends`. The core never imports a backend's engine
code; it only reads these specs to check a recipe and, later, to load the engine a recipe names.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict, List, Literal, Mapping, Optional, Tuple

from verl.config.errors import ConfigProblem

ENTRY_POINT_GROUP = "verl.backends"
BackendKind = Literal["train", "rollout", "kernels"]


@dataclass(frozen=True)
class BackendSpec:
    name: str  # what a recipe writes: actor.backend: fsdp
    kind: BackendKind
    package: str  # the distribution that provides it
    requires: Tuple[str, ...] = ()  # third-party modules it imports at run time
    extra: Optional[str] = None  # pip requirement that brings `requires`, e.g. "verl-rollout[vllm]"
    install_note: Optional[str] = None  # more on installing `requires` (another build, a Pants resolve)
    engine: Optional[str] = None  # "module:Class" implementing verl.engine_protocol.TrainEngine / RolloutEngine
    # Optional tools of a train backend, loaded only when used ("module:function"):
    model_info: Optional[str] = None  # (model_path, parallel: dict, kind) -> lines describing the built model
    # (checkpoint_dir, out_dir, *, model_path=None) -> writes a Hugging Face folder; model_path: a moved base model
    exporter: Optional[str] = None
    # a verl.memory_model.MemoryModel: the engine's state and activation bytes per rank, before launch
    memory_model: Optional[str] = None

    def missing_requirements(self) -> List[str]:
        return [m for m in self.requires if not _module_available(m)]

    def install_hint(self) -> str:
        """What to run to make this backend importable."""
        hint = f"pip install {self.extra}" if self.extra else f"pip install {self.package}"
        return f"{hint}; {self.install_note}" if self.install_note else hint

    def load(self, field: str) -> Any:
        """The object a "module:name" field names, imported now (with an install hint if that fails)."""
        target = getattr(self, field)
        if not target:
            raise ValueError(f"backend '{self.name}' ({self.package}) provides no {field}")
        module, _, name = target.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except ImportError as e:
            raise ImportError(f"backend '{self.name}' failed to import ({e}); {self.install_hint()}") from e


# Every backend the project ships, so a recipe naming one whose package is absent gets the package to install.
KNOWN_BACKENDS: Mapping[str, Tuple[BackendKind, str]] = {
    "fsdp": ("train", "verl-fsdp"),
    "megatron": ("train", "verl-megatron"),
    "hf": ("rollout", "verl-rollout"),
    "vllm": ("rollout", "verl-rollout"),
    "sglang": ("rollout", "verl-rollout"),
    "torch": ("kernels", "verl-kernels"),
    "triton": ("kernels", "verl-kernels"),
}


def _module_available(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package missing raises instead of returning None
        return False
    # A folder of that name without an __init__.py (a namespace package, no origin) is not the library:
    # e.g. a checkout's tests/rollout/vllm/ on sys.path must not count as vLLM.
    return spec is not None and spec.origin is not None


@lru_cache(maxsize=1)
def installed_backends() -> Dict[str, BackendSpec]:
    """Backends registered by installed packages, keyed by name."""
    found: Dict[str, BackendSpec] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        spec = ep.load()
        found[spec.name] = spec
    # Source checkouts (and Pants sandboxes) run the project's backend packages without installed metadata:
    # find those by import name (verl-fsdp: verl_fsdp.backends.BACKENDS). Only those: any other module that
    # happens to be called verl_* on the path is a user's, and discovery must not run it.
    for package in sorted({package for _, package in KNOWN_BACKENDS.values()}):
        name = package.replace("-", "_")
        if _is_package(name) and _module_available(f"{name}.backends"):
            for spec in importlib.import_module(f"{name}.backends").BACKENDS:
                found.setdefault(spec.name, spec)
    return found


def _is_package(name: str) -> bool:
    """A top-level package of that name is importable (found without importing it)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.submodule_search_locations is not None and spec.origin is not None


def check_backend(
    key: str, name: str, kind: BackendKind, installed: Optional[Mapping[str, BackendSpec]] = None, strict: bool = True
) -> List[ConfigProblem]:
    """Problems with `key: name` (e.g. `rollout.backend: vllm`); empty when it can run here.

    A missing third-party library (vllm on a laptop planning a cluster run) is an error only when
    `strict`; planning a run elsewhere makes it a warning.
    """
    installed = installed_backends() if installed is None else installed
    kinds = {n: k for n, (k, _) in KNOWN_BACKENDS.items()} | {n: s.kind for n, s in installed.items()}
    known = {n for n, k in kinds.items() if k == kind}
    if name in kinds and kinds[name] != kind:
        message = f"'{name}' is a {kinds[name]} backend, not a {kind} backend"
        return [ConfigProblem(key, message, f"known {kind} backends: {', '.join(sorted(known))}")]
    if name not in known:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return [ConfigProblem(key, f"unknown {kind} backend '{name}'", f"{hint}known: {', '.join(sorted(known))}")]
    spec = installed.get(name)
    if spec is None:
        package = KNOWN_BACKENDS[name][1]
        message = f"backend '{name}' is provided by the package '{package}', which is not installed"
        return [ConfigProblem(key, message, f"pip install {package}")]
    missing = spec.missing_requirements()
    if missing:
        install = spec.install_hint() if spec.extra else f"pip install {' '.join(missing)}"
        message = f"backend '{name}' needs {', '.join(repr(m) for m in missing)}, not importable here"
        return [ConfigProblem(key, message, install, severity="error" if strict else "warning")]
    return []
