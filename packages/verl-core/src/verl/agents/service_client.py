"""The generation client of agent loops over the rollout service (trainer.mode=async): each model turn is one
request to the service, so a trajectory's turns go on while the trainer trains and other trajectories generate.

A pump thread owns the traffic: it submits the turns the loops asked for, polls the replicas, and hands each
finished request back to the event loop of the trajectory that waits for it. A turn lost with a failed replica
(rollout.on_replica_failure=continue) is submitted again as it was: it holds the whole context, so nothing of the
trajectory is lost. A turn whose trajectory was cancelled is aborted on its replica.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from verl.agents.client import Completion


class ServiceClient:
    def __init__(self, client: Any, *, eos_ids: Sequence[int], temperature: float, poll_s: float = 0.02):
        """client: a verl.trainer.rollout_client.RolloutClient; temperature: the one a turn asking for None gets."""
        self.client, self.eos_ids, self.temperature, self.poll_s = client, set(eos_ids), temperature, poll_s
        self.waiting: Dict[str, Tuple[asyncio.AbstractEventLoop, asyncio.Future, Dict[str, Any]]] = {}
        self.outbox: List[Dict[str, Any]] = []
        self.aborts: List[str] = []
        self.resubmitted = 0  # turns lost with a failed replica and submitted again
        self.error: Optional[BaseException] = None
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._pump, name="agent-service-client", daemon=True)
        self._thread.start()

    # ---- the GenerationClient interface (on an event loop) ---------------------------------------------------
    async def generate(self, ids: List[int], *, max_new_tokens: int, temperature: Optional[float] = None) -> Completion:
        if max_new_tokens < 1:
            return Completion([], [], False)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        rid = f"agent:{next(self._ids)}"
        request = {
            "id": rid,
            "prompt": list(ids),
            "temperature": self.temperature if temperature is None else temperature,
            "max_tokens": max_new_tokens,
        }
        with self._lock:
            if self.error is not None:
                raise self.error
            self.waiting[rid] = (loop, future, request)
            self.outbox.append(request)
        self._wake.set()
        try:
            tokens, log_probs, versions = await future
        except asyncio.CancelledError:  # the trajectory was cancelled (wall time, a regenerated group)
            with self._lock:
                if self.waiting.pop(rid, None) is not None:
                    self.aborts.append(rid)
            self._wake.set()
            raise
        finished = bool(tokens) and tokens[-1] in self.eos_ids
        return Completion(tokens, log_probs, finished, min(versions, default=None))

    def enter(self) -> None:  # (the service batches by its own turns: nothing to count here)
        pass

    def leave(self) -> None:
        pass

    # ---- the pump thread --------------------------------------------------------------------------------------
    def _pump(self) -> None:
        while not self._closed:
            with self._lock:
                submit, self.outbox = self.outbox, []
                aborts, self.aborts = self.aborts, []
                idle = not self.waiting
            try:
                if aborts:
                    self.client.abort(aborts)
                if submit:
                    self.client.submit(submit)
                if idle:
                    self._wake.wait(0.1)
                    self._wake.clear()
                    continue
                finished = self.client.poll(self.poll_s)
                lost = self.client.take_lost()
            except BaseException as err:  # a replica failed and the run stops: every waiting turn gets the error
                self._fail(err)
                return
            with self._lock:
                again = [self.waiting[rid][2] for rid in lost if rid in self.waiting]
                self.outbox += again  # (submitted whole once more: a turn holds its trajectory's context)
                self.resubmitted += len(again)
                for f in finished:
                    loop, future, _ = self.waiting.pop(f.id, (None, None, None))
                    if loop is not None:
                        loop.call_soon_threadsafe(_settle, future, (f.tokens, f.log_probs, f.versions))

    def _fail(self, err: BaseException) -> None:
        with self._lock:
            self.error = err
            waiting, self.waiting = self.waiting, {}
        for loop, future, _ in waiting.values():
            loop.call_soon_threadsafe(_settle_error, future, err)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)
        with self._lock:
            ids = list(self.waiting)
        if ids and self.error is None:
            self.client.abort(ids)


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _settle_error(future: asyncio.Future, err: BaseException) -> None:
    if not future.done():
        future.set_exception(err)
