"""Start the role workers a run's plan asks for: one worker group per role class, on the pool of its roles.

A rollout on a pool of its own (disaggregated) gets a group of `RolloutWorker`s and a transfer group joining the
actor's rank 0 with every rollout rank, over which `sync_weights` moves each update's weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from verl.config.plan import Plan, processes_per_pool
from verl.config.schema import VerlConfig
from verl.controller import make_worker_group, pools_from_plan
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker
from verl.workers.reward_model import PooledRewardModel, RewardModelWorker
from verl.workers.rollout import RolloutWorker
from verl.workers.weight_check import WeightSyncMismatch, compare, due


@dataclass
class Workers:
    actor_rollout: Any  # a worker group of ActorRolloutRefWorker
    critic: Optional[Any]  # a worker group of CriticWorker, when the run has a critic
    pools: List[Any] = field(default_factory=list)  # the run's resource pools, released at shutdown
    rollout: Optional[Any] = None  # a worker group of RolloutWorker, when the rollout has a pool of its own
    bucket_bytes: int = 256 << 20  # rollout.weight_sync_bucket_mb
    rollout_ranks: List[int] = field(default_factory=list)  # the rollout ranks alive, in the transfer group
    reward: Optional[Any] = None  # a worker group of RewardModelWorker, when a pool lists the reward role
    reward_model: Optional[PooledRewardModel] = None  # the driver's handle on it (what RewardManager scores with)
    rollout_tp: int = 1  # consecutive rollout ranks forming one engine
    verify_every: int = 1  # rollout.verify_weights_every
    syncs: int = 0  # weight syncs after an update so far (a colocated rollout's happen inside the actor's update)
    unchecked_noted: bool = False

    def join_weight_transfer(self, ranks: Optional[List[int]] = None) -> None:
        """(Re-)form the transfer group: the sending actor ranks (rank 0, or all of them) and the rollout `ranks`
        (default: all)."""
        self.rollout_ranks = list(range(self.rollout.world_size)) if ranks is None else list(ranks)
        endpoint = self.actor_rollout.call(ActorRolloutRefWorker.weight_transfer_endpoint)[0]
        host, port, senders = endpoint["host"], endpoint["port"], endpoint["senders"]
        world = senders + len(self.rollout_ranks)
        joins = [self.actor_rollout.submit(ActorRolloutRefWorker.join_weight_transfer, host, port, world, senders)]
        joins += [
            self.rollout.submit_to(r, RolloutWorker.join_weight_transfer, host, port, world, senders + i, senders)
            for i, r in enumerate(self.rollout_ranks)
        ]
        for pending in joins:
            pending.result()

    @property
    def groups(self) -> List[Any]:
        return [g for g in (self.actor_rollout, self.critic, self.rollout, self.reward) if g is not None]

    def sync_weights(self, version: int) -> Dict[str, float]:
        """Send the actor's weights (policy `version`) to the rollout's own pool and wait until it has loaded them
        (a rollout still generating a batch finishes it first: a worker runs its calls in order). Metrics: the bytes
        sent (all senders; perf/weight_sync_max_sender_bytes: the busiest one's), buckets and GB/s of rank 0's pass,
        the slowest receiver's seconds (timing/weight_sync_s), and the lowest version any rollout rank holds
        (rollout/weight_version)."""
        self.syncs += 1
        check = due(self.syncs, self.verify_every)
        sent = self.actor_rollout.submit(ActorRolloutRefWorker.send_weights, version, self.bucket_bytes)
        # the ranks in the transfer group: all, or those left after a replica failed (on_replica_failure=continue)
        calls = [self.rollout.submit_to(r, RolloutWorker.receive_weights, version, check) for r in self.rollout_ranks]
        receivers = [c.result() for c in calls]
        senders = sent.result()
        sent_bytes = [r["perf/weight_sync_bytes"] for r in senders]
        metrics = {
            **senders[0],
            "perf/weight_sync_bytes": float(sum(sent_bytes)),  # the whole model, whichever ranks sent it
            "perf/weight_sync_max_sender_bytes": float(max(sent_bytes)),
            "timing/weight_sync_s": max(r["timing/weight_sync_s"] for r in receivers),
            "rollout/weight_version": min(r["rollout/weight_version"] for r in receivers),
        }
        return {**metrics, **(self.check_weights(version) if check else {})}

    def synced_in_update(self, version: int) -> Dict[str, float]:
        """The actor's update (policy `version`) synced the colocated rollout: check it when due."""
        self.syncs += 1
        return self.check_weights(version) if due(self.syncs, self.verify_every) else {}

    def check_weights(self, version: int) -> Dict[str, float]:
        """Compare what each rollout rank was sent with what its engine holds (verl.workers.weight_check); a
        mismatch raises WeightSyncMismatch naming the parameters and ranks. Metrics: weight_sync/checked_params,
        weight_sync/unchecked_params, timing/weight_check_s (the slowest rank's fingerprinting, both sides)."""
        if self.rollout is not None:
            ranks = list(self.rollout_ranks)
            pending = [self.rollout.submit_to(r, RolloutWorker.take_weight_report) for r in ranks]
            reports = [p.result() for p in pending]
        else:
            reports = self.actor_rollout.call(ActorRolloutRefWorker.take_weight_report)
            ranks = list(range(len(reports)))
        if all(r is None for r in reports):  # nothing to check: a rollout generating on the actor's own module
            return {}
        missing = [rank for rank, r in zip(ranks, reports) if r is None]
        if missing:
            raise WeightSyncMismatch(f"rollout rank(s) {missing} did not check the weight sync of version {version}")
        verdict = compare(reports, self.rollout_tp, ranks=ranks)
        if verdict.problems:
            lines = "\n".join(f"  - {p}" for p in verdict.problems[:10])
            more = f"\n  ... and {len(verdict.problems) - 10} more" if len(verdict.problems) > 10 else ""
            raise WeightSyncMismatch(
                f"after step {version}'s weight sync (policy version {version}), the rollout does not hold what it "
                f"was sent:\n"
                f"{lines}{more}\nIt would generate with another policy than the one being trained. (The check: "
                "rollout.verify_weights_every; 0 turns it off.)"
            )
        if verdict.unchecked and not self.unchecked_noted:
            self.unchecked_noted = True
            print(
                f"verl: the weight sync check cannot read {len(verdict.unchecked)} of the rollout engine's parameters "
                f"back (held only in packed form, e.g. {verdict.unchecked[0]}); the other {verdict.checked} are "
                "checked",
                flush=True,
            )
        return {
            "weight_sync/checked_params": float(verdict.checked),
            "weight_sync/unchecked_params": float(len(verdict.unchecked)),
            "timing/weight_check_s": max(r.seconds for r in reports),
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


def start_workers(cfg: VerlConfig, plan: Plan, *, model_path: str, tokenizer_path: Optional[str] = None) -> Workers:
    """The actor/rollout/ref group on the actor's pool, the critic's and the reward model's groups on their own (or
    the same) pools."""
    mode = plan.controller
    pools = pools_from_plan(plan)
    env = {"OMP_NUM_THREADS": str(plan.threads)} if plan.threads else {}

    def group(worker_cls: type, pool_of: str, *args: Any, role: str) -> Any:
        pool = plan.pool(pool_of).name
        # groups sharing a pool (a colocated critic or reward model) each take an equal share of every device
        fraction = 1.0 / len(processes_per_pool(plan, pool))
        return make_worker_group(mode, pools[pool], worker_cls, *args, role=role, env=env, resource_fraction=fraction)

    apart = plan.rollout_apart
    roles = [r for r in ("actor", "rollout", "ref") if plan.has(r) and not (apart and r == "rollout")]
    actor_rollout = group(
        ActorRolloutRefWorker, "actor", cfg, plan, model_path, tokenizer_path, roles, role="actor_rollout"
    )
    critic = group(CriticWorker, "critic", cfg, plan, model_path, role="critic") if plan.has("critic") else None
    rollout = group(RolloutWorker, "rollout", cfg, plan, model_path, tokenizer_path, role="rollout") if apart else None
    # Each pool's workers initialise at once (the models load side by side).
    reward = group(RewardModelWorker, "reward", cfg, plan, role="reward") if plan.has("reward") else None
    started = [
        g.submit(cls.init_model)
        for g, cls in ((actor_rollout, ActorRolloutRefWorker), (rollout, RolloutWorker), (reward, RewardModelWorker))
        if g is not None
    ]
    reward_model = PooledRewardModel(reward, started[-1].result()[0]) if reward is not None else None
    for pending in started:
        pending.result()
    actor_rollout.refresh_dispatch_info(*([] if apart else ["rollout"]))  # the layouts, read now
    if critic is not None:
        critic.call(CriticWorker.init_model)
        critic.refresh_dispatch_info()
    workers = Workers(actor_rollout, critic, list(pools.values()), rollout, cfg.rollout.weight_sync_bucket_mb << 20)
    workers.rollout_tp = plan.layout("rollout").tp if plan.has("rollout") else 1
    workers.verify_every = cfg.rollout.verify_weights_every
    if rollout is not None:
        rollout.refresh_dispatch_info("rollout")
        workers.join_weight_transfer()
    workers.reward, workers.reward_model = reward, reward_model
    return workers
