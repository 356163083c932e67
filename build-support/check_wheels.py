"""Checks the wheels `./pants package ::` built: five packages, entry points, and a light core.

Usage: check_wheels.py DIST_DIR
       check_wheels.py --same DIST_DIR OTHER_DIR   (the wheels of packages/*/pyproject.toml, built by pip, declare
                                                   the same requirements, extras, entry points and modules)
Exits non-zero naming the wheel and the problem.
"""

from __future__ import annotations

import re
import sys
import zipfile
from configparser import ConfigParser
from pathlib import Path

EXPECTED = {
    "verl_core": set(),
    "verl_fsdp": {"fsdp"},
    "verl_megatron": {"megatron"},
    "verl_rollout": {"hf", "vllm", "sglang"},
    "verl_kernels": {"torch", "triton"},
}
# Installing verl-core alone must not pull any of these (they belong to backend packages or extras).
HEAVY = {"megatron-core", "vllm", "sglang", "triton", "ray"}


def wheel_metadata(path: Path) -> tuple[list[str], dict[str, set[str]]]:
    """(unconditional Requires-Dist names, entry point group -> names) of one wheel."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        ep_file = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        entry_points: dict[str, set[str]] = {}
        if ep_file:
            parser = ConfigParser()
            parser.read_string(zf.read(ep_file).decode())
            entry_points = {s: set(parser[s]) for s in parser.sections()}
    requires = [
        re.split(r"[\s;<>=!~\[(]", line.split(":", 1)[1].strip(), maxsplit=1)[0].lower()
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    return requires, entry_points


def _requirement(text: str) -> tuple[str, frozenset[str], str]:
    """'torch (>=2.6)' and 'torch>=2.6' alike: (name, specifiers, marker), whitespace and order ignored."""
    text, _, marker = text.partition(";")
    name = re.split(r"[\s<>=!~\[(]", text.strip(), maxsplit=1)[0]
    spec = text.strip()[len(name) :].strip().strip("()")
    return (
        name.lower(),
        frozenset(s.strip() for s in spec.split(",") if s.strip()),
        " ".join(marker.replace('"', "'").split()),
    )


def declared(path: Path) -> dict:
    """Everything a wheel promises an installer: requirements (with extras), entry points, modules."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        ep_file = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        parser = ConfigParser()
        if ep_file:
            parser.read_string(zf.read(ep_file).decode())
    fields = [line.split(":", 1) for line in meta.splitlines() if ":" in line and not line.startswith(" ")]
    return {
        "requires": sorted(_requirement(v) for k, v in fields if k == "Requires-Dist"),
        "extras": sorted(v.strip() for k, v in fields if k == "Provides-Extra"),
        "entry_points": {s: dict(parser[s]) for s in parser.sections()},
        "modules": sorted(n for n in names if n.endswith(".py")),
    }


def same(dist: str, other: str) -> int:
    problems = []
    for path in sorted(Path(dist).glob("*.whl")):
        twin = next(Path(other).glob(path.name.split("-")[0] + "-*.whl"), None)
        if twin is None:
            problems.append(f"{path.name}: no wheel of that package in {other}")
            continue
        a, b = declared(path), declared(twin)
        for key in a:
            if a[key] != b[key]:
                diff = set(map(str, a[key])) ^ set(map(str, b[key])) if key != "entry_points" else (a[key], b[key])
                problems.append(f"{path.name}: {key} differ from {twin} (pyproject.toml vs BUILD): {diff}")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    print(f"check_wheels: {other} against {dist}: {len(problems)} problems")
    return 1 if problems else 0


def main(dist: str) -> int:
    wheels = {p.name.split("-")[0]: p for p in Path(dist).glob("*.whl")}
    problems = [f"missing wheel for {name}" for name in EXPECTED if name not in wheels]
    for name, path in sorted(wheels.items()):
        if name not in EXPECTED:
            continue
        requires, entry_points = wheel_metadata(path)
        backends = entry_points.get("verl.backends", set())
        print(
            f"{path.name}: requires {', '.join(sorted(requires)) or '-'}; backends {', '.join(sorted(backends)) or '-'}"
        )
        if backends != EXPECTED[name]:
            problems.append(
                f"{path.name}: verl.backends entry points {sorted(backends)}, expected {sorted(EXPECTED[name])}"
            )
        if name == "verl_core":
            heavy = HEAVY & set(requires)
            if heavy:
                problems.append(f"{path.name}: verl-core must not require {sorted(heavy)}")
            if "verl" not in entry_points.get("console_scripts", set()):
                problems.append(f"{path.name}: no `verl` console script")
        elif "verl-core" not in requires:
            problems.append(f"{path.name}: does not require verl-core")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    print(f"check_wheels: {len(wheels)} wheels, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--same":
        sys.exit(same(sys.argv[2], sys.argv[3]))
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "dist"))
