"""The placement plan: which node, device and rank holds which role, and each role's parallel layout.

Devices are numbered node-major (node 0 devices 0..D-1, then node 1 ...); a device's number is its
global rank, since every device runs one worker process. `placement.pools` hands out devices in order:
each pool takes `devices` of them, and only the last pool may leave `devices` unset (it takes every
device left). Roles in one pool are colocated: the process on each device holds all of them (the
hybrid engine), and each role lays the pool's devices out as world = tp * pp * cp * dp.

Rank order inside a role (Megatron's): tp fastest, then cp, then dp, then pp:
    rank = tp_r + tp * (cp_r + cp * (dp_r + dp * pp_r))
A rollout has pp = cp = 1, so the same formula gives its order: tp fastest, then dp.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from verl.config.errors import ConfigError, ConfigProblem
from verl.config.schema import ROLES, VerlConfig

AXES = ("tp", "pp", "cp", "dp", "ep")
TRAIN_ROLES = ("actor", "ref", "critic")


# ---------------------------------------------------------------------------------------------
# Reading the config
# ---------------------------------------------------------------------------------------------


def as_config(cfg: Any) -> DictConfig:
    """A DictConfig for `cfg` (a DictConfig already, a VerlConfig, or a plain dict of sections)."""
    if isinstance(cfg, DictConfig):
        return cfg
    if isinstance(cfg, VerlConfig):
        return OmegaConf.structured(cfg)
    return OmegaConf.merge(OmegaConf.structured(VerlConfig), cfg)


def value(cfg: DictConfig, key: str) -> Any:
    """The value at a dotted key, or None when it is unset (`???`) or absent."""
    return OmegaConf.select(cfg, key, default=None)


def ref_enabled(cfg: DictConfig) -> bool:
    enable = value(cfg, "ref.enable")
    if enable is not None:
        return bool(enable)
    return bool(value(cfg, "actor.use_kl_loss")) or bool(value(cfg, "algorithm.use_kl_in_reward"))


def critic_enabled(cfg: DictConfig) -> bool:
    enable = value(cfg, "critic.enable")
    if enable is not None:
        return bool(enable)
    return _estimator_needs_values(value(cfg, "algorithm.adv_estimator"))


def _estimator_needs_values(spec: Any) -> bool:
    """Whether the advantage estimator declares it needs a critic (gae, or a plugin's with requires=("values",))."""
    from verl.algos import estimator_needs_values  # lazy: torch is needed only once algorithms are involved

    try:
        return estimator_needs_values(spec)
    except (LookupError, ValueError, TypeError, ConfigError):  # a bad name or spec: validate reports it
        return False


def enabled_roles(cfg: Any) -> Tuple[str, ...]:
    """The roles this run needs, in ROLES order: actor and rollout always, ref and critic on demand."""
    cfg = as_config(cfg)
    on = {"actor": True, "rollout": True, "ref": ref_enabled(cfg), "critic": critic_enabled(cfg)}
    return tuple(r for r in ROLES if on[r])


def why_enabled(cfg: DictConfig, role: str) -> str:
    """A short reason a role is on, for messages about it."""
    if role in ("actor", "rollout"):
        return "always on"
    if value(cfg, f"{role}.enable") is not None:
        return f"{role}.enable=true"
    if role == "ref":
        return "actor.use_kl_loss or algorithm.use_kl_in_reward is true"
    return f"algorithm.adv_estimator={value(cfg, 'algorithm.adv_estimator')}"


def role_backend(cfg: DictConfig, role: str) -> Optional[str]:
    """The backend a role runs on; ref defaults to the actor's."""
    if role == "ref":
        return value(cfg, "ref.backend") or value(cfg, "actor.backend")
    return value(cfg, f"{role}.backend")


def ref_inherits_parallel(cfg: DictConfig) -> bool:
    return value(cfg, "ref.parallel") is None


def role_parallel(cfg: DictConfig, role: str) -> Dict[str, Optional[int]]:
    """A role's parallel sizes as a dict (tp, pp, vpp, cp, ep, dp); ref defaults to the actor's."""
    section = "actor" if role == "ref" and ref_inherits_parallel(cfg) else role
    node = value(cfg, f"{section}.parallel")
    return dict(OmegaConf.to_container(node)) if node is not None else {}


# ---------------------------------------------------------------------------------------------
# The plan's parts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """A run of consecutive global ranks whose roles share them."""

    name: str
    roles: Tuple[str, ...]  # the enabled roles placed here
    first_rank: int
    size: int

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.size)

    def nodes(self, devices_per_node: int) -> Tuple[int, int]:
        """First and last node this pool touches."""
        return self.first_rank // devices_per_node, (self.first_rank + self.size - 1) // devices_per_node


