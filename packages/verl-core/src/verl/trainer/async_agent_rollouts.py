"""trainer.mode=async with agent loops: the rows of a batch in flight are trajectories, each an agent loop running
on an event loop of the driver's (a thread of its own), its model turns requests to the rollout service.

Admission, the staleness bound, checkpoints' data positions and validation are AsyncRollouts'; what differs is
what a row is. A trajectory's staleness is measured from the oldest policy version that sampled any of its turns,
so the bound holds for whole episodes: batch j's loops start once the trainer has made j - max_staleness updates,
and every turn they request is sampled by that version or a newer one. Turns go on while the trainer trains
(the service's pump thread hands each finished turn back), so tools and generation overlap training too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Dict, List

from verl.agents.service_client import ServiceClient
from verl.agents.trajectory import Trajectory, trajectory_metrics
from verl.protocol import DataProto
from verl.trainer.agent_rollouts import AgentRollouts, agent_samples
from verl.trainer.async_rollouts import AsyncRollouts, Slot


class AsyncAgentRollouts(AsyncRollouts):
    def __init__(self, client: Any, agents: AgentRollouts, **settings: Any):
        super().__init__(client, **settings)
        self.agents = agents
        self.service = ServiceClient(client, eos_ids=self.eos_ids, temperature=self.temperature)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="agent-loops", daemon=True)
        self.thread.start()
        self.endpoint = agents.runner.endpoint()  # openai_agent: one endpoint for every trajectory of the run
        if self.endpoint is not None:
            self.endpoint.start(self.loop)
        self.running: Dict[str, concurrent.futures.Future] = {}  # request id of a row -> its loop's future
        self.samples: Dict[int, list] = {}  # slot index -> its AgentSamples (n per prompt, adjacent)
        self.resubmitted_turns = 0
        self.limit = asyncio.Semaphore(agents.runner.cfg.max_in_flight)  # trajectories running at once

    def _submit(self, slot: Slot, rows, attempt: int = 0) -> None:
        if slot.index not in self.samples:
            self.samples[slot.index] = agent_samples(slot.prompts, slot.n)
        samples, runner = self.samples[slot.index], self.agents.runner
        for row in rows:
            slot.attempt[row] = attempt
            rid = self.request_id(slot.index, row, attempt)
            self.owner[rid] = (slot, row)
            episode = runner.trajectory(samples[row], self.service, slot.temperature, self.endpoint, index=row)
            self.running[rid] = asyncio.run_coroutine_threadsafe(self._limited(episode), self.loop)

    async def _limited(self, episode: Any) -> Trajectory:
        async with self.limit:
            return await episode

    def _collect(self, poll_s: float) -> None:
        """Trajectories that ended into their slots; a loop's error (or a failed replica's) is raised here."""
        if not self.running:
            return
        concurrent.futures.wait(list(self.running.values()), poll_s, concurrent.futures.FIRST_COMPLETED)
        if self.service.error is not None:  # a replica failed and the run stops: its error, not the loops'
            raise self.service.error
        for rid in [rid for rid, f in self.running.items() if f.done()]:
            future = self.running.pop(rid)
            slot, row = self.owner.pop(rid, (None, None))
            if future.cancelled() or slot is None:
                continue
            trajectory = future.result()
            if slot.attempt.get(row) == int(rid.rsplit(":", 1)[1]):
                slot.done[row] = trajectory

    @staticmethod
    def oldest_version(result: Trajectory) -> int:
        return min(result.versions, default=-1)

    def _cancel(self, ids: List[str]) -> None:
        for rid in ids:  # (its turn in flight is aborted on its replica by the service client)
            future = self.running.pop(rid, None)
            if future is not None:
                future.cancel()

    def _keep_groups(self, slot: Slot, keep: List[int]) -> None:
        samples = self.samples[slot.index]
        self.samples[slot.index] = [samples[g * slot.n + k] for g in keep for k in range(slot.n)]

    def _assemble(self, slot: Slot) -> DataProto:
        trajectories = [slot.done[i] for i in range(len(slot.prompts) * slot.n)]
        samples = self.samples.pop(slot.index)
        batch = self.agents.batch(slot.prompts, slot.n, samples, trajectories)
        batch = batch.union(slot.prompts.select([], None).repeat(slot.n, interleave=True))  # text columns
        batch.meta_info["agent_metrics"] = trajectory_metrics(trajectories)
        return batch

    def take(self, version: int, poll_s: float = 0.05) -> tuple[DataProto, Dict[str, float]]:
        batch, metrics = super().take(version, poll_s)
        metrics["async/resubmitted"] = float(self.service.resubmitted - self.resubmitted_turns)  # turns, here
        self.resubmitted_turns = self.service.resubmitted
        return batch, metrics

    def close(self) -> None:
        for future in self.running.values():
            future.cancel()
        self.service.close()
        if self.endpoint is not None:
            self.endpoint.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
