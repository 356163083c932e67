"""The packages' shape: no module-level import cycle between files, one Registry type, files of one job each."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "packages" / p / "src" for p in ("verl-core", "verl-fsdp", "verl-megatron", "verl-rollout", "verl-kernels")
]
MAX_LINES = 550


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for root in SOURCES:
        for f in root.rglob("*.py"):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


def _imports(name: str, path: pathlib.Path, mods: dict[str, pathlib.Path]) -> set[str]:
    """The project modules `name` imports when it is imported (top-level statements; `from pkg import submodule`
    counts as the submodule)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        body = node.body if isinstance(node, ast.Try) else [node]
        for n in body:
            if isinstance(n, ast.Import):
                found.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = package.split(".")[: len(package.split(".")) - (n.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in n.names if f"{base}.{a.name}" in mods]
                found.update(subs)
                if len(subs) < len(n.names):
                    found.add(base)
    owners = set()
    for m in found:
        while m and m not in mods:
            m = m.rsplit(".", 1)[0] if "." in m else ""
        if m and m != name:
            owners.add(m)
    return owners


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_level_import_cycle():
    mods = _modules()
    graph = {m: _imports(m, f, mods) for m, f in mods.items()}
    assert len(graph) > 150 and sum(len(v) for v in graph.values()) > 300  # (the graph was read)
    assert import_cycles(graph) == []


def test_one_registry_type():
    """Every extension point's name -> entry table is a verl.registry.Registry (no hand-rolled dicts beside it)."""
    classes = [
        f"{f.relative_to(root)}:{node.name}"
        for root in SOURCES
        for f in root.rglob("*.py")
        for node in ast.walk(ast.parse(f.read_text()))
        if isinstance(node, ast.ClassDef) and "Registry" in node.name
    ]
    assert classes == ["verl/registry.py:Registry"]
    from verl.agents.loops import AGENT_LOOPS
    from verl.agents.parsers import PARSERS
    from verl.agents.tools import TOOLS
    from verl.algos import ADV_ESTIMATORS, AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES
    from verl.controller.worker_group import EXECUTORS
    from verl.registry import Registry
    from verl.reward import REWARD_FNS
    from verl.tracking import LOGGERS
    from verl.trainer.registry import TRAINERS

    tables = (AGENT_LOOPS, PARSERS, TOOLS, ADV_ESTIMATORS, AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES, EXECUTORS)
    for table in (*tables, REWARD_FNS, LOGGERS, TRAINERS):
        assert isinstance(table, Registry) and len(table) > 0, table
    assert {"calculator", "python"} <= set(TOOLS) and "openai_agent" in AGENT_LOOPS  # built-ins of their own modules
    assert {"ppo", "dpo", "online_dpo", "sft"} <= set(TRAINERS)


@pytest.mark.parametrize("root", SOURCES, ids=lambda p: p.parent.name)
def test_no_source_file_over_the_limit(root):
    sizes = {str(f.relative_to(root)): len(f.read_text().splitlines()) for f in root.rglob("*.py")}
    over = {f: n for f, n in sizes.items() if n > MAX_LINES}
    assert not over, f"split these by concern (at most {MAX_LINES} lines a file): {over}"