@dataclass(frozen=True)
class Coords:
    """Where one rank sits in one role's layout."""

    role: str
    tp: int
    pp: int
    cp: int
    dp: int
    ep: int  # expert-parallel rank: position in the ep group carved out of dp*cp
    shown: Tuple[str, ...]  # the axes worth printing for this role

    def __str__(self) -> str:
        return " ".join([self.role] + [f"{a}{getattr(self, a)}" for a in self.shown])


@dataclass(frozen=True)
class Layout:
    """One role's parallel layout over its pool."""

    role: str
    backend: str
    pool: str
    first_rank: int  # the pool's first global rank: role rank = global rank - first_rank
    tp: int
    pp: int
    cp: int
    dp: int
    ep: int = 1
    vpp: Optional[int] = None
    sequence_parallel: bool = False  # megatron: sequences split over tp outside tensor-parallel layers

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def model_parallel(self) -> int:
        """Devices that hold one copy of the model (tp * pp * cp)."""
        return self.tp * self.pp * self.cp

    def rank(self, tp: int = 0, pp: int = 0, cp: int = 0, dp: int = 0) -> int:
        """The role-local rank of the given coordinates."""
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def coords(self, local_rank: int) -> Coords:
        """The coordinates of a role-local rank (0 <= local_rank < world)."""
        if not 0 <= local_rank < self.world:
            raise ValueError(f"{self.role}: rank {local_rank} outside 0..{self.world - 1}")
        tp_r, rest = local_rank % self.tp, local_rank // self.tp
        cp_r, rest = rest % self.cp, rest // self.cp
        dp_r, pp_r = rest % self.dp, rest // self.dp
        ep_r = (cp_r + self.cp * dp_r) % self.ep
        return Coords(self.role, tp_r, pp_r, cp_r, dp_r, ep_r, self._shown_axes())

    def _shown_axes(self) -> Tuple[str, ...]:
        if self.role == "rollout":
            base = {"tp", "dp"}
        elif self.backend == "megatron":
            base = {"tp", "pp", "dp"}
        else:  # fsdp and other data-parallel backends: only dp varies
            base = {"dp"}
        return tuple(a for a in AXES if a in base or getattr(self, a) > 1)


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

    @property
    def mini_samples(self) -> int:
        return self.mini_prompts * self.n

    @property
    def mini_batches(self) -> Optional[int]:
        return self.prompts // self.mini_prompts if self.prompts % self.mini_prompts == 0 else None

    @property
    def per_rank(self) -> Optional[int]:
        """Samples of one mini-batch on one DP rank; None when they do not split evenly (or dp is unknown)."""
        if self.dp is None or self.mini_samples % self.dp:
            return None
        return self.mini_samples // self.dp

    @property
    def micro_batches(self) -> Optional[int]:
        """Gradient-accumulation steps per mini-batch on one rank; None when uneven."""
        per_rank = self.per_rank
        return per_rank // self.micro if per_rank is not None and per_rank % self.micro == 0 else None


@dataclass(frozen=True)
class LogProbPass:
    """A forward pass over every sample of a step (old/ref log-probs, values)."""

    role: str
    samples: int
    dp: int
    micro: int

    @property
    def per_rank(self) -> Optional[int]:
        return self.samples // self.dp if self.samples % self.dp == 0 else None


