"""Start the role workers a run's plan asks for: one worker group per role class, on the pool of its roles.

A rollout on a pool of its own (disaggregated) gets a group of `RolloutWorker`s and a transfer group joining the
actor's rank 0 with every rollout rank, over which `sync_weights` moves each update's weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from verl.config.plan import Plan
from verl.controller import make_worker_group, pools_from_plan
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker
from verl.workers.rollout import RolloutWorker


@dataclass
class Workers:
    actor_rollout: Any  # a worker group of ActorRolloutRefWorker
    critic: Optional[Any]  # a worker group of CriticWorker, when the run has a critic
    pools: List[Any] = field(default_factory=list)  # the run's resource pools, released at shutdown
    rollout: Optional[Any] = None  # a worker group of RolloutWorker, when the rollout has a pool of its own
    bucket_bytes: int = 256 << 20  # rollout.weight_sync_bucket_mb
    rollout_ranks: List[int] = field(default_factory=list)  # the rollout ranks alive, in the transfer group

    def join_weight_transfer(self, ranks: Optional[List[int]] = None) -> None:
        """(Re-)form the transfer group: the actor's rank 0 and the rollout `ranks` (default: all)."""
        self.rollout_ranks = list(range(self.rollout.world_size)) if ranks is None else list(ranks)
        endpoint = self.actor_rollout.call(ActorRolloutRefWorker.weight_transfer_endpoint)[0]
        host, port, world = endpoint["host"], endpoint["port"], 1 + len(self.rollout_ranks)
        joins = [self.actor_rollout.submit(ActorRolloutRefWorker.join_weight_transfer, host, port, world)]
        joins += [
            self.rollout.submit_to(r, RolloutWorker.join_weight_transfer, host, port, world, 1 + i)
            for i, r in enumerate(self.rollout_ranks)
        ]
        for pending in joins:
            pending.result()

    @property
    def groups(self) -> List[Any]:
        return [g for g in (self.actor_rollout, self.critic, self.rollout) if g is not None]

    def sync_weights(self, version: int) -> Dict[str, float]:
        """Send the actor's weights (policy `version`) to the rollout's own pool and wait until it has loaded them
        (a rollout still generating a batch finishes it first: a worker runs its calls in order). Metrics: the bytes,
        buckets and GB/s of the sender's pass, the slowest receiver's seconds (timing/weight_sync_s), and the
        lowest version any rollout rank holds (rollout/weight_version)."""
        sent = self.actor_rollout.submit(ActorRolloutRefWorker.send_weights, version, self.bucket_bytes)
        # the ranks in the transfer group: all, or those left after a replica failed (on_replica_failure=continue)
        calls = [self.rollout.submit_to(r, RolloutWorker.receive_weights, version) for r in self.rollout_ranks]
        receivers = [c.result() for c in calls]
        sender = sent.result()[0]
        return {
            **sender,
            "timing/weight_sync_s": max(r["timing/weight_sync_s"] for r in receivers),
            "rollout/weight_version": min(r["rollout/weight_version"] for r in receivers),
        }

    def take_stats(self) -> Dict[str, float]:
        """Round trips to the workers and bytes shipped each way since the last take, over every group:
        perf/worker_calls, perf/worker_bytes_sent, perf/worker_bytes_received."""
        stats = [g.take_stats() for g in self.groups]
        return {
            "perf/worker_calls": float(sum(s.calls for s in stats)),
            "perf/worker_bytes_sent": float(sum(s.bytes_sent for s in stats)),
            "perf/worker_bytes_received": float(sum(s.bytes_received for s in stats)),
        }

    def shutdown(self) -> None:
        """Stop the workers, then release their pools' reservations (another run in this Ray session needs them)."""
        for group in self.groups:
            group.shutdown()
        for pool in self.pools:
            pool.remove()
        self.pools = []


def start_workers(cfg: Any, plan: Plan, *, model_path: str, tokenizer_path: Optional[str] = None) -> Workers:
    """The actor/rollout/ref group on the actor's pool and the critic's group on its own (or the same) pool."""
    mode = plan.controller
    pools = pools_from_plan(plan)
    shared = plan.colocated("critic", "actor")
    fraction = 0.5 if shared else 1.0
    env = {"OMP_NUM_THREADS": str(plan.threads)} if plan.threads else {}

    def group(worker_cls: type, pool_of: str, *args: Any, role: str) -> Any:
        pool = pools[plan.pool(pool_of).name]
        return make_worker_group(
            mode, pool, worker_cls, cfg, plan, model_path, *args, role=role, env=env, resource_fraction=fraction
        )

    apart = plan.rollout_apart
    roles = [r for r in ("actor", "rollout", "ref") if plan.has(r) and not (apart and r == "rollout")]
    actor_rollout = group(ActorRolloutRefWorker, "actor", tokenizer_path, roles, role="actor_rollout")
    critic = group(CriticWorker, "critic", role="critic") if plan.has("critic") else None
    rollout = group(RolloutWorker, "rollout", tokenizer_path, role="rollout") if apart else None
    # Each pool's workers initialise at once (the models load side by side).
    started = [
        g.submit(cls.init_model)
        for g, cls in ((actor_rollout, ActorRolloutRefWorker), (rollout, RolloutWorker))
        if g is not None
    ]
    for pending in started:
        pending.result()
    actor_rollout.refresh_dispatch_info(*([] if apart else ["rollout"]))  # the layouts, read now
    if critic is not None:
        critic.call(CriticWorker.init_model)
        critic.refresh_dispatch_info()
    workers = Workers(actor_rollout, critic, list(pools.values()), rollout, cfg.rollout.weight_sync_bucket_mb << 20)
    if rollout is not None:
        rollout.refresh_dispatch_info("rollout")
        workers.join_weight_transfer()
    return workers
