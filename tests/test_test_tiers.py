"""The two test tiers agree: the files tagged `slow` in the BUILD files (`./pants --tag=-slow test ::` skips them)
are exactly the files marked `pytestmark = pytest.mark.slow` (`pytest -m "not slow"` skips them), and the root
pytest.ini registers the marker and puts every package's src folder on the path."""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
BUILD_FILES = [TESTS / "BUILD", TESTS / "rollout" / "vllm" / "BUILD"]


def _expand(base: Path, globs) -> set[str]:
    """Pants-style source globs relative to `base` (`!` excludes) as repository-relative paths."""
    globs = [globs] if isinstance(globs, str) else list(globs)
    found: set[Path] = set()
    for g in globs:
        if not g.startswith("!"):
            found |= set(base.glob(g))
    for g in globs:
        if g.startswith("!"):
            found -= set(base.glob(g[1:]))
    return {str(p.relative_to(ROOT)) for p in found if p.is_file()}


def _tagged_in_build() -> tuple[set[str], set[str]]:
    """(every test file of a python_tests target, those whose tags include "slow"), read from the BUILD files."""
    every: set[str] = set()
    slow: set[str] = set()
    for build in BUILD_FILES:
        calls: list[dict] = []
        symbols = {
            "python_tests": lambda calls=calls, **kw: calls.append(kw),
            "python_test_utils": lambda **kw: None,
            "files": lambda **kw: None,
            "parametrize": lambda *a, **kw: a,
        }
        exec(compile(build.read_text(), str(build), "exec"), symbols)
        for kw in calls:
            sources = _expand(build.parent, kw.get("sources", ["test_*.py", "*_test.py", "tests.py"]))
            every |= sources
            tagged = set(sources) if "slow" in kw.get("tags", ()) else set()
            for key, fields in kw.get("overrides", {}).items():
                if "tags" in fields:  # an override replaces the target's tags for its files
                    files = _expand(build.parent, key) & sources
                    tagged = (tagged | files) if "slow" in fields["tags"] else (tagged - files)
            slow |= tagged
    return every, slow


def _marks_slow(path: Path) -> bool:
    """Whether a module-level `pytestmark` assignment includes `pytest.mark.slow`."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return any(ast.unparse(n) == "pytest.mark.slow" for n in ast.walk(node.value))
    return False


def test_build_tags_and_pytest_marks_agree():
    every, slow_in_build = _tagged_in_build()
    assert str(Path(__file__).relative_to(ROOT)) in every  # the BUILD files were read
    assert slow_in_build, "no file is tagged slow"
    marked = {f for f in every if _marks_slow(ROOT / f)}
    assert sorted(slow_in_build - marked) == [], "tagged slow in BUILD without pytestmark = pytest.mark.slow"
    assert sorted(marked - slow_in_build) == [], "pytestmark slow without the slow tag in BUILD"


def test_root_pytest_ini_registers_slow_and_every_package_src():
    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    markers = [line.split(":")[0].strip() for line in ini["pytest"]["markers"].strip().splitlines()]
    assert "slow" in markers
    paths = ini["pytest"]["pythonpath"].split()
    assert "." in paths
    packages = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "packages").glob("*/src"))
    assert packages and sorted(p for p in paths if p != ".") == packages