@dataclass(frozen=True)
class BatchPlan:
    prompts: int  # data.train_batch_size
    n: int  # rollout.n
    rollout_dp: Optional[int]
    train: Tuple[TrainBatch, ...]
    log_prob: Tuple[LogProbPass, ...]

    @property
    def samples(self) -> int:
        return self.prompts * self.n

    @property
    def prompts_per_replica(self) -> Optional[int]:
        """Prompts one rollout DP replica generates for; None when they do not split evenly."""
        if self.rollout_dp is None or self.prompts % self.rollout_dp:
            return None
        return self.prompts // self.rollout_dp

    def train_of(self, role: str) -> Optional[TrainBatch]:
        return next((t for t in self.train if t.role == role), None)


@dataclass(frozen=True)
class Plan:
    nnodes: int
    devices_per_node: int
    device: str
    pools: Tuple[Pool, ...]
    layouts: Tuple[Layout, ...]  # one per enabled role, in ROLES order
    batch: Optional[BatchPlan]  # None when the batch sizes are unset

    @property
    def world_size(self) -> int:
        return self.nnodes * self.devices_per_node

    @property
    def roles(self) -> Tuple[str, ...]:
        return tuple(layout.role for layout in self.layouts)

    def layout(self, role: str) -> Layout:
        for layout in self.layouts:
            if layout.role == role:
                return layout
        raise KeyError(f"role '{role}' is not in this plan (roles: {', '.join(self.roles)})")

    def pool(self, role: str) -> Pool:
        name = self.layout(role).pool
        return next(p for p in self.pools if p.name == name)

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
        if "rollout" not in self.roles or self.pool("rollout") != self.pool("actor"):
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
    pools: Tuple[Pool, ...]  # pools whose device range resolved
    layouts: Tuple[Layout, ...]  # roles whose layout fits their pool
    batch: Optional[BatchPlan]
    problems: Tuple[ConfigProblem, ...]

    def pool_of(self, role: str) -> Optional[str]:
        return dict(self.role_pool).get(role)

    def layout(self, role: str) -> Optional[Layout]:
        return next((layout for layout in self.layouts if layout.role == role), None)


# ---------------------------------------------------------------------------------------------
# Building the plan
# ---------------------------------------------------------------------------------------------


def _pool_name(pool: Any, index: int) -> str:
    name = value(pool, "name")
    return str(name) if name is not None else f"#{index}"


def _pool_roles(pool: Any) -> List[str]:
    roles = value(pool, "roles")
    return [str(r) for r in roles] if roles is not None else []


def _total_devices(cfg: DictConfig) -> Tuple[Optional[int], List[ConfigProblem]]:
    problems = []
    for key in ("placement.nnodes", "placement.devices_per_node"):
        v = value(cfg, key)
        if v is None or v < 1:
            problems.append(ConfigProblem(key, f"must be >= 1, got {v}", f"set {key}=1 or more"))
    if problems:
        return None, problems
    return value(cfg, "placement.nnodes") * value(cfg, "placement.devices_per_node"), []


