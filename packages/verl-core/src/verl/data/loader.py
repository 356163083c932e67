"""Batches of a data set, in the order a `ResumableSampler` gives: a plain loop, no worker processes.

Tokenisation happens once when the data set is built, so collating a batch is cheap and worker
processes would buy nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from verl.data.sampler import ResumableSampler

Collate = Callable[[list[Any]], Any]


class DataLoader:
    """`next_batch()` gives the next batch, crossing epochs; `for batch in loader` gives the rest of the epoch."""

    def __init__(self, dataset: Any, sampler: ResumableSampler, collate: Collate) -> None:
        """dataset: rows by index (`len` and `[i]`), with the attributes its kind has (files, has_ref, ...)."""
        if len(dataset) != sampler.n:
            raise ValueError(f"the sampler covers {sampler.n} rows but the data set has {len(dataset)}")
        self.dataset, self.sampler, self.collate = dataset, sampler, collate

    def next_batch(self) -> Any:
        return self.collate([self.dataset[i] for i in self.sampler.next_indices()])

    def __iter__(self) -> Iterator[Any]:
        for indices in self.sampler:
            yield self.collate([self.dataset[i] for i in indices])

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
