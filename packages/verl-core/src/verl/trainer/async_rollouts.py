"""trainer.mode=async: training batches generated ahead on the rollout service, within a staleness bound.

Batch j (the prompts step j trains on) is submitted once the trainer's policy version v (updates done) reaches
j - max_staleness, so the rollout runs up to max_staleness batches ahead and its replicas stay busy while the
actor trains. Weight updates reach the replicas between two of their turns: a sample midway keeps its tokens and
their log-probs and continues under the new policy (a partial rollout). The staleness of a sample is the
trainer's version when it trains on it minus the oldest version that sampled any of its tokens; the admission
rule bounds it by max_staleness (j - (j - max_staleness)), and `take` checks it: a sample over the bound (none
under this rule, but a replica that missed weight updates makes them) has its whole group generated again under
the current policy (trainer.on_stale=regenerate), or its group left out of the step (drop: the batch keeps as many
of the other groups as whole data-parallel shares allow); either is counted.

A checkpoint's data position is the one before the oldest batch in flight: a resumed run reads those prompts
again and generates them anew, so no prompt is skipped and no sample trained twice (the in-flight samples are
discarded, and counted). Requests lost with a failed replica (rollout.on_replica_failure=continue) are submitted
again to the others (`async/resubmitted`). Validation runs through the service too (`generate_now`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from verl.protocol import DataProto
from verl.rollout_batch import assemble_rollout, pad_rows, unpadded_prompts
from verl.trainer.shaping import groups_per_share


@dataclass
class Slot:
    """One training batch in flight."""

    index: int  # the step that trains on it (0-based); negative: a validation batch
    prompts: DataProto  # its prompt rows, with their text columns and uids
    data_position: Optional[Dict[str, Any]]  # the data loader's state before these prompts were read
    submitted_version: int
    n: int = 1  # samples per prompt
    temperature: float = 1.0
    done: Dict[int, Any] = field(default_factory=dict)  # by row: a Finished request (or an agent's Trajectory)
    attempt: Dict[int, int] = field(default_factory=dict)  # row -> the attempt whose result counts
    regenerated: int = 0
    resubmitted: int = 0
    dropped: set = field(default_factory=set)  # prompt groups left out (trainer.on_stale=drop)

    @property
    def complete(self) -> bool:
        return len(self.done) + len(self.dropped) * self.n == len(self.prompts) * self.n


class AsyncRollouts:
    def __init__(
        self,
        client: Any,  # verl.trainer.rollout_client.RolloutClient
        *,
        read_prompts: Callable[[], DataProto],  # the next batch of prompts (with uids)
        data_position: Callable[[], Dict[str, Any]],  # the loader's state now
        n: int,
        temperature: float,
        response_length: int,
        eos_ids: List[int],
        pad_id: int,
        max_staleness: int,
        total_steps: Optional[int] = None,
        on_stale: str = "regenerate",  # or "drop"
        row_multiple: int = 1,  # a batch with dropped groups keeps a multiple of this many rows (the train DP)
    ):
        self.client, self.read_prompts, self.position = client, read_prompts, data_position
        self.n, self.temperature, self.width = n, temperature, response_length
        self.eos_ids, self.pad_id = eos_ids, pad_id
        self.max_staleness, self.total_steps = max_staleness, total_steps
        if on_stale not in ("regenerate", "drop"):
            raise ValueError(f"trainer.on_stale must be 'regenerate' or 'drop', got {on_stale!r}")
        self.on_stale, self.row_multiple = on_stale, row_multiple
        self.slots: List[Slot] = []
        self.next_index = 0
        self.owner: Dict[str, tuple[Slot, int]] = {}  # request id in flight -> (its slot, its row)
        self.validations = 0

    @staticmethod
    def request_id(index: int, row: int, attempt: int = 0) -> str:
        return f"{index}:{row}:{attempt}"

    def start_at(self, step: int) -> None:
        """The first batch to submit is the one step `step` trains on (0, or where a resumed run continues)."""
        self.next_index = step

    def fill(self, version: int) -> None:
        """Submit every batch the staleness bound admits at policy `version`."""
        while self.next_index <= version + self.max_staleness and (
            self.total_steps is None or self.next_index < self.total_steps
        ):
            position = self.position()
            prompts = self.read_prompts()
            slot = Slot(self.next_index, prompts, position, version, self.n, self.temperature)
            self._submit(slot, range(len(prompts) * self.n))
            self.slots.append(slot)
            self.next_index += 1

    def _submit(self, slot: Slot, rows, attempt: int = 0) -> None:
        ids = unpadded_prompts(slot.prompts)
        images = slot.prompts.non_tensor_batch.get("multi_modal_inputs")  # (a vision-language run's pixels)
        requests = []
        for row in rows:
            slot.attempt[row] = attempt
            rid = self.request_id(slot.index, row, attempt)
            self.owner[rid] = (slot, row)
            request = {"id": rid, "prompt": ids[row // slot.n], "temperature": slot.temperature}
            if images is not None and images[row // slot.n]:
                request["images"] = images[row // slot.n]
            requests.append(request)
        groups = [f"{slot.index}:{row // slot.n}" for row in rows]  # a prompt's samples on one replica
        self.client.submit(requests, groups)

    def _collect(self, poll_s: float) -> None:
        """Finished requests into their slots (a superseded attempt is dropped); lost ones submitted again."""
        for f in self.client.poll(poll_s):
            slot, row = self.owner.pop(f.id, (None, None))
            if slot is not None and slot.attempt.get(row) == int(f.id.rsplit(":", 1)[1]):
                slot.done[row] = f
        for rid in self.client.take_lost():
            slot, row = self.owner.pop(rid, (None, None))
            if slot is not None and row not in slot.done:
                slot.resubmitted += 1
                self._submit(slot, [row], attempt=slot.attempt[row] + 1)

    def generate_now(self, prompts: DataProto, temperature: float) -> DataProto:
        """One sample per prompt through the service, waited for (validation); batches ahead keep generating."""
        self.validations += 1
        slot = Slot(-self.validations, prompts, None, -1, 1, temperature)
        self._submit(slot, range(len(prompts)))
        while not slot.complete:
            self._collect(0.05)
        return self._assemble(slot)

    def take(self, version: int, poll_s: float = 0.05) -> tuple[DataProto, Dict[str, float]]:
        """The batch of step `version` (the trainer's updates so far), once every one of its samples is done."""
        self.fill(version)
        slot = self.slots[0]
        if slot.index != version:
            raise RuntimeError(
                f"async rollouts: step {version} wants batch {version}, the oldest in flight is {slot.index}"
            )
        start = time.perf_counter()
        while not slot.complete:
            self._collect(poll_s)
            self._check_stale(slot, version)
        self.slots.pop(0)
        waited = time.perf_counter() - start
        total = len(slot.prompts) * slot.n
        if slot.dropped:
            slot = self._without_dropped(slot)
        batch = self._assemble(slot)
        metrics = {
            "async/queue_batches": float(len(self.slots)),  # batches still generating after this one
            "async/regenerated": float(slot.regenerated),
            "async/dropped": float(total - len(batch)),
            "async/resubmitted": float(slot.resubmitted),
            "rollout/replicas": float(len(self.client.replicas)),
            "timing/rollout_wait_s": waited,
        }
        return batch, metrics

    def _check_stale(self, slot: Slot, version: int) -> None:
        """Samples over the bound: their whole group generated again under the current policy, or left out of the
        step (on_stale=drop); counted either way."""
        stale = [row for row, f in slot.done.items() if version - self.oldest_version(f) > self.max_staleness]
        if not stale:
            return
        groups = sorted({row // self.n for row in stale})
        rows = [g * self.n + k for g in groups for k in range(self.n)]
        old = [self.request_id(slot.index, r, slot.attempt[r]) for r in rows if r not in slot.done]
        self._cancel(old)
        for rid in old:
            self.owner.pop(rid, None)
        for row in rows:
            slot.done.pop(row, None)
        if self.on_stale == "drop":
            slot.dropped.update(groups)
            return
        slot.regenerated += len(rows)
        self._submit(slot, rows, attempt=max(slot.attempt[r] for r in rows) + 1)

    def _without_dropped(self, slot: Slot) -> Slot:
        """The slot's other groups, as many as make a multiple of row_multiple rows, renumbered from 0."""
        keep = [g for g in range(len(slot.prompts)) if g not in slot.dropped]
        per = groups_per_share(self.row_multiple, slot.n)
        keep = keep[: len(keep) - len(keep) % per]
        if not keep:
            raise RuntimeError(
                f"async rollouts: every prompt group of step {slot.index}'s batch was over trainer.max_staleness="
                f"{self.max_staleness} (or too few were left for {self.row_multiple} data-parallel ranks) and "
                "trainer.on_stale=drop left none to train on: are the rollout replicas receiving weight updates? "
                "Use on_stale=regenerate, or raise max_staleness"
            )
        done = {i * slot.n + k: slot.done[g * slot.n + k] for i, g in enumerate(keep) for k in range(slot.n)}
        self._keep_groups(slot, keep)
        return dataclasses.replace(slot, prompts=slot.prompts[keep], done=done, attempt={}, dropped=set())

    def _keep_groups(self, slot: Slot, keep: List[int]) -> None:
        """What a subclass holds per row of `slot`, narrowed to the groups `keep` (nothing here)."""

    @staticmethod
    def oldest_version(result: Any) -> int:
        """The oldest policy version that sampled a token of a row's result."""
        return result.oldest_version

    def _cancel(self, ids: List[str]) -> None:
        """Stop rows in flight (their results will not count)."""
        self.client.abort(ids)

    def _assemble(self, slot: Slot) -> DataProto:
        rows = [slot.done[i] for i in range(len(slot.prompts) * slot.n)]
        prompts = slot.prompts.repeat(slot.n, interleave=True) if slot.n > 1 else slot.prompts
        responses = pad_rows([f.tokens for f in rows], self.width, self.pad_id, torch.long)
        log_probs = pad_rows([f.log_probs for f in rows], self.width, 0.0, torch.float32)
        lengths = torch.tensor([len(f.tokens) for f in rows])
        batch = assemble_rollout(prompts, responses, log_probs, lengths, eos_ids=self.eos_ids)
        batch.batch["weight_version"] = torch.tensor([f.oldest_version for f in rows], dtype=torch.long)
        return batch

    def data_position(self) -> Dict[str, Any]:
        """Where a resumed run reads from: before the oldest batch in flight (those are generated anew)."""
        return self.slots[0].data_position if self.slots else self.position()

    def in_flight_samples(self) -> int:
        return sum(len(s.prompts) * s.n for s in self.slots)

    def close(self) -> None:
        """(The replicas' services end with their workers.)"""