def resolve_pools(cfg: DictConfig) -> Tuple[Tuple[Tuple[str, int, int], ...], List[ConfigProblem]]:
    """(name, first rank, size) for each pool whose device range resolves, and the problems found."""
    total, problems = _total_devices(cfg)
    pools = list(value(cfg, "placement.pools") or [])
    if not pools:
        fix = "add a pool, e.g. placement.pools=[{name: hybrid, roles: [actor, rollout, ref, critic]}]"
        return (), problems + [ConfigProblem("placement.pools", "no pools: no role has devices", fix)]
    names = [_pool_name(pool, i) for i, pool in enumerate(pools)]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(
            ConfigProblem(
                "placement.pools", f"{names.count(name)} pools are named '{name}'", "give each pool its own name"
            )
        )
    resolved: List[Tuple[str, int, int]] = []
    taken = 0
    for i, pool in enumerate(pools):
        key, name, devices = f"placement.pools.{i}.devices", _pool_name(pool, i), value(pool, "devices")
        if devices is None and i < len(pools) - 1:
            problems.append(
                ConfigProblem(
                    key,
                    f"pool '{name}' leaves devices unset, but only the last pool may (it takes every device left)",
                    f"set {key} to a number of devices, or move pool '{name}' last",
                )
            )
            continue
        if devices is None:
            if total is None:
                continue
            devices = total - taken
            if devices < 1:
                problems.append(
                    ConfigProblem(
                        key,
                        f"pool '{name}' gets 0 devices: the pools before it take all {total}",
                        "give the earlier pools fewer devices, or add nodes (placement.nnodes)",
                    )
                )
                continue
        elif devices < 1:
            problems.append(
                ConfigProblem(
                    key, f"pool '{name}' has {devices} devices", f"give it >= 1 device or remove pool '{name}'"
                )
            )
            continue
        resolved.append((name, taken, devices))
        taken += devices
    if total is not None and taken > total:
        nnodes, dpn = value(cfg, "placement.nnodes"), value(cfg, "placement.devices_per_node")
        problems.append(
            ConfigProblem(
                "placement.pools",
                f"the pools take {taken} devices but the placement has {total} "
                f"(nnodes={nnodes} x devices_per_node={dpn})",
                f"give the pools at most {total} devices in total, or raise placement.nnodes",
            )
        )
    elif total is not None and taken < total and problems == []:
        problems.append(
            ConfigProblem(
                "placement.pools",
                f"the pools take {taken} of {total} devices; {total - taken} stay idle",
                "leave the last pool's devices unset to give it every device left",
                severity="warning",
            )
        )
    return tuple(resolved), problems


