"""DataProto: the batch that flows between the roles of an RL run (rollout -> reward -> actor ...).

A DataProto holds three things:

* ``batch``: a ``TensorDict`` of tensors that share the leading (row) dimension, or ``None`` when
  there are no tensors;
* ``non_tensor_batch``: numpy arrays with the same leading length (raw prompts, ground truths, data
  sources, uids), usually of dtype ``object``;
* ``meta_info``: a free-form dict that is never split (temperature, global step, timing ...).

Every operation returns a new DataProto and leaves its inputs unchanged, except ``pop`` which says
so. "New" means new containers: like torch views, results of row slicing (``chunk``, ``split``,
``slice``, ``dp[i]``) may share tensor/array storage with the input, so writing into a result's
tensors in place writes into the input's too. Gathering ops (``repeat``, ``reorder``, index lists)
copy. ``dp[i]`` with an int returns a size-1 DataProto (not a row object), so every operation stays
available on it and ``DataProto.concat([dp[0], dp[1]])`` works.
"""

from __future__ import annotations

import builtins
import io
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["DataProto"]

# What selects rows: an int (-> size-1 DataProto), a slice, or 1-D int/bool indices.
RowIndex = Union[int, slice, torch.Tensor, np.ndarray, Sequence[int], Sequence[bool]]
KeySelection = Union[str, Iterable[str], None]


