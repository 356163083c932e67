"""Start the role workers a run's placement asks for: one worker group per role class, per pool."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, List, Optional

from verl.controller import make_worker_group, pools_from_plan
from verl.placement import make_plan
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker

ACTOR_SIDE = ("actor", "rollout", "ref")


@dataclass
class Workers:
    actor_rollout: Any  # a worker group of ActorRolloutRefWorker
    critic: Optional[Any]  # a worker group of CriticWorker, when the run has a critic
    pools: List[Any] = field(default_factory=list)  # the run's resource pools, released at shutdown

    def shutdown(self) -> None:
        """Stop the workers, then release their pools' reservations (another run in this Ray session needs them)."""
        for group in (self.actor_rollout, self.critic):
            if group is not None:
                group.shutdown()
        for pool in self.pools:
            pool.remove()
        self.pools = []


def _threads_per_worker(plan: Any, groups_per_pool: int) -> str:
    """CPU runs share the host's cores between the processes placed on it."""
    local_workers = plan.devices_per_node * groups_per_pool
    return str(max(1, (os.cpu_count() or 1) // local_workers))


def start_workers(cfg: Any, *, model_path: str, total_steps: int) -> Workers:
    plan, problems = make_plan(cfg)
    if plan is None:
        raise ValueError("placement does not fit: " + "; ".join(str(p) for p in problems))
    mode = cfg.trainer.controller
    pools = pools_from_plan(plan)
    by_role = {role: p for p in plan.pools for role in p.roles}
    if not all(r in by_role for r in ("actor", "rollout")):
        raise ValueError("placement.pools must place the actor and the rollout")
    if by_role["actor"] is not by_role["rollout"] or ("ref" in by_role and by_role["ref"] is not by_role["actor"]):
        raise ValueError(
            "the actor, rollout and ref must share one pool (the hybrid engine) in this version: "
            "list them in the same placement.pools entry"
        )
    actor_pool = by_role["actor"]
    shared = "critic" in by_role and by_role["critic"] is actor_pool
    fraction = 0.5 if shared else 1.0
    env = {}
    if plan.device == "cpu":
        env["OMP_NUM_THREADS"] = _threads_per_worker(plan, 2 if shared else 1)
    roles = [r for r in ACTOR_SIDE if r in actor_pool.roles]
    resource_pool = pools[actor_pool.name]
    actor_rollout = make_worker_group(
        mode,
        resource_pool,
        ActorRolloutRefWorker,
        cfg,
        roles,
        model_path,
        total_steps,
        role="actor_rollout",
        env=env,
        resource_fraction=fraction,
    )
    critic = None
    if "critic" in by_role:
        critic_pool = resource_pool if shared else pools[by_role["critic"].name]
        critic = make_worker_group(
            mode,
            critic_pool,
            CriticWorker,
            cfg,
            model_path,
            total_steps,
            role="critic",
            env=env,
            resource_fraction=fraction,
        )
    actor_rollout.init_model()
    if critic is not None:
        critic.init_model()
    return Workers(actor_rollout, critic, list(pools.values()))