def assign_roles(cfg: DictConfig, roles: Sequence[str]) -> Tuple[Tuple[Tuple[str, str], ...], List[ConfigProblem]]:
    """(role, pool name) for each enabled role (its first pool), and the membership problems."""
    problems: List[ConfigProblem] = []
    found: Dict[str, List[str]] = {}
    pools = list(value(cfg, "placement.pools") or [])
    for i, pool in enumerate(pools):
        name = _pool_name(pool, i)
        for role in _pool_roles(pool):
            if role in ROLES:
                found.setdefault(role, []).append(name)
            else:
                close = difflib.get_close_matches(role, ROLES, n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                problems.append(
                    ConfigProblem(
                        f"placement.pools.{i}.roles",
                        f"unknown role '{role}' in pool '{name}'",
                        f"{hint}roles: {', '.join(ROLES)}",
                    )
                )
        pool_roles = _pool_roles(pool)
        if not any(r in roles for r in pool_roles) and all(r in ROLES for r in pool_roles):
            problems.append(
                ConfigProblem(
                    f"placement.pools.{i}.roles",
                    f"pool '{name}' holds no enabled role ({', '.join(pool_roles) or 'none listed'}); "
                    "its devices stay idle",
                    f"remove pool '{name}', or place an enabled role in it",
                    severity="warning",
                )
            )
    for role in roles:
        pools_of = found.get(role, [])
        if not pools_of:
            problems.append(
                ConfigProblem(
                    "placement.pools",
                    f"role '{role}' is enabled ({why_enabled(cfg, role)}) but is in no pool",
                    f"add '{role}' to the roles of one pool"
                    + (f", or set {role}.enable=false" if role in ("ref", "critic") else ""),
                )
            )
        elif len(pools_of) > 1:
            problems.append(
                ConfigProblem(
                    "placement.pools",
                    f"role '{role}' is in {len(pools_of)} pools ({', '.join(repr(p) for p in pools_of)})",
                    f"keep '{role}' in exactly one pool",
                )
            )
    return tuple((r, found[r][0]) for r in roles if r in found), problems


def _fitting_values(devices: int, others: int) -> List[int]:
    """Sizes s with s * others dividing `devices`: the valid choices for one axis."""
    return [s for s in range(1, devices + 1) if devices % (s * others) == 0]


def derive_layout(
    role: str, backend: str, parallel: Dict[str, Optional[int]], pool: Tuple[str, int, int], key: str, note: str = ""
) -> Tuple[Optional[Layout], List[ConfigProblem]]:
    """Lay `parallel` over a pool (name, first rank, size), deriving dp; None and the problems if it does not fit."""
    name, first, devices = pool
    problems = []
    for axis in ("tp", "pp", "cp", "ep", "dp", "vpp"):
        v = parallel.get(axis)
        if v is not None and v < 1:
            problems.append(ConfigProblem(f"{key}.{axis}", f"must be >= 1, got {v}{note}", f"set {key}.{axis}=1"))
    if problems:
        return None, problems
    tp, pp, cp = parallel.get("tp") or 1, parallel.get("pp") or 1, parallel.get("cp") or 1
    mp = tp * pp * cp
    if devices % mp:
        valid = _fitting_values(devices, pp * cp)
        fix = (
            f"tp values that fit with pp={pp} cp={cp}: {', '.join(map(str, valid))}"
            if valid
            else f"pp*cp = {pp * cp} does not divide {devices} either; pick tp, pp, cp whose product divides {devices}"
        )
        msg = f"tp*pp*cp = {mp} does not divide the {devices} devices of pool '{name}' (tp={tp} pp={pp} cp={cp}){note}"
        return None, [ConfigProblem(f"{key}.tp", msg, fix)]
    dp = parallel.get("dp")
    if dp is not None and mp * dp != devices:
        msg = (
            f"tp*pp*cp*dp = {mp * dp} does not equal the {devices} devices of pool '{name}' "
            f"(tp={tp} pp={pp} cp={cp} dp={dp}){note}"
        )
        return None, [ConfigProblem(f"{key}.dp", msg, f"set {key}.dp={devices // mp}, or null to derive it")]
    sp = backend == "megatron" and resolve_sequence_parallel(parallel.get("sequence_parallel"), tp)
    layout = Layout(
        role, backend, name, first, tp, pp, cp, devices // mp, parallel.get("ep") or 1, parallel.get("vpp"), sp
    )
    return layout, []


def resolve_sequence_parallel(setting: Optional[bool], tp: int) -> bool:
    """A megatron role's parallel.sequence_parallel: None (the default) means on whenever tp > 1.

    Megatron's advice: sequence parallelism computes the same function and keeps 1/tp of the activations
    outside the tensor-parallel layers (norms, residuals) on each rank."""
    return tp > 1 if setting is None else bool(setting)


def _layouts(
    cfg: DictConfig, role_pool: Sequence[Tuple[str, str]], pools: Sequence[Tuple[str, int, int]]
) -> Tuple[Tuple[Layout, ...], List[ConfigProblem]]:
    by_name = {p[0]: p for p in pools}
    layouts: List[Layout] = []
    problems: List[ConfigProblem] = []
    for role, pool_name in role_pool:
        pool = by_name.get(pool_name)
        if pool is None:  # its pool's devices did not resolve: already reported
            continue
        inherited = role == "ref" and ref_inherits_parallel(cfg)
        note = " (ref.parallel is unset, so it uses actor.parallel)" if inherited else ""
        actor_pool = by_name.get(dict(role_pool).get("actor", ""))
        if inherited and actor_pool is not None and actor_pool[2] == pool[2] and not _has_layout(layouts, "actor"):
            continue  # the same layout over as many devices: the actor's problem already says it
        layout, found = derive_layout(
            role, role_backend(cfg, role) or "", role_parallel(cfg, role), pool, f"{role}.parallel", note
        )
        problems += found
        if layout is not None:
            layouts.append(layout)
    return tuple(layouts), problems


def _has_layout(layouts: Sequence[Layout], role: str) -> bool:
    return any(layout.role == role for layout in layouts)


def _positive(cfg: DictConfig, key: str, default_key: Optional[str] = None) -> Optional[int]:
    v = value(cfg, key)
    if v is None and default_key is not None:
        v = value(cfg, default_key)
    return v if isinstance(v, int) and v >= 1 else None


def batch_plan(cfg: DictConfig, layouts: Sequence[Layout]) -> Optional[BatchPlan]:
    """The step's batch arithmetic over the given layouts; None when the batch sizes are unset or not positive.

    Entries whose numbers are unset or not positive are left out (validation reports those).
    """
    prompts, n = _positive(cfg, "data.train_batch_size"), _positive(cfg, "rollout.n")
    if prompts is None or n is None:
        return None
    dps = {layout.role: layout.dp for layout in layouts}
    train = []
    for role in ("actor", "critic"):
        mini = _positive(cfg, f"{role}.ppo_mini_batch_size", "actor.ppo_mini_batch_size")
        micro = _positive(cfg, f"{role}.ppo_micro_batch_size_per_device")
        epochs = _positive(cfg, f"{role}.ppo_epochs", "actor.ppo_epochs")
        enabled = role == "actor" or critic_enabled(cfg)
        if enabled and None not in (mini, micro, epochs):
            train.append(TrainBatch(role, prompts, mini, n, dps.get(role), micro, epochs))
    log_prob = []
    micro_keys = {
        "actor": "actor.log_prob_micro_batch_size_per_device",
        "ref": "ref.log_prob_micro_batch_size_per_device",
        "critic": "critic.ppo_micro_batch_size_per_device",  # the critic's value pass
    }
    for role, micro_key in micro_keys.items():
        micro = _positive(cfg, micro_key)
        if role in dps and micro is not None:
            log_prob.append(LogProbPass(role, prompts * n, dps[role], micro))
    return BatchPlan(prompts, n, dps.get("rollout"), tuple(train), tuple(log_prob))


def draft_plan(cfg: Any) -> Draft:
    """Place what can be placed and collect the placement problems (every one, not just the first)."""
    cfg = as_config(cfg)
    roles = enabled_roles(cfg)
    pools, problems = resolve_pools(cfg)
    role_pool, found = assign_roles(cfg, roles)
    layouts, layout_problems = _layouts(cfg, role_pool, pools)
    pool_objs = tuple(
        Pool(name, tuple(r for r, p in role_pool if p == name), first, size) for name, first, size in pools
    )
    return Draft(
        roles, role_pool, pool_objs, layouts, batch_plan(cfg, layouts), tuple(problems + found + layout_problems)
    )


def make_plan(cfg: Any) -> Tuple[Optional[Plan], List[ConfigProblem]]:
    """The plan, or None when the placement has errors; the placement problems either way."""
    cfg = as_config(cfg)
    draft = draft_plan(cfg)
    problems = list(draft.problems)
    if any(p.severity == "error" for p in problems):
        return None, problems
    plan = Plan(
        nnodes=value(cfg, "placement.nnodes"),
        devices_per_node=value(cfg, "placement.devices_per_node"),
        device=str(value(cfg, "placement.device")),
        pools=draft.pools,
        layouts=draft.layouts,
        batch=draft.batch,
    )
    return plan, problems


# ---------------------------------------------------------------------------------------------
# Printing the plan
# ---------------------------------------------------------------------------------------------


def _count(n: int, word: str) -> str:
    """'1 device', '2 devices', '2 micro-batches'."""
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word}{'es' if word.endswith('ch') else 's'}"