@dataclass(eq=False)  # eq=False: comparing TensorDicts elementwise makes a default __eq__ meaningless
class DataProto:
    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch is not None:
            if not isinstance(self.batch, TensorDict):
                raise TypeError(f"batch must be a TensorDict or None, got {type(self.batch).__name__}")
            if self.batch.batch_dims != 1:
                raise ValueError(
                    f"batch must have exactly one batch dimension, got batch_size={list(self.batch.batch_size)}"
                )
            for key, value in self.batch.items():
                if not isinstance(value, torch.Tensor):
                    # Nested TensorDicts / NonTensorData would need their own rules for every op below.
                    raise TypeError(f"batch[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
            if len(self.batch.keys()) == 0:
                self.batch = None  # keep the invariant: no tensor keys <=> batch is None
        self.non_tensor_batch = {k: _as_row_array(k, v) for k, v in (self.non_tensor_batch or {}).items()}
        self.meta_info = dict(self.meta_info or {})
        _check_lengths(self._tensors(), self.non_tensor_batch)

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, np.ndarray | Sequence[Any]] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build a DataProto; lists/tuples in ``non_tensors`` become 1-D object arrays."""
        tensors = dict(tensors or {})
        arrays = {k: _as_row_array(k, v) for k, v in (non_tensors or {}).items()}
        for key, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"tensor {key!r} must be a torch.Tensor, got {type(value).__name__}")
            if value.dim() == 0:
                raise ValueError(f"tensor {key!r} is 0-dimensional; it needs a leading batch dimension")
        # Check before building the TensorDict so the error names the key and both lengths.
        _check_lengths(tensors, arrays)
        return cls(batch=_make_batch(tensors), non_tensor_batch=arrays, meta_info=meta_info)

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for array in self.non_tensor_batch.values():
            return len(array)
        return 0

    @property
    def tensor_keys(self) -> list[str]:
        return list(self.batch.keys()) if self.batch is not None else []

    @property
    def has_rows(self) -> bool:
        """Whether there is any tensor or non-tensor key (i.e. whether len() means something)."""
        return self.batch is not None or bool(self.non_tensor_batch)

    def __repr__(self) -> str:
        tensors = ", ".join(
            f"{k}: {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in self._tensors().items()
        )
        arrays = ", ".join(f"{k}: {v.shape} {v.dtype}" for k, v in self.non_tensor_batch.items())
        return (
            f"DataProto(len={len(self)}, batch={{{tensors}}}, non_tensor_batch={{{arrays}}}, "
            f"meta_info_keys={list(self.meta_info)})"
        )

    def select(
        self, tensor_keys: KeySelection = None, non_tensor_keys: KeySelection = None, meta_keys: KeySelection = None
    ) -> DataProto:
        """Keep only the named keys; ``None`` keeps all keys of that kind, ``[]`` keeps none."""
        tensors = self._tensors()
        tensor_keys = list(tensors) if tensor_keys is None else _key_list(tensor_keys)
        non_tensor_keys = list(self.non_tensor_batch) if non_tensor_keys is None else _key_list(non_tensor_keys)
        meta_keys = list(self.meta_info) if meta_keys is None else _key_list(meta_keys)
        _check_known("tensor", tensor_keys, tensors)
        _check_known("non-tensor", non_tensor_keys, self.non_tensor_batch)
        _check_known("meta", meta_keys, self.meta_info)
        return DataProto(
            batch=_make_batch({k: tensors[k] for k in tensor_keys}, self._device()),
            non_tensor_batch={k: self.non_tensor_batch[k] for k in non_tensor_keys},
            meta_info={k: self.meta_info[k] for k in meta_keys},
        )

    def pop(
        self, tensor_keys: KeySelection = None, non_tensor_keys: KeySelection = None, meta_keys: KeySelection = None
    ) -> DataProto:
        """Remove the named keys from ``self`` (mutates it) and return them; ``None`` pops none."""
        tensor_keys = _key_list(tensor_keys or [])
        non_tensor_keys = _key_list(non_tensor_keys or [])
        meta_keys = _key_list(meta_keys or [])
        # Validate everything first so a bad key leaves self untouched.
        popped = self.select(tensor_keys, non_tensor_keys, meta_keys)
        remaining = {k: v for k, v in self._tensors().items() if k not in tensor_keys}
        self.batch = _make_batch(remaining, self._device())
        for key in non_tensor_keys:
            del self.non_tensor_batch[key]
        for key in meta_keys:
            del self.meta_info[key]
        return popped

    def union(self, other: DataProto) -> DataProto:
        """Merge the keys of two same-length DataProtos; a key in both must hold equal values."""
        if self.has_rows and other.has_rows and len(self) != len(other):
            raise ValueError(f"union needs equal lengths, got {len(self)} and {len(other)}")
        tensors = _union_of("tensor", self._tensors(), other._tensors())
        non_tensors = _union_of("non-tensor", self.non_tensor_batch, other.non_tensor_batch)
        meta = _union_of("meta_info", self.meta_info, other.meta_info)
        device = self._device() if self._device() == other._device() else None
        return DataProto(batch=_make_batch(tensors, device), non_tensor_batch=non_tensors, meta_info=meta)

    def __getitem__(self, index: RowIndex) -> DataProto:
        """Rows by int (-> size-1 DataProto), slice, or 1-D int/bool index (tensor, list, ndarray)."""
        return self._take(_normalize_index(index, len(self)))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows ``start:end:step``, as Python slicing (views where torch allows)."""
        return self[slice(start, end, step)]

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> DataProto:
        """Rows in the order ``indices`` gives (e.g. a permutation from sequence balancing)."""
        if isinstance(indices, (int, slice)):
            raise TypeError("reorder takes a 1-D sequence of indices; use dp[i] or dp.slice() for ints/slices")
        return self._take(_normalize_index(indices, len(self)))

    def repeat(self, times: int, interleave: bool = True) -> DataProto:
        """Repeat every row ``times`` times: interleaved [a,a,b,b] (n samples per prompt) or tiled [a,b,a,b]."""
        if times < 0:
            raise ValueError(f"repeat times must be >= 0, got {times}")
        rows = np.arange(len(self), dtype=np.int64)
        return self._take(np.repeat(rows, times) if interleave else np.tile(rows, times))

    def chunk(self, chunks: int) -> list[DataProto]:
        """Exactly ``chunks`` contiguous pieces; sizes differ by at most 1, earlier pieces larger.

        Unlike torch.chunk this always returns ``chunks`` pieces (some empty when len < chunks), so
        the result can be zipped with a list of ``chunks`` workers.
        """
        if chunks <= 0:
            raise ValueError(f"chunk needs chunks > 0, got {chunks}")
        base, extra = divmod(len(self), chunks)
        bounds = [i * base + min(i, extra) for i in range(chunks + 1)]  # the first `extra` pieces get one more row
        return [self._take(slice(start, end)) for start, end in zip(bounds, bounds[1:])]

    def split(self, split_size: int) -> list[DataProto]:
        """Contiguous pieces of ``split_size`` rows, the last possibly smaller; an empty batch gives one empty piece."""
        if split_size <= 0:
            raise ValueError(f"split needs split_size > 0, got {split_size}")
        n = len(self)
        if n == 0:
            return [self._take(slice(0, 0))]  # as torch.split does, so concat(split(x)) == x holds
        return [self._take(slice(s, min(s + split_size, n))) for s in range(0, n, split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Stack rows of several DataProtos with identical keys; meta_info is merged and must agree."""
        data = list(data)
        if not data:
            raise ValueError("concat needs at least one DataProto")
        first = data[0]
        tensor_keys, non_tensor_keys = first.tensor_keys, list(first.non_tensor_batch)
        meta = dict(first.meta_info)
        for i, item in enumerate(data[1:], start=1):
            _check_same_keys("tensor", tensor_keys, item.tensor_keys, i)
            _check_same_keys("non-tensor", list(non_tensor_keys), list(item.non_tensor_batch), i)
            for key, value in item.meta_info.items():
                if key in meta and not _values_equal(meta[key], value):
                    raise ValueError(f"concat: meta_info {key!r} of item {i} ({value!r}) conflicts with {meta[key]!r}")
                meta.setdefault(key, value)
        tensors = {}
        for key in tensor_keys:
            try:
                tensors[key] = torch.cat([item.batch[key] for item in data])
            except RuntimeError as err:
                shapes = [tuple(item.batch[key].shape) for item in data]
                raise ValueError(f"concat: tensor {key!r} cannot be concatenated (shapes {shapes}): {err}") from err
        non_tensors = {key: np.concatenate([item.non_tensor_batch[key] for item in data]) for key in non_tensor_keys}
        devices = {item._device() for item in data}
        device = devices.pop() if len(devices) == 1 else None
        return DataProto(batch=_make_batch(tensors, device), non_tensor_batch=non_tensors, meta_info=meta)

    def to(self, device: torch.device | str) -> DataProto:
        """Move the tensor batch to ``device``; non-tensors and meta_info are unchanged."""
        batch = self.batch.to(device) if self.batch is not None else None
        return DataProto(batch=batch, non_tensor_batch=self.non_tensor_batch, meta_info=self.meta_info)

    def __getstate__(self) -> dict[str, Any]:
        # torch.save writes each storage as one raw blob, so the payload is about the tensors' bytes.
        # _compact drops storage a view does not use: otherwise a chunk would ship its parent's storage.
        batch_bytes = None
        if self.batch is not None:
            buffer = io.BytesIO()
            torch.save({k: _compact(v) for k, v in self.batch.items()}, buffer)
            batch_bytes = buffer.getvalue()
        return {
            "batch": batch_bytes,
            "batch_size": len(self),
            "device": None if self._device() is None else str(self._device()),
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch = None
        if state["batch"] is not None:
            tensors = torch.load(io.BytesIO(state["batch"]), weights_only=True)
            self.batch = TensorDict(tensors, batch_size=[state["batch_size"]], device=state["device"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def _tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.batch.items()) if self.batch is not None else {}

    def _device(self) -> torch.device | None:
        return self.batch.device if self.batch is not None else None

    def _take(self, rows: builtins.slice | np.ndarray) -> DataProto:
        """Rows by a positive-step slice (views) or a 1-D int64 array (gather); meta_info is shallow-copied."""
        batch = None
        if self.batch is not None:
            batch = self.batch[rows if isinstance(rows, slice) else torch.from_numpy(rows)]
        return DataProto(
            batch=batch,
            non_tensor_batch={k: v[rows] for k, v in self.non_tensor_batch.items()},
            meta_info=self.meta_info,  # __post_init__ makes the shallow copy
        )


def _make_batch(tensors: dict[str, torch.Tensor], device: torch.device | None = None) -> TensorDict | None:
    if not tensors:
        return None
    return TensorDict(tensors, batch_size=[len(next(iter(tensors.values())))], device=device)


def _as_row_array(key: str, value: Any) -> np.ndarray:
    if isinstance(value, (list, tuple)):
        # Fill element by element: np.array(list_of_equal_length_lists) would build a 2-D array.
        array = np.empty(len(value), dtype=object)
        for i, item in enumerate(value):
            array[i] = item
        return array
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise ValueError(f"non-tensor {key!r} is 0-dimensional; it needs a leading batch dimension")
        return value
    raise TypeError(f"non-tensor {key!r} must be a numpy array, list or tuple, got {type(value).__name__}")


def _check_lengths(tensors: dict[str, torch.Tensor], non_tensors: dict[str, np.ndarray]) -> None:
    reference: tuple[str, int] | None = None
    for kind, values in (("tensor", tensors), ("non-tensor", non_tensors)):
        for key, value in values.items():
            length = len(value)
            if reference is None:
                reference = (f"{kind} {key!r}", length)
            elif length != reference[1]:
                raise ValueError(f"{kind} {key!r} has length {length}, but {reference[0]} has length {reference[1]}")


def _union_of(kind: str, ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    merged = dict(ours)
    for key, value in theirs.items():
        if key in merged and not _values_equal(merged[key], value):
            # Show meta values (small by nature); tensors and arrays would flood the message.
            detail = f": {merged[key]!r} vs {value!r}" if kind == "meta_info" else " between the two DataProtos"
            raise ValueError(f"union: {kind} {key!r} differs{detail}")
        merged[key] = value
    return merged


def _key_list(keys: str | Iterable[str]) -> list[str]:
    return [keys] if isinstance(keys, str) else list(keys)


def _check_known(kind: str, keys: list[str], existing: dict[str, Any]) -> None:
    for key in keys:
        if key not in existing:
            raise KeyError(f"unknown {kind} key {key!r}; {kind} keys are {sorted(existing)}")


def _check_same_keys(kind: str, expected: list[str], got: list[str], item: int) -> None:
    for key in expected:
        if key not in got:
            raise ValueError(f"concat: item {item} is missing {kind} key {key!r} that item 0 has")
    for key in got:
        if key not in expected:
            raise ValueError(f"concat: item {item} has {kind} key {key!r} that item 0 lacks")


def _normalize_index(index: RowIndex, n: int) -> slice | np.ndarray:
    """Turn any accepted row index into a positive-step slice or a 1-D int64 numpy array."""
    if isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_)):
        i = int(index)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for DataProto of length {n}")
        i %= n
        return slice(i, i + 1)
    if isinstance(index, slice):
        start, stop, step = index.indices(n)
        if step > 0:
            return slice(start, stop, step)
        return np.arange(start, stop, step, dtype=np.int64)  # torch cannot view with a negative step
    array = index.detach().cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    if array.ndim != 1:
        raise IndexError(f"row indices must be 1-D, got shape {array.shape}")
    if array.dtype == np.bool_:
        if len(array) != n:
            raise IndexError(f"boolean mask has length {len(array)}, DataProto has length {n}")
        return np.flatnonzero(array).astype(np.int64)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)  # np.asarray([]) is float64
    if not np.issubdtype(array.dtype, np.integer):
        raise IndexError(f"row indices must be integers or booleans, got dtype {array.dtype}")
    array = array.astype(np.int64)
    bad = (array < -n) | (array >= n)
    if bad.any():
        raise IndexError(f"index {int(array[bad][0])} out of range for DataProto of length {n}")
    return array  # negative entries are fine: torch and numpy both index from the end


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.contiguous()
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        tensor = tensor.clone()  # a view into a larger storage: copy just its own bytes
    return tensor


def _values_equal(a: Any, b: Any) -> bool:
    """Equality that works for tensors, arrays (incl. object arrays and NaN) and nested containers."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        b = b.to(a.device)
        if a.is_floating_point() or a.is_complex():
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:
            return all(_values_equal(x, y) for x, y in zip(a.ravel(), b.ravel()))
        nan_aware = a.dtype.kind in "fc" and b.dtype.kind in "fc"
        return bool(np.array_equal(a, b, equal_nan=nan_aware))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False
