"""Capture and restore every random number generator a worker uses (exact resume).

The state is plain Python values and tensors, so checkpoints load with `torch.load(weights_only=True)`: a
crafted checkpoint file cannot run code on resume.
"""

from __future__ import annotations

import pickle
import random
from typing import Any, Dict, cast

import numpy as np
import torch


def get_rng_state() -> Dict[str, Any]:
    name, keys, pos, has_gauss, cached = cast(tuple, np.random.get_state(legacy=True))  # (MT19937's state)
    numpy_state = {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos)}
    numpy_state |= {"has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    if isinstance(n, dict):
        keys = n["keys"].numpy().astype(np.uint32)
        n = (n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"])
    np.random.set_state(n)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def safe_load(path: str) -> Any:
    """A checkpoint file's tensors and plain values; anything else in it (code to run) is refused, naming the file."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"{path} holds objects other than tensors and plain values, which resuming does not run: it was "
            f"written by an older verl, or tampered with ({str(e).splitlines()[0]})"
        ) from None