def _node_span(pool: Pool, devices_per_node: int) -> str:
    first, last = pool.nodes(devices_per_node)
    return f"node {first}" if first == last else f"nodes {first}-{last}"


def _sizes(layout: Layout) -> str:
    if layout.role == "rollout":
        text = f"TP={layout.tp} DP={layout.dp}"
    else:
        text = f"TP={layout.tp}{'+SP' if layout.sequence_parallel else ''} PP={layout.pp} CP={layout.cp} DP={layout.dp}"
    if layout.vpp is not None:
        text += f" VPP={layout.vpp}"
    if layout.ep > 1:
        text += f" EP={layout.ep}"
    return text


def _role_lines(plan: Plan) -> List[str]:
    rows = []
    for layout in plan.layouts:
        pool = plan.pool(layout.role)
        where = f"{_count(pool.size, 'device')} in pool '{pool.name}' ({_node_span(pool, plan.devices_per_node)})"
        rows.append([layout.role, layout.backend, _sizes(layout), where])
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    groups = plan.rollout_groups_per_actor_group()
    if groups is not None:
        actor, rollout = plan.layout("actor"), plan.layout("rollout")
        lines.append(
            f"hybrid engine: each actor TP*PP group ({actor.tp}*{actor.pp} = {actor.tp * actor.pp} devices) "
            f"holds {groups} rollout replicas of TP={rollout.tp} (micro-DP = {actor.tp * actor.pp}/{rollout.tp})"
        )
    return lines


