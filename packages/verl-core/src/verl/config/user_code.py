"""Where a recipe's own code is found: a `_target_` module or a `trainer.plugins` entry kept beside the recipe or
in the working directory imports without PYTHONPATH, in the driver and in worker processes alike."""

from __future__ import annotations

import os
import sys
from typing import List, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


def user_code_folders(recipe: Optional[PathLike]) -> List[str]:
    """The working directory and the recipe's folder (when the recipe is a file), each once."""
    folders = [os.getcwd()]
    if recipe is not None and os.path.isfile(recipe):
        folders.append(os.path.dirname(os.path.abspath(recipe)))
    return list(dict.fromkeys(folders))


def add_user_code_paths(recipe: Optional[PathLike]) -> List[str]:
    """Put `user_code_folders(recipe)` at the end of sys.path (installed packages keep precedence) and of
    PYTHONPATH (what worker processes started from here, such as a local Ray cluster's, inherit); returns those
    that were added."""
    added = [f for f in user_code_folders(recipe) if f not in sys.path]
    sys.path.extend(added)
    env = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    missing = [f for f in user_code_folders(recipe) if f not in env]
    if missing:
        os.environ["PYTHONPATH"] = os.pathsep.join(env + missing)
    return added
