"""The run's plan: every value the run derives from its config, resolved once.

`build_plan(cfg)` turns a validated config into a `Plan`: each enabled role after inheritance (a ref without
its own settings runs the actor's), the pools, the batch arithmetic, the lengths and the log-prob temperature.
The trainer, the workers and the engines read the plan; none of them re-derives these numbers. `draft_plan`
plans whatever resolves when parts of the config are wrong (validation reads it to report every problem).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence, Tuple

from omegaconf import DictConfig

from verl.config.errors import ConfigError, ConfigProblem, errors
from verl.config.placement import (
    Coords,
    Layout,
    Pool,
    TrainerKind,
    as_config,
    assign_roles,
    enabled_roles,
    resolve_layouts,
    resolve_pools,
    trainer_kind,
    value,
)
from verl.config.schema import PREFERENCE_ALGORITHMS


def _split(total: Optional[int], parts: Optional[int]) -> Optional[int]:
    """total / parts when both are known and it divides evenly, else None."""
    return total // parts if total is not None and parts is not None and total % parts == 0 else None


@dataclass(frozen=True)
class TrainBatch:
    """One optimizer mini-batch of a training role (actor or critic), split over its DP ranks."""

    role: str
    prompts: int  # data.train_batch_size
    mini_prompts: int
    n: int
    dp: Optional[int]  # None when the role's layout did not resolve (the prompt arithmetic still holds)
    micro: int  # samples per forward/backward on one device
    epochs: int
    max_tokens: Optional[int] = None  # micro-batches cut by this many tokens instead of `micro` rows

    @property
    def mini_samples(self) -> int:
        return self.mini_prompts * self.n

    @property
    def mini_batches(self) -> Optional[int]:
        return _split(self.prompts, self.mini_prompts)

    @property
    def per_rank(self) -> Optional[int]:
        """Samples of one mini-batch on one DP rank; None when they do not split evenly (or dp is unknown)."""
        return _split(self.mini_samples, self.dp)

    @property
    def optimizer_steps_per_step(self) -> Optional[int]:
        """Optimizer steps this role takes per training step: mini-batches x epochs."""
        return self.mini_batches * self.epochs if self.mini_batches is not None else None

    @property
    def micro_batches(self) -> Optional[int]:
        """Gradient-accumulation steps per mini-batch on one rank; None when uneven (or cut by tokens)."""
        return None if self.max_tokens else _split(self.per_rank, self.micro)


@dataclass(frozen=True)
class BatchPlan:
    prompts: int  # data.train_batch_size
    n: int  # rollout.n
    rollout_dp: Optional[int]
    train: Tuple[TrainBatch, ...]

    @property
    def samples(self) -> int:
        return self.prompts * self.n

    @property
    def prompts_per_replica(self) -> Optional[int]:
        """Prompts one rollout DP replica generates for; None when they do not split evenly."""
        return _split(self.prompts, self.rollout_dp)

    def per_rank(self, dp: int) -> Optional[int]:
        """Samples of a pass over the whole step on one of `dp` ranks; None when they do not split evenly."""
        return _split(self.samples, dp)

    def train_of(self, role: str) -> Optional[TrainBatch]:
        return next((t for t in self.train if t.role == role), None)


@dataclass(frozen=True)
class RolePlan:
    """One enabled role, resolved: what its workers and engines are built from."""

    name: str
    backend: str
    layout: Layout
    micro_batch: Optional[int]  # samples per forward pass on one device (log-probs, values); None: rollout
    train: Optional[TrainBatch] = None  # actor and critic: their optimizer mini-batches
    model_path: Optional[str] = None  # critic.model_path; None: the run's model (model.path, after warm start)
    max_tokens: Optional[int] = None  # the log-prob / value pass cut by this many tokens instead of micro_batch rows

    @property
    def optimizer_steps_per_step(self) -> int:
        if self.train is None or self.train.optimizer_steps_per_step is None:
            raise ValueError(f"role '{self.name}' takes no optimizer steps")
        return self.train.optimizer_steps_per_step

    @property
    def rows_per_rank(self) -> int:
        """Samples of one optimizer mini-batch on one data-parallel rank."""
        if self.train is None or self.train.per_rank is None:
            raise ValueError(f"role '{self.name}' has no mini-batch that splits over its ranks")
        return self.train.per_rank


@dataclass(frozen=True)
class Plan:
    nnodes: int
    devices_per_node: int
    device: str
    pools: Tuple[Pool, ...]
    role_plans: Tuple[RolePlan, ...]  # one per enabled role, in ROLES order
    batch: Optional[BatchPlan]  # None only in a draft whose batch sizes are unset
    prompt_length: int  # data.max_prompt_length
    response_length: int  # rollout.max_new_tokens, else data.max_response_length
    temperature: float  # what log-probs are computed at: rollout.temperature (greedy, 0, counts as 1)
    total_steps: Optional[int] = None  # training steps of the run; None until the data is known
    # Where the actor's old log-probs come from: "recompute" (a forward pass before the update) or "update" (the
    # update's own forward, detached: equal to the old policy's when the update is on-policy)
    old_log_probs: str = "recompute"
    old_log_probs_why: str = ""  # why they need a pass of their own (validate shows it)
    # Roles whose forward passes pack their rows: each prompt's samples as one sequence, the prompt once, and no
    # padding (model.shared_prefix)
    shared_prefix: Tuple[str, ...] = ()
    # LoRA actor: the reference is the actor's engine with its adapters off, not a model of its own
    ref_from_actor: bool = False
    # LoRA actor with a rollout: what reaches the rollout after each update, "merged" (the base with the adapters
    # merged in) or "adapter" (the adapters alone, loaded by an engine with LoRA support: vllm); None otherwise
    lora_sync: Optional[str] = None
    # trainer.balance_ranks: each step's prompt groups are placed on this many data-parallel ranks (the actor's)
    # by token count; 1: the batch keeps the order it was generated in
    balance_dp: int = 1
    balance_cost: Literal["tokens", "attention"] = "tokens"  # what it evens out (trainer.balance_cost)
    # trainer.mode: sync (generate, then train) or one_step_off (the next batch generated while the actor trains)
    mode: str = "sync"
    max_staleness: int = 1  # trainer.mode=async: the bound on a sample's policy lag (trainer.max_staleness)
    # actor.routing_replay: r2 records the experts in the old-log-prob pass, r3 in the rollout; later actor passes
    # replay them
    routing_replay: str = "none"
    # rollout.agent.loop: the agent loop that makes each sample's trajectory (None: one completion per sample)
    agent_loop: Optional[str] = None
    agent_max_turns: int = 1
    # what trains: "ppo" (PPOTrainer: ppo, grpo and every advantage estimator), "dpo" or "online_dpo"
    # (DPOTrainer), "sft" (SFTTrainer); from algorithm.name (verl.trainer.registry maps it to the class)
    trainer: TrainerKind = "ppo"
    controller: str = "ray"  # what runs the workers: trainer.controller, with auto resolved (_controller)
    controller_why: str = ""
    threads: Optional[int] = None  # CPU: torch threads of each worker process (None on GPUs)
    threads_from: str = ""  # where that number comes from (validate shows it)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.devices_per_node

    @property
    def roles(self) -> Tuple[str, ...]:
        return tuple(r.name for r in self.role_plans)

    @property
    def layouts(self) -> Tuple[Layout, ...]:
        return tuple(r.layout for r in self.role_plans)

    @property
    def log_prob_passes(self) -> Tuple[RolePlan, ...]:
        """The roles with a forward pass over every sample of a step (old/ref log-probs, values)."""
        return tuple(
            r
            for r in self.role_plans
            if isinstance(r.micro_batch, int)
            and r.micro_batch >= 1
            and not (r.name == "actor" and self.old_log_probs == "update")
        )

    def role(self, name: str) -> RolePlan:
        for r in self.role_plans:
            if r.name == name:
                return r
        raise KeyError(f"role '{name}' is not in this plan (roles: {', '.join(self.roles)})")

    def has(self, name: str) -> bool:
        return name in self.roles

    def layout(self, role: str) -> Layout:
        return self.role(role).layout

    def pool(self, role: str) -> Pool:
        name = self.layout(role).pool
        return next(p for p in self.pools if p.name == name)

    def colocated(self, a: str, b: str) -> bool:
        return self.has(a) and self.has(b) and self.pool(a) == self.pool(b)

    @property
    def rollout_apart(self) -> bool:
        """The rollout has a pool of its own (disaggregated): its weights arrive over a transfer group."""
        return self.has("rollout") and self.has("actor") and not self.colocated("rollout", "actor")

    def optimizer_steps(self, role: str) -> int:
        """Optimizer steps `role` takes over the whole run: what its LR schedule spans."""
        if self.total_steps is None:
            raise ValueError("the plan does not know the run's length yet: build it with total_steps")
        return max(1, self.total_steps * self.role(role).optimizer_steps_per_step)

    @property
    def train_dp(self) -> int:
        """What a training batch's rows must be a multiple of: the actor's and the critic's calls split it over
        their DP ranks (the reference runs on the actor's slice)."""
        return math.lcm(*[self.layout(r).dp for r in ("actor", "critic") if self.has(r)])

    def with_total_steps(self, total_steps: int) -> "Plan":
        return dataclasses.replace(self, total_steps=total_steps)

    def location(self, rank: int) -> Tuple[int, int]:
        """(node, device on that node) of a global rank."""
        return divmod(rank, self.devices_per_node)

    def coords(self, rank: int) -> Tuple[Coords, ...]:
        """Every role's coordinates on a global rank (colocated roles share it)."""
        return tuple(
            layout.coords(rank - layout.first_rank)
            for layout in self.layouts
            if layout.first_rank <= rank < layout.first_rank + layout.world
        )

    def role_coords(self, rank: int, role: str) -> Optional[Coords]:
        return next((c for c in self.coords(rank) if c.role == role), None)

    def rollout_groups_per_actor_group(self) -> Optional[int]:
        """HybridFlow's micro-DP: rollout replicas inside one actor TP*PP group, when colocated with megatron."""
        if not self.colocated("rollout", "actor"):
            return None
        actor, rollout = self.layout("actor"), self.layout("rollout")
        if actor.backend != "megatron" or (actor.tp * actor.pp) % rollout.tp:
            return None
        return actor.tp * actor.pp // rollout.tp


@dataclass(frozen=True)
class Draft:
    """Whatever could be placed, even when other parts of the placement are wrong (validation reads it)."""

    roles: Tuple[str, ...]  # enabled roles
    role_pool: Tuple[Tuple[str, str], ...]  # (role, pool name) for each enabled role found in a pool
    plan: Plan  # of the pools whose device range resolved and the roles whose layout fits their pool
    problems: Tuple[ConfigProblem, ...]


MICRO_BATCH_KEYS = {
    "actor": "actor.log_prob_micro_batch_size_per_device",
    "ref": "ref.log_prob_micro_batch_size_per_device",
    "critic": "critic.ppo_micro_batch_size_per_device",  # the critic's value pass
}
# Token budgets that cut micro-batches instead (None: the row counts above): the passes', and the updates'.
PASS_TOKEN_KEYS = {
    "actor": "actor.log_prob_max_tokens_per_device",
    "ref": "ref.log_prob_max_tokens_per_device",
    "critic": "critic.ppo_max_tokens_per_device",
}
TRAIN_TOKEN_KEYS = {"actor": "actor.ppo_max_tokens_per_device", "critic": "critic.ppo_max_tokens_per_device"}


def _positive(cfg: DictConfig, key: str, default_key: Optional[str] = None) -> Optional[int]:
    v = value(cfg, key)
    if v is None and default_key is not None:
        v = value(cfg, default_key)
    return v if isinstance(v, int) and v >= 1 else None


def batch_plan(cfg: DictConfig, roles: Sequence[str], layouts: Sequence[Layout]) -> Optional[BatchPlan]:
    """The step's batch arithmetic of the enabled `roles` over the given layouts; None when the batch sizes are
    unset or not positive. Entries whose numbers are unset or not positive are left out (validation reports them).
    """
    prompts, n = _positive(cfg, "data.train_batch_size"), _positive(cfg, "rollout.n")
    if prompts is None or n is None:
        return None
    pairs = preference(cfg)
    if pairs == "dpo":  # offline: each prompt's two rows are its chosen and rejected responses (rollout.n unused)
        n = 2
    elif trainer_kind(cfg) == "sft":  # one row per example
        n = 1
    dps = {layout.role: layout.dp for layout in layouts}
    train = []
    for role in ("actor", "critic"):
        mini = _positive(cfg, f"{role}.ppo_mini_batch_size", "actor.ppo_mini_batch_size")
        micro = _positive(cfg, f"{role}.ppo_micro_batch_size_per_device")
        epochs = _positive(cfg, f"{role}.ppo_epochs", "actor.ppo_epochs")
        if role in roles and None not in (mini, micro, epochs):
            tokens = _positive(cfg, TRAIN_TOKEN_KEYS[role])
            rows = 2 if pairs else n  # preference updates train on one (chosen, rejected) pair per prompt
            train.append(TrainBatch(role, prompts, mini, rows, dps.get(role), micro, epochs, tokens))
    return BatchPlan(prompts, n, dps.get("rollout"), tuple(train))


def preference(cfg: DictConfig) -> Optional[str]:
    """algorithm.name when it is a preference algorithm (dpo, online_dpo), else None."""
    kind = trainer_kind(cfg)
    return kind if kind in PREFERENCE_ALGORITHMS else None


def _role_plan(cfg: DictConfig, layout: Layout, batch: Optional[BatchPlan]) -> RolePlan:
    role = layout.role
    micro = value(cfg, MICRO_BATCH_KEYS[role]) if role in MICRO_BATCH_KEYS else None
    train = batch.train_of(role) if batch is not None else None
    model_path = value(cfg, "critic.model_path") if role == "critic" else None
    tokens = _positive(cfg, PASS_TOKEN_KEYS[role]) if role in PASS_TOKEN_KEYS else None
    return RolePlan(role, layout.backend, layout, micro, train, model_path, tokens)


def draft_plan(cfg: Any, total_steps: Optional[int] = None) -> Draft:
    """Place what can be placed and collect the placement problems (every one, not just the first).

    total_steps: the run's training steps when the caller knows them (else trainer.total_steps)."""
    cfg = as_config(cfg)
    roles = enabled_roles(cfg)
    role_pool, found = assign_roles(cfg, roles)
    pools, problems = resolve_pools(cfg, role_pool)
    layouts, layout_problems = resolve_layouts(cfg, role_pool, pools)
    batch = batch_plan(cfg, roles, layouts)
    temperature = value(cfg, "rollout.temperature")
    why = on_policy_problem(cfg, batch)
    plan = Plan(
        nnodes=value(cfg, "placement.nnodes"),
        devices_per_node=value(cfg, "placement.devices_per_node"),
        device=str(value(cfg, "placement.device")),
        pools=pools,
        role_plans=tuple(_role_plan(cfg, layout, batch) for layout in layouts),
        batch=batch,
        prompt_length=value(cfg, "data.max_prompt_length"),
        response_length=value(cfg, "rollout.max_new_tokens") or value(cfg, "data.max_response_length"),
        # (DPO compares the policy itself with the reference: its log-probs at temperature 1)
        temperature=float(temperature) if temperature and not preference(cfg) else 1.0,
        total_steps=total_steps if total_steps is not None else value(cfg, "trainer.total_steps"),
        old_log_probs="recompute" if why else "update",
        old_log_probs_why=why or "",
        shared_prefix=_shared_prefix_roles(cfg, layouts),
        ref_from_actor="ref" in roles and lora_rank(cfg, "actor") >= 1,
        lora_sync=value(cfg, "rollout.lora_sync") if "rollout" in roles and lora_rank(cfg, "actor") >= 1 else None,
        balance_dp=_balance_dp(cfg, layouts),
        balance_cost="attention" if value(cfg, "trainer.balance_cost") == "attention" else "tokens",
        mode=str(value(cfg, "trainer.mode") or "sync"),
        max_staleness=int(value(cfg, "trainer.max_staleness") or 0),
        routing_replay=str(value(cfg, "actor.routing_replay") or "none"),
        agent_loop=_agent_loop(value(cfg, "rollout.agent.loop")),
        agent_max_turns=int(value(cfg, "rollout.agent.max_turns") or 1),
        trainer=trainer_kind(cfg),
    )
    plan = dataclasses.replace(plan, **_controller(cfg, plan))
    plan = dataclasses.replace(plan, **_threads(cfg, plan))
    return Draft(roles, role_pool, plan, tuple(problems + found + layout_problems))


def _agent_loop(loop: Any) -> Optional[str]:
    """The agent loop's name, or its _target_."""
    if loop is None or isinstance(loop, str):
        return loop
    return str(loop.get("_target_", loop)) if hasattr(loop, "get") else str(loop)


def _controller(cfg: DictConfig, plan: Plan) -> dict:
    """trainer.controller: auto runs a one-device run's workers in this process (no Ray start-up, no copies of
    each batch between processes), anything larger, or a run given a Ray cluster (RAY_ADDRESS), as Ray actors."""
    given = value(cfg, "trainer.controller")
    if given != "auto":
        return {"controller": given, "controller_why": f"trainer.controller={given}"}
    if os.environ.get("RAY_ADDRESS"):
        return {"controller": "ray", "controller_why": "auto: RAY_ADDRESS names a Ray cluster"}
    if plan.world_size == 1:
        return {"controller": "local", "controller_why": "auto: one device, its workers in this process"}
    return {"controller": "ray", "controller_why": f"auto: {plan.world_size} devices, a Ray actor each"}


def _balance_dp(cfg: DictConfig, layouts) -> int:
    """The actor's data-parallel size when trainer.balance_ranks places groups by tokens across it, else 1."""
    actor = next((layout for layout in layouts if layout.role == "actor"), None)
    if actor is None or not value(cfg, "trainer.balance_ranks") or not isinstance(actor.dp, int):
        return 1
    return max(actor.dp, 1)


def lora_rank(cfg: DictConfig, role: str) -> int:
    """The role's LoRA rank (0: it trains in full)."""
    rank = value(cfg, f"{role}.lora.rank")
    return rank if isinstance(rank, int) else 0


def _shared_prefix_roles(cfg: DictConfig, layouts) -> Tuple[str, ...]:
    """The roles that pack their rows (fsdp; megatron with its local attention: with TransformerEngine's it
    computes padded rows and warns)."""
    if not value(cfg, "model.shared_prefix"):
        return ()
    packing = ("fsdp", "megatron")
    return tuple(lay.role for lay in layouts if lay.role in ("actor", "ref", "critic") and lay.backend in packing)


def _threads(cfg: DictConfig, plan: Plan) -> dict:
    """CPU workers share the node's cores: the recipe's number, else the user's OMP_NUM_THREADS, else an even split."""
    if plan.device != "cpu":
        return {}
    given = value(cfg, "placement.threads_per_worker")
    if isinstance(given, int) and given >= 1:
        return {"threads": given, "threads_from": "placement.threads_per_worker"}
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) >= 1:
        return {"threads": int(env), "threads_from": "OMP_NUM_THREADS"}
    try:
        # a critic or reward model sharing a pool with another role is a process of its own on each device
        per_device = max([1] + [len(processes_per_pool(plan, p.name)) for p in plan.pools])
    except StopIteration:  # a draft whose pools did not resolve
        per_device = 1
    workers, cores = max(1, plan.devices_per_node) * per_device, os.cpu_count() or 1
    return {"threads": max(1, cores // workers), "threads_from": f"{cores} cores / {workers} workers per node"}


def processes_per_pool(plan: Plan, pool: str) -> Tuple[str, ...]:
    """The worker groups with a process on each device of `pool`: the actor/rollout/ref one, the critic's and the
    reward model's (each a process of its own, sharing the devices)."""
    groups = [g for g, roles in WORKER_GROUPS.items() if any(plan.has(r) and plan.pool(r).name == pool for r in roles)]
    return tuple(groups)


# the roles each worker group holds (a rollout apart from the actor is a RolloutWorker group of its own pool)
WORKER_GROUPS = {"actor_rollout": ("actor", "rollout", "ref"), "critic": ("critic",), "reward": ("reward",)}


def on_policy_problem(cfg: DictConfig, batch: Optional[BatchPlan]) -> Optional[str]:
    """Why the actor's old log-probs need a pass of their own; None when its update is on-policy and the
    update's first forward (the policy the samples were scored under) can stand in for them."""
    actor = batch.train_of("actor") if batch is not None else None
    if trainer_kind(cfg) != "ppo":
        return None  # the DPO loss compares with the reference only, SFT's with the data: no old policy to keep
    if value(cfg, "actor.recompute_old_log_probs") == "always":
        return "actor.recompute_old_log_probs=always"
    if value(cfg, "actor.routing_replay") == "r2":
        return "actor.routing_replay=r2 records each token's experts in it for the update to replay"
    if actor is None or actor.mini_batches is None:
        return "the actor's mini-batches are not resolved"
    if actor.epochs != 1 or actor.mini_batches != 1:
        return f"{actor.mini_batches} mini-batch(es) x {actor.epochs} epoch(s): later ones train on moved weights"
    if value(cfg, "algorithm.use_kl_in_reward"):
        return "algorithm.use_kl_in_reward needs them before the advantages"
    if lora_rank(cfg, "actor") >= 1 and (value(cfg, "actor.lora.dropout") or 0) > 0:
        return "actor.lora.dropout > 0: the update's forward drops adapter inputs, the old policy's does not"
    return None


def build_plan(cfg: Any, total_steps: Optional[int] = None) -> Plan:
    """The plan of a validated config; ConfigError when its placement or batch sizes do not resolve.

    total_steps: the run's training steps when the caller knows them (trainer.total_steps, or the epochs
    over the data); the plan's optimizer-step counts need them."""
    from verl.algos import load_plugins  # lazy: a plugin estimator decides whether a critic runs

    cfg = as_config(cfg)
    load_plugins(list(value(cfg, "trainer.plugins") or []))
    draft = draft_plan(cfg, total_steps)
    problems = errors(draft.problems)
    if draft.plan.batch is None:
        problems.append(
            ConfigProblem(
                "data.train_batch_size", "the batch sizes are unset", "set data.train_batch_size and rollout.n"
            )
        )
    if problems:
        raise ConfigError(problems)
    return draft.plan
