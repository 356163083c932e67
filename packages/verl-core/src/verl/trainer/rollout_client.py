"""RolloutClient: the driver's side of the rollout service, with one replica per engine of the rollout's pool (a rank,
or a tp group of ranks served by its first).

    client = RolloutClient(workers.rollout, chunk=32, max_batch=256)
    client.submit([{"id": "7:0", "prompt": [5, 9, 12], "temperature": 1.0}, ...], groups=[...])
    finished = client.poll(timeout_s=0.1)        # Finished requests from every replica
    finished, updates = client.stream(0.1)       # ... and the tokens live ones gained since the last call
    client.abort(["7:0"]); client.pause(); client.resume()

Requests of one group (a prompt's n samples) go to the same replica, the one with the fewest requests in flight.
A replica that fails (its engine raised, its process died) is reported by name. With `on_failure="stop"` the run
stops with a `ReplicaFailed` naming the replica, its rank and pool, and the original error; with "continue" (and
another replica left) the failure is logged with the same words, the replica is dropped (`dead`), and the ids of
its requests in flight are handed back (`take_lost`) to be submitted again to the others.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from verl.controller.errors import WorkerError
from verl.workers.rollout import RolloutWorker
from verl.workers.rollout_server import Finished, Update

logger = logging.getLogger(__name__)


def _locked(method):
    """One caller at a time: agent loops' turns are submitted and polled from a thread of their own."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)

    return call


class ReplicaFailed(RuntimeError):
    """A rollout service replica failed; `replica` is its rank in the rollout's pool."""

    def __init__(self, replica: int, pool: str, method: str, cause: BaseException, then: str = "the run stops"):
        self.replica, self.pool = replica, pool
        super().__init__(
            f"rollout replica {replica} (rank {replica} of pool '{pool}') failed in {method}; {then}. "
            f"The replica's error:\n{cause}"
        )


class RolloutClient:
    def __init__(self, group: Any, *, chunk: int, max_batch: int, pool: str = "rollout", on_failure: str = "stop"):
        self.group, self.pool, self.on_failure = group, pool, on_failure
        # a replica per tp group of the pool, served by its first rank (the others follow it); the live ones
        serves = group.call(RolloutWorker.start_service, chunk, max_batch)
        self.replicas = [rank for rank, serving in enumerate(serves) if serving]
        self.dead: List[int] = []
        self.lost: List[str] = []  # ids of requests that were in flight on a replica that failed
        self.in_flight: Dict[int, int] = {r: 0 for r in self.replicas}
        self.where: Dict[str, int] = {}  # request id -> replica
        self.counters: Dict[str, float] = defaultdict(float)  # turns, tokens, busy_s, interrupted (summed)
        self.lock = threading.RLock()

    def _failed(self, replica: int, method: str, err: WorkerError) -> None:
        """Stop the run naming the replica, or (on_failure=continue, another replica left) drop it and hand its
        requests in flight back."""
        if self.on_failure != "continue" or len(self.replicas) == 1:
            raise ReplicaFailed(replica, self.pool, method, err) from err
        lost = [i for i, r in self.where.items() if r == replica]
        self.replicas.remove(replica)
        self.dead.append(replica)
        for i in lost:
            del self.where[i]
        self.lost += lost
        then = f"continuing on replicas {self.replicas} ({len(lost)} of its requests generated again)"
        logger.warning("%s", ReplicaFailed(replica, self.pool, method, err, then=then))

    @_locked
    def take_lost(self) -> List[str]:
        lost, self.lost = self.lost, []
        return lost

    def _call(self, replica: int, method, *args: Any) -> Any:
        try:
            return self.group.submit_to(replica, method, *args).result()
        except WorkerError as err:
            self._failed(replica, method.__name__, err)
            return None

    @_locked
    def check_alive(self) -> None:
        """Ask every live replica for its weight version: one that does not answer has failed (see `_failed`)."""
        pending = [(r, self.group.submit_to(r, RolloutWorker.weight_version)) for r in self.replicas]
        for replica, call in pending:
            try:
                call.result()
            except WorkerError as err:
                self._failed(replica, "weight_version", err)

    @_locked
    def submit(self, requests: Sequence[Dict[str, Any]], groups: Optional[Sequence[str]] = None) -> None:
        """Queue requests (id, prompt token ids, temperature, max_tokens); those sharing a group key go together."""
        groups = groups or [r["id"] for r in requests]
        by_group: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
        for request, key in zip(requests, groups):
            by_group[key].append(request)
        batches: Dict[int, List[Dict[str, Any]]] = defaultdict(list)
        for members in by_group.values():
            replica = min(self.replicas, key=lambda r: self.in_flight[r])  # the least loaded
            batches[replica] += members
            self.in_flight[replica] += len(members)
            for request in members:
                self.where[request["id"]] = replica
        pending = [(r, self.group.submit_to(r, RolloutWorker.service_submit, reqs)) for r, reqs in batches.items()]
        again: List[Dict[str, Any]] = []
        for replica, call in pending:
            try:
                call.result()
            except WorkerError as err:
                self._failed(replica, "service_submit", err)  # (raises unless the others carry on)
                again += batches[replica]
        if again:
            lost = {r["id"] for r in again}
            self.lost = [i for i in self.lost if i not in lost]  # submitted again here, not by the caller
            self.submit(again, [g for g, r in zip(groups, requests) if r["id"] in lost])

    def poll(self, timeout_s: float = 0.0) -> List[Finished]:
        """Finished requests of every replica (each waits up to timeout_s for one)."""
        return self._poll(timeout_s, stream=False)[0]

    def stream(self, timeout_s: float = 0.0) -> Tuple[List[Finished], List[Update]]:
        """Finished requests, and the tokens (with log-probs and versions) live ones gained since the last call."""
        return self._poll(timeout_s, stream=True)

    @_locked
    def _poll(self, timeout_s: float, stream: bool) -> Tuple[List[Finished], List[Update]]:
        pending = [(r, self.group.submit_to(r, RolloutWorker.service_poll, timeout_s, stream)) for r in self.replicas]
        finished: List[Finished] = []
        updates: List[Update] = []
        for replica, call in pending:
            try:
                out = call.result()
            except WorkerError as err:
                self._failed(replica, "service_poll", err)
                continue
            for key in ("turns", "tokens", "busy_s", "interrupted"):
                self.counters[key] += out[key]
            self.in_flight[replica] = out["in_flight"]
            for f in out["finished"]:
                self.where.pop(f["id"], None)
                finished.append(Finished(**f))
            updates += [Update(**u) for u in out["updates"]]
        return finished, updates

    @_locked
    def abort(self, ids: Sequence[str]) -> int:
        by_replica: Dict[int, List[str]] = defaultdict(list)
        for i in ids:
            if i in self.where:
                by_replica[self.where.pop(i)].append(i)
        return sum(self._call(r, RolloutWorker.service_abort, reqs) or 0 for r, reqs in by_replica.items())

    @_locked
    def pause(self) -> None:
        for r in list(self.replicas):
            self._call(r, RolloutWorker.service_pause)

    @_locked
    def resume(self) -> None:
        for r in list(self.replicas):
            self._call(r, RolloutWorker.service_resume)

    @_locked
    def take_counters(self) -> Dict[str, float]:
        counters, self.counters = dict(self.counters), defaultdict(float)
        return counters
