"""The async scheduler's staleness bound, as a property over random timings: replicas that take random numbers of
turns per request and trainers that take random times per step. Whatever the timings, every sample trains on a
policy at most max_staleness updates newer than the oldest that sampled it, each step trains on its own batch of
prompts (in order, none skipped or repeated), and a checkpoint's data position is before the oldest batch in flight.

The service here is a simulation (the real one, RolloutServer over the hf engine, is tested in
tests/rollout/test_rollout_server.py and through the trainer in tests/e2e/test_async.py): what is under test is
the admission rule and the bookkeeping, which only see request ids, tokens and versions."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.async_rollouts import AsyncRollouts
from verl.workers.rollout_server import Finished

N, PROMPTS, WIDTH = 2, 3, 6


class SimulatedService:
    """Requests advance one token per tick on a replica; a request needs a random number of ticks."""

    def __init__(self, rng: random.Random):
        self.rng, self.version, self.live, self.finished = rng, 0, {}, []
        self.replicas, self.dead = [0], []

    def take_lost(self):
        return []

    def submit(self, requests, groups=None):
        for r in requests:
            self.live[r["id"]] = {
                "prompt": r["prompt"],
                "left": self.rng.randint(1, WIDTH),
                "tokens": [],
                "versions": [],
            }

    def tick(self):
        for rid in list(self.live):
            r = self.live[rid]
            r["tokens"].append(5)
            r["versions"].append(self.version)
            r["left"] -= 1
            if r["left"] == 0:
                del self.live[rid]
                self.finished.append(Finished(rid, r["tokens"], [-1.0] * len(r["tokens"]), r["versions"], 0.0))

    def poll(self, timeout_s=0.0):
        self.tick()
        out, self.finished = self.finished, []
        return out

    def abort(self, ids):
        return sum(self.live.pop(i, None) is not None for i in ids)


class Loader:
    """Prompt batches numbered by position: prompt token ids carry the batch and row they came from."""

    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def next_batch(self) -> DataProto:
        ids = torch.tensor([[7, 100 + self.position, 200 + i] for i in range(PROMPTS)])
        self.position += 1
        mask = torch.ones_like(ids)
        return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1})


def _rollouts(service: SimulatedService, loader: Loader, max_staleness: int, steps: int, **kw) -> AsyncRollouts:
    return AsyncRollouts(
        service,
        read_prompts=loader.next_batch,
        data_position=loader.state_dict,
        n=N,
        temperature=1.0,
        response_length=WIDTH,
        eos_ids=[2],
        pad_id=0,
        max_staleness=max_staleness,
        total_steps=steps,
        **kw,
    )


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("max_staleness", [0, 1, 2, 4])
def test_staleness_never_exceeds_the_bound(seed, max_staleness):
    rng = random.Random(seed)
    service, loader, steps = SimulatedService(rng), Loader(), 8
    rollouts = _rollouts(service, loader, max_staleness, steps)
    for step in range(steps):
        batch, metrics = rollouts.take(step, poll_s=0.0)
        # every sample of this step's batch: this step's prompts, each prompt's n samples
        assert batch.batch["input_ids"][:, 1].tolist() == [100 + step] * (PROMPTS * N)
        assert batch.batch["input_ids"][:, 2].tolist() == [200 + i // N for i in range(PROMPTS * N)]
        staleness = step - batch.batch["weight_version"]
        assert int(staleness.max()) <= max_staleness and int(staleness.min()) >= 0
        assert metrics["async/regenerated"] == 0  # the admission rule keeps every sample inside the bound
        assert metrics["async/queue_batches"] <= max_staleness
        # a checkpoint now: its data position is before the oldest batch still in flight (or here, when none)
        in_flight = rollouts.slots
        assert rollouts.data_position() == {"position": in_flight[0].index if in_flight else loader.position}
        assert rollouts.in_flight_samples() == len(in_flight) * PROMPTS * N
        for _ in range(rng.randint(0, 5)):  # the update takes a while, the replicas keep generating
            service.tick()
        service.version = step + 1  # the new weights reach the replicas
    assert loader.position == steps  # no batch read past the run's end


def test_a_sample_over_the_bound_has_its_group_generated_again():
    """Staleness is checked where samples are collected: a sample of an older policy than the bound allows (a
    replica that kept old weights) is regenerated with its group, and counted."""
    service, loader = SimulatedService(random.Random(0)), Loader()
    rollouts = _rollouts(service, loader, max_staleness=1, steps=4)
    rollouts.fill(0)
    service.version = -5  # a replica that missed updates: what it samples now is 5+ versions behind
    service.tick()
    service.version = 0
    batch, metrics = rollouts.take(0, poll_s=0.0)
    assert metrics["async/regenerated"] >= N  # at least one whole group
    assert int((0 - batch.batch["weight_version"]).max()) <= 1


@pytest.mark.parametrize("row_multiple, kept", [(1, [1, 2]), (4, [1, 2]), (6, None)], ids=["dp1", "dp4", "dp6"])
def test_on_stale_drop_leaves_the_stale_group_out(row_multiple, kept):
    """trainer.on_stale=drop: a group with a sample over the bound is left out of the step, counted; the batch
    keeps whole data-parallel shares of the other groups (2 groups of N=2 fill 4 ranks, not 6: an error that
    names the fix)."""
    service, loader = SimulatedService(random.Random(0)), Loader()
    rollouts = _rollouts(service, loader, 1, 4, on_stale="drop", row_multiple=row_multiple)
    rollouts.fill(0)
    for k in range(N):  # group 0's samples begin with a token of a policy 5 versions old (a lagging replica)
        request = service.live[AsyncRollouts.request_id(0, k)]
        request["tokens"].append(5)
        request["versions"].append(-5)
    if kept is None:
        with pytest.raises(RuntimeError, match="on_stale=drop left none to train on"):
            rollouts.take(0, poll_s=0.0)
        return
    batch, metrics = rollouts.take(0, poll_s=0.0)
    assert batch.batch["input_ids"][:, 2].tolist() == [200 + g for g in kept for _ in range(N)]
    assert metrics["async/dropped"] == N and metrics["async/regenerated"] == 0
    assert int((0 - batch.batch["weight_version"]).max()) <= 1


def test_the_pool_rate_is_reported_on_a_step_whose_batch_was_ready_before():
    """perf/rollout_tokens_per_s on every step: a pool that generated nothing since the last take (its batch was
    finished before) reports the rate it last had, not a gap in the metric."""
    from verl.trainer.rollout_source import ServiceRollouts

    class Client:
        replicas, dead = [0, 1], []
        counters = [{"tokens": 600, "busy_s": 2.0, "interrupted": 1}, {}, {"tokens": 100, "busy_s": 1.0}]

        def take_counters(self):
            return self.counters.pop(0)

    class Scheduler:
        def take(self, step):
            return DataProto.from_dict({"input_ids": torch.ones(2, 3, dtype=torch.long)}), {}

    class Workers:
        rollout_tp, rollout_ranks = 1, [0, 1]

    source = object.__new__(ServiceRollouts)  # (the parts next_batch reads; the service itself is not under test)
    source.client, source.scheduler, source.workers, source.gen_s, source.tokens_per_s = (
        Client(),
        Scheduler(),
        Workers(),
        0.0,
        None,
    )
    rates = [source.next_batch(step)[1]["perf/rollout_tokens_per_s"] for step in range(3)]
    assert rates == [600.0, 600.0, 200.0]  # tokens / busy seconds x replicas (each replica's busy time is summed)


def test_image_prompts_send_their_pixels_with_each_request():
    """A vision-language run's prompt rows carry their pixels (multi_modal_inputs): each sample's request takes its
    prompt's, a text row's none; the assembled batch keeps the column for the trainer's passes."""

    class Recording(SimulatedService):
        def submit(self, requests, groups=None):
            self.requests = list(requests)
            super().submit(requests, groups)

    class ImageLoader(Loader):
        def next_batch(self) -> DataProto:
            batch = super().next_batch()
            column = np.empty(PROMPTS, dtype=object)
            column[:] = [{"pixel_values": torch.full((4, 3), float(i))} if i != 1 else {} for i in range(PROMPTS)]
            batch.non_tensor_batch["multi_modal_inputs"] = column
            return batch

    service = Recording(random.Random(0))
    rollouts = _rollouts(service, ImageLoader(), 0, 1)
    rollouts.fill(0)
    sent = [r.get("images") for r in service.requests]
    assert [None if s is None else float(s["pixel_values"][0, 0]) for s in sent] == [0.0, 0.0, None, None, 2.0, 2.0]
    batch, _ = rollouts.take(0, poll_s=0.0)
    assert [bool(m) for m in batch.non_tensor_batch["multi_modal_inputs"]] == [True, True, False, False, True, True]
