"""Start the role workers a run's plan asks for: one worker group per role class, on the pool of its roles."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from verl.config.plan import Plan
from verl.controller import make_worker_group, pools_from_plan
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker


@dataclass
class Workers:
    actor_rollout: Any  # a worker group of ActorRolloutRefWorker
    critic: Optional[Any]  # a worker group of CriticWorker, when the run has a critic
    pools: List[Any] = field(default_factory=list)  # the run's resource pools, released at shutdown

    @property
    def groups(self) -> List[Any]:
        return [g for g in (self.actor_rollout, self.critic) if g is not None]

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

    actor_rollout = group(ActorRolloutRefWorker, "actor", tokenizer_path, role="actor_rollout")
    critic = group(CriticWorker, "critic", role="critic") if plan.has("critic") else None
    actor_rollout.call(ActorRolloutRefWorker.init_model)
    actor_rollout.refresh_dispatch_info("rollout")  # the layouts, read now rather than in the first step
    if critic is not None:
        critic.call(CriticWorker.init_model)
        critic.refresh_dispatch_info()
    return Workers(actor_rollout, critic, list(pools.values()))
