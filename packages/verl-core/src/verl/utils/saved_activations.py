"""Peak activation memory on any device: the bytes autograd holds for backward, measured through saved-tensor hooks.

A process's resident set (CPU) or torch's allocated bytes (GPU) mix activations with weights, gradients and
optimizer state. Activations are what packing and token budgets change, and they are exactly the tensors autograd
saves for backward: this counts each saved tensor's storage once while autograd holds it (parameters excluded) and
keeps the peak of that sum. A micro-batch's activations are freed by its backward, so the peak is the largest
micro-batch's forward. torch's non-reentrant checkpoint (Hugging Face's activation checkpointing) saves and
recomputes under hooks of its own, out of sight here; its reentrant one, and megatron's recompute, are seen.
"""

from __future__ import annotations

import weakref
from typing import Dict, Iterable, Set, cast

import torch


class _Held:
    """What autograd keeps in place of a saved tensor; its collection means autograd let the tensor go."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedActivations:
    """`with SavedActivations(model.parameters()) as saved: step()`, then `saved.peak_bytes`."""

    def __init__(self, parameters: Iterable[torch.Tensor] = ()):
        # (an FSDP parameter is a DTensor: its local shard holds the storage)
        local = [p.to_local() if hasattr(p, "to_local") else p for p in parameters]
        self._skip: Set[int] = {p.untyped_storage().data_ptr() for p in local}
        self._refs: Dict[int, int] = {}  # storage pointer -> saved tensors holding it
        self._live: Dict[int, torch.UntypedStorage] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> object:
        if isinstance(tensor, torch.nn.Parameter) or tensor.device.type == "meta":  # (FSDP's unsharded weights)
            return tensor
        try:
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
        except RuntimeError:  # a storage FSDP has freed (a parameter's, gathered again for backward)
            return tensor
        if ptr in self._skip or storage.nbytes() == 0:
            return tensor
        held = _Held(tensor)
        self._live.setdefault(ptr, storage)
        self._refs[ptr] = self._refs.get(ptr, 0) + 1
        # Summed afresh: a storage resized to nothing since it was saved (FSDP frees a layer's gathered weights
        # after its forward and gathers them again for backward) holds no memory now.
        self.live_bytes = sum(s.nbytes() for s in self._live.values())
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(held, self._release, ptr)
        return held

    @staticmethod
    def _unpack(held: object) -> torch.Tensor:
        return held.tensor if isinstance(held, _Held) else cast(torch.Tensor, held)

    def _release(self, ptr: int) -> None:
        self._refs[ptr] -= 1
        if self._refs[ptr] == 0:
            self.live_bytes -= self._live.pop(ptr).nbytes()

    def __enter__(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
