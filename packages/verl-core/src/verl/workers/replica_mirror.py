"""A rollout service replica over several ranks (rollout tp > 1: one engine spans a tensor-parallel group, and every
rank of it must make the same engine calls in the same order, since each forward is collective).

The group's first rank runs the service (`verl.workers.rollout_server.RolloutServer`) on a `MirroredEngine`: every
call the server makes on its engine is first broadcast to the other ranks of the group, whose `Follower` thread
makes the same call on their engine. The server already makes all its engine calls under one lock, so the calls
reach every rank in one order. Weights arrive at every rank over the transfer group; a follower stages each sync
and loads it when the leader's server loads its own, between the same two turns."""

from __future__ import annotations

import datetime
import queue
import threading
from typing import Any, Iterable, List, Optional, Tuple

import torch.distributed as dist

# The engine calls the service makes (verl.workers.rollout_server); anything else is read from the engine as is.
MIRRORED = ("generate", "add_request", "step_requests", "abort_requests", "update_weights")
# A replica may sit idle for long (a paused service while the trainer validates or saves): its followers wait on
# the group that long without a collective timeout.
IDLE_TIMEOUT = datetime.timedelta(days=1)


def replica_groups(ranks_per_replica: List[List[int]]) -> List[Any]:
    """A process group per replica (collective: every rank of the default group creates every group, in order)."""
    return [dist.new_group(ranks, backend="gloo", timeout=IDLE_TIMEOUT) for ranks in ranks_per_replica]


def _send(call: Optional[Tuple[str, tuple, dict]], group: Any, leader: int) -> Any:
    """The leader's `call` on every rank of the replica (the others pass None and get it)."""
    box = [call]
    dist.broadcast_object_list(box, src=leader, group=group)
    return box[0]


class MirroredEngine:
    """The leader's engine, each service call sent to the followers before it is made here."""

    def __init__(self, engine: Any, group: Any, leader: int):
        self.engine, self.group, self.leader = engine, group, leader

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.engine, name)
        if name not in MIRRORED:
            return attr

        def mirrored(*args: Any, **kwargs: Any) -> Any:
            if name == "update_weights":  # the followers load the sync they staged, not these tensors
                _send((name, (), {}), self.group, self.leader)
            else:
                _send((name, args, kwargs), self.group, self.leader)
            return attr(*args, **kwargs)

        return mirrored


class Follower:
    """A non-leading rank of a replica: makes the leader's engine calls on this rank's engine, in a thread."""

    def __init__(self, engine: Any, group: Any, leader: int):
        self.engine, self.group, self.leader = engine, group, leader
        self.engine_lock = threading.Lock()  # held during each call: a weight check reads the engine between them
        self.staged: "queue.Queue[List[Tuple[str, Any]]]" = queue.Queue()
        self.loaded = threading.Condition()
        self.stages = self.loads = 0  # syncs received, and loaded into the engine
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._loop, name="rollout-follower", daemon=True)
        self.thread.start()

    def stage(self, weights: Iterable[Tuple[str, Any]]) -> int:
        """Keep a received sync until the leader loads its own; returns its sequence number (1, 2, ...)."""
        self.raise_if_failed()
        self.staged.put(list(weights))
        self.stages += 1  # (one caller: the worker's weight sync)
        return self.stages

    def wait_loaded(self, number: int, timeout_s: float = 600.0) -> None:
        """Block until sync `number` is in this rank's engine."""
        with self.loaded:
            if not self.loaded.wait_for(lambda: self.loads >= number or self.error is not None, timeout_s):
                raise TimeoutError(f"the replica's leader did not load weight sync {number} within {timeout_s:.0f} s")
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"this rank's part of the rollout replica failed: {self.error!r}") from self.error

    def _loop(self) -> None:
        try:
            while True:
                # (the replica lives as long as its processes: there is no last call to wait for)
                name, args, kwargs = _send(None, self.group, self.leader)
                with self.engine_lock:
                    if name == "update_weights":
                        self.engine.update_weights(iter(self.staged.get()))
                    else:
                        getattr(self.engine, name)(*args, **kwargs)
                if name == "update_weights":
                    with self.loaded:
                        self.loads += 1
                        self.loaded.notify_all()
        except BaseException as err:  # reported to this rank's next weight sync
            with self.loaded:
                self.error = err
                self.loaded.notify_all()