def _ratio(total: int, parts: int, per: Optional[int]) -> str:
    return str(per) if per is not None else f"{total}/{parts} (does not divide)"


def _batch_lines(batch: BatchPlan) -> List[str]:
    lines = [f"batch: {_count(batch.prompts, 'prompt')} x {_count(batch.n, 'sample')} = {batch.samples} samples/step"]
    if batch.rollout_dp is not None:
        per = batch.prompts_per_replica
        tail = f" x {batch.n} = {per * batch.n} samples" if per is not None else ""
        lines.append(
            f"rollout: {batch.prompts} prompts / DP {batch.rollout_dp} = "
            f"{_ratio(batch.prompts, batch.rollout_dp, per)} prompts per replica{tail}"
        )
    for t in batch.train:
        per_rank = _ratio(t.mini_samples, t.dp, t.per_rank)
        micro = (
            f"{_count(t.micro_batches, 'micro-batch')} of {t.micro}"
            if t.micro_batches is not None
            else f"micro-batches of {t.micro} (do not divide)"
        )
        steps = (
            f"; {_count(t.mini_batches, 'mini-batch')} x {_count(t.epochs, 'epoch')}"
            f" = {_count(t.mini_batches * t.epochs, 'optimizer step')}/step"
            if t.mini_batches is not None
            else f"; {t.prompts}/{t.mini_prompts} mini-batches (does not divide)"
        )
        lines.append(
            f"{t.role}: mini-batch {t.mini_prompts} prompts = {t.mini_samples} samples = "
            f"{per_rank} per DP rank = {micro}{steps}"
        )
    if batch.log_prob:
        passes = [
            f"{p.role} {_ratio(p.samples, p.dp, p.per_rank)} per DP rank (micro-batches of {p.micro})"
            for p in batch.log_prob
        ]
        lines.append(f"log-prob passes over {batch.samples} samples: " + "; ".join(passes))
    return lines


def _rank_rows(plan: Plan, max_rows: int) -> List[List[str]]:
    ranks = list(range(plan.world_size))
    rows = []
    if len(ranks) > max_rows:  # a big cluster: the first and last ranks show the pattern
        head, tail = ranks[: max_rows // 2], ranks[-(max_rows // 4) :]
        ranks = head + [-1] + tail
    for rank in ranks:
        if rank < 0:
            rows.append(["...", "...", "...", f"({plan.world_size - len(ranks) + 1} ranks not shown)"])
            continue
        node, device = plan.location(rank)
        workers = " | ".join(str(c) for c in plan.coords(rank)) or "(idle)"
        rows.append([str(node), str(device), str(rank), workers])
    return rows


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header) - 1)]
    return ["  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1] for r in [header] + rows]


def format_plan(plan: Plan, max_rows: int = 64) -> str:
    """The plan as text: per-role layouts, batch arithmetic and a rank table."""
    lines = [
        f"placement: {_count(plan.nnodes, 'node')} x {_count(plan.devices_per_node, plan.device + ' device')} "
        f"= {_count(plan.world_size, 'rank')}",
        *_role_lines(plan),
        "",
    ]
    if plan.batch is not None:
        lines += _batch_lines(plan.batch) + [""]
    lines += _table(["node", "device", "rank", "workers"], _rank_rows(plan, max_rows))
    return "\n".join(lines)
