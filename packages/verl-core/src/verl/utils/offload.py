"""Tensors moved to host memory and back in place, so a role frees its device memory between the phases of a step.

The storage of each tensor is copied to host memory (pinned where CUDA is) and then resized to zero bytes; a
restore resizes it back and copies the data in. The tensor objects, and every view of their storage (megatron's
parameters are views of one contiguous buffer, FSDP's shards views of its sharded data), stay valid throughout,
so modules, optimizers and hooks that hold them need not know. A tensor whose content is not needed again
(a gradient buffer that the next step zeroes anyway) is only released and re-allocated, without a copy.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Optional

import torch


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    local = getattr(t, "_local_tensor", None)  # a DTensor: this rank's shard
    return (local if local is not None else t).untyped_storage()


@dataclass
class Offloaded:
    """Storages emptied on the device; `restore()` brings them back (a no-op when nothing is away)."""

    storages: List[torch.UntypedStorage] = field(default_factory=list)
    copies: List[torch.Tensor] = field(default_factory=list)  # host copies (uint8), None where not kept
    sizes: List[int] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    def restore(self) -> None:
        for storage, copy, size in zip(self.storages, self.copies, self.sizes):
            storage.resize_(size)
            if copy is not None:
                torch.tensor([], dtype=torch.uint8, device=storage.device).set_(storage).copy_(copy, non_blocking=True)
        if any(s.device.type == "cuda" for s in self.storages):
            torch.cuda.current_stream().synchronize()  # the host copies may be freed after this
        self.storages, self.copies, self.sizes = [], [], []


def offload(tensors: Iterable[torch.Tensor], *, keep: bool = True) -> Offloaded:
    """Empty the storages of `tensors` (each once; empty ones skipped), keeping a host copy of their bytes
    unless `keep` is False (their content is then undefined after `restore()`)."""
    seen: Dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        if t is None:
            continue
        storage = _storage(t)
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen[storage.data_ptr()] = storage
    away = Offloaded()
    pin = torch.cuda.is_available()
    fixed = [s for s in seen.values() if not s.resizable()]
    if fixed:
        raise ValueError(
            f"{len(fixed)} storages cannot be resized (memory-mapped or borrowed, e.g. tensors read straight from a "
            "file); clone those tensors into storage of their own before offloading them"
        )
    for storage in seen.values():
        copy = None
        if keep:
            device_bytes = torch.tensor([], dtype=torch.uint8, device=storage.device).set_(storage)
            copy = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=pin)
            copy.copy_(device_bytes)
        away.storages.append(storage)
        away.copies.append(copy)
        away.sizes.append(storage.nbytes())
        storage.resize_(0)
    return away


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> List[torch.Tensor]:
    """The tensors a torch optimizer keeps per parameter (Adam's moments; its step counters when tensors)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


class Away:
    """Tensors a role keeps in host memory while it does not need them: `release()` sends them (a no-op when
    `enabled` is False or they are already away), `resident()` brings them back. `tensors` is called at each
    release (optimizer state appears at the first step); storages in `skip` stay (e.g. the model's parameters,
    which the optimizer's fp32 groups may view); `keep=False` drops the content (buffers zeroed before use);
    `with away.back():` holds them on the device for a block and sends them out again after it."""

    def __init__(
        self,
        tensors: Callable[[], Iterable[Optional[torch.Tensor]]],
        *,
        enabled: bool,
        keep: bool = True,
        skip: Callable[[], Iterable[torch.Tensor]] = lambda: (),
    ):
        self.tensors, self.enabled, self.keep, self.skip = tensors, enabled, keep, skip
        self.away = Offloaded()
        self.released_bytes = 0  # what the last release moved out

    def release(self) -> None:
        if not self.enabled or self.away.storages:
            return
        skip = {_storage(t).data_ptr() for t in self.skip() if t is not None}
        self.away = offload(
            (t for t in self.tensors() if t is not None and _storage(t).data_ptr() not in skip), keep=self.keep
        )
        self.released_bytes = self.away.nbytes

    def resident(self) -> None:
        self.away.restore()

    @contextlib.contextmanager
    def back(self) -> Iterator[None]:
        self.resident()
        try:
            yield
        finally:
            self.release()


def empty_device_cache() -> None:
    """Return the CUDA caching allocator's free blocks to the device (another engine may allocate them)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
