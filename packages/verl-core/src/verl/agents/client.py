"""The generation client an agent loop awaits: one request (context token ids, a token budget) -> one completion.

`BatchingClient` serves the requests of many trajectories at once through a batch generate call (the colocated
engine or a rollout pool in synchronous training): a round takes every request waiting when it starts and runs
while tools and other trajectories go on; requests that arrive meanwhile go in the next round. There is no barrier
per turn: a trajectory whose tool is slow simply joins a later round.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Sequence, Tuple


@dataclass
class Request:
    ids: List[int]  # the whole context: prompt, earlier turns, inserted tokens
    max_new_tokens: int
    temperature: Optional[float]  # None: the rollout's


@dataclass
class Completion:
    ids: List[int]  # sampled tokens, up to and including eos when the turn ended there
    log_probs: List[float]
    finished: bool  # ended with eos (else it ran out of tokens)
    version: Optional[int] = None  # the policy version (weight updates) that sampled it, where the rollout tells


class GenerationClient(Protocol):
    async def generate(
        self, ids: List[int], *, max_new_tokens: int, temperature: Optional[float] = None
    ) -> Completion: ...


# A batch of requests -> their completions, in order (blocking; run off the event loop)
GenerateBatch = Callable[[Sequence[Request]], List[Completion]]


class BatchingClient:
    def __init__(self, generate_batch: GenerateBatch, *, gather_s: float = 0.005):
        """gather_s: how long a round waits for more requests once one is waiting, unless every live trajectory
        is already waiting (then it starts at once)."""
        self.generate_batch, self.gather_s = generate_batch, gather_s
        self.waiting: List[Tuple[Request, asyncio.Future]] = []
        self.live = 0  # trajectories running (the runner counts them in and out)
        self.rounds: List[int] = []  # requests per round
        self.busy_s = 0.0
        self._wake: Optional[asyncio.Event] = None
        self._server: Optional[asyncio.Task] = None

    async def generate(self, ids: List[int], *, max_new_tokens: int, temperature: Optional[float] = None) -> Completion:
        if self._server is None:
            self._wake = asyncio.Event()
            self._server = asyncio.get_running_loop().create_task(self._serve())
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((Request(list(ids), max_new_tokens, temperature), future))
        self._wake.set()
        return await future

    def enter(self) -> None:
        self.live += 1

    def leave(self) -> None:
        self.live -= 1
        if self._wake is not None:
            self._wake.set()  # the others may all be waiting now

    async def _serve(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.waiting:
                continue
            deadline = time.perf_counter() + self.gather_s
            while len(self.waiting) < self.live and time.perf_counter() < deadline:
                await asyncio.sleep(self.gather_s / 5)
            batch, self.waiting = self.waiting, []
            self.rounds.append(len(batch))
            start = time.perf_counter()
            try:
                out = await asyncio.to_thread(self.generate_batch, [r for r, _ in batch])
            except BaseException as e:  # the engine failed: every waiting trajectory gets the error
                for _, f in batch:
                    if not f.done():
                        f.set_exception(e)
                continue
            finally:
                self.busy_s += time.perf_counter() - start
            for (_, f), c in zip(batch, out):
                if not f.done():  # (cancelled: its trajectory ran out of wall time)
                    f.set_result(c)
            if self.waiting:
                self._wake.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.cancel()
            try:
                await self._server
            except asyncio.CancelledError:
                pass
            self._server = None
