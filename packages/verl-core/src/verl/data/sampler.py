"""A batch sampler whose position can be saved and restored, so a resumed run sees the same batches.

Epoch e visits the rows in `torch.randperm(n)` drawn from a generator seeded with seed + e (or in order
when shuffle is off). The state is (epoch, batches already taken in that epoch): nothing else is needed to
recompute what comes next.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class ResumableSampler:
    """Batches of row indices over epochs; `next_indices()` takes one, `iter()` the rest of the epoch."""

    def __init__(self, n: int, *, batch_size: int, shuffle: bool, seed: int = 0, drop_last: bool = True) -> None:
        if n < 1:
            raise ValueError(f"the data set is empty (n={n}); nothing to sample")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and batch_size > n:
            raise ValueError(
                f"batch_size={batch_size} is larger than the data set ({n} rows), so drop_last leaves no batch; "
                "lower the batch size or use more data"
            )
        self.n, self.batch_size, self.shuffle, self.seed, self.drop_last = n, batch_size, shuffle, seed, drop_last
        self.epoch = 0
        self.position = 0  # batches taken in the current epoch
        self._order: tuple[int, list[int]] | None = None  # (epoch, row order) of the last epoch used

    @property
    def steps_per_epoch(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def epoch_order(self, epoch: int) -> list[int]:
        """The order in which `epoch` visits the rows."""
        if self._order is None or self._order[0] != epoch:
            order = list(range(self.n))
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                order = torch.randperm(self.n, generator=generator).tolist()
            self._order = (epoch, order)
        return self._order[1]

    def next_indices(self) -> list[int]:
        """The next batch; after an epoch's last batch the state moves to the start of the next epoch."""
        start = self.position * self.batch_size
        batch = self.epoch_order(self.epoch)[start : start + self.batch_size]
        self.position += 1
        if self.position == self.steps_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        return batch

    def __iter__(self) -> Iterator[list[int]]:
        """The batches left in the current epoch (all of them at an epoch's start)."""
        for _ in range(self.steps_per_epoch - self.position):
            yield self.next_indices()

    def state_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in ("epoch", "position", "seed", "n", "batch_size")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`, which must come from a sampler over the same rows and batch size."""
        for key in ("n", "batch_size"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state[key]}, but this sampler has {key}={getattr(self, key)}; "
                    "a resumed run needs the same data and batch size to continue where it stopped"
                )
        missing = [k for k in ("epoch", "position", "seed") if k not in state]
        if missing:
            raise ValueError(f"sampler state lacks {missing}; expected the dict from ResumableSampler.state_dict()")
        if not 0 <= state["position"] < self.steps_per_epoch:
            raise ValueError(f"sampler state position={state['position']} is outside 0..{self.steps_per_epoch - 1}")
        self.epoch, self.position, self.seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
        self._order = None
