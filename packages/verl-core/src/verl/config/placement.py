"""Placement: which node, device and rank holds which role, and each role's parallel layout.

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
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, cast

from omegaconf import DictConfig, OmegaConf

from verl.config.errors import ConfigError, ConfigProblem
from verl.config.schema import PREFERENCE_ALGORITHMS, ROLES, VerlConfig

AXES = ("tp", "pp", "cp", "dp", "ep")
TRAIN_ROLES = ("actor", "ref", "critic")


def as_config(cfg: Any) -> DictConfig:
    """A DictConfig for `cfg` (a DictConfig already, a VerlConfig, or a plain dict of sections)."""
    if isinstance(cfg, DictConfig):
        return cfg
    if isinstance(cfg, VerlConfig):
        return OmegaConf.structured(cfg)
    return cast(DictConfig, OmegaConf.merge(OmegaConf.structured(VerlConfig), cfg))


def to_dict(node: Any, resolve: bool = True) -> Dict[str, Any]:
    """A config section as plain dicts and lists (what user code and libraries are given)."""
    return cast(Dict[str, Any], OmegaConf.to_container(node, resolve=resolve))


def value(cfg: DictConfig, key: str) -> Any:
    """The value at a dotted key, or None when it is unset (`???`) or absent."""
    return OmegaConf.select(cfg, key, default=None)


TrainerKind = Literal["ppo", "dpo", "online_dpo", "sft"]


def trainer_kind(cfg: DictConfig) -> TrainerKind:
    """What trains a run (the plan's `trainer`), read from algorithm.name once: "ppo" for ppo, grpo and unset (every
    advantage estimator), else the preference algorithm (dpo, online_dpo) or "sft"."""
    name = value(cfg, "algorithm.name")
    return name if name in (*PREFERENCE_ALGORITHMS, "sft") else "ppo"


def _switch(cfg: DictConfig, role: str) -> Tuple[bool, str]:
    """Whether a role runs and, when it does, a short reason for messages about it."""
    if role == "rollout" and trainer_kind(cfg) == "sft":
        return False, "algorithm.name=sft generates nothing"
    if role in ("actor", "rollout"):
        return True, "always on"
    if role == "reward":  # placed only when asked: a reward model in no pool runs in the driver process
        placed = any("reward" in _pool_roles(pool) for pool in value(cfg, "placement.pools") or [])
        return placed and value(cfg, "reward.model") is not None, "reward.model is set and a pool lists reward"
    enable = value(cfg, f"{role}.enable")
    if enable is not None:
        return bool(enable), f"{role}.enable=true"
    if role == "ref":
        if trainer_kind(cfg) in PREFERENCE_ALGORITHMS:
            return True, f"algorithm.name={trainer_kind(cfg)}"
        kl = bool(value(cfg, "actor.use_kl_loss")) or bool(value(cfg, "algorithm.use_kl_in_reward"))
        return kl, "actor.use_kl_loss or algorithm.use_kl_in_reward is true"
    return "values" in estimator_inputs(cfg), f"algorithm.adv_estimator={value(cfg, 'algorithm.adv_estimator')}"


def estimator_inputs(cfg: DictConfig) -> Tuple[str, ...]:
    """The optional inputs the advantage estimator declares (values: it needs a critic; index: groups)."""
    from verl.algos import estimator_requires  # lazy: torch is needed only once algorithms are involved

    try:
        return tuple(estimator_requires(value(cfg, "algorithm.adv_estimator")))
    except (LookupError, ValueError, TypeError, ConfigError):  # a bad name or spec: validate reports it
        return ()


def enabled_roles(cfg: Any) -> Tuple[str, ...]:
    """The roles this run needs, in ROLES order: actor always, rollout unless the run is SFT, ref and critic on
    demand."""
    cfg = as_config(cfg)
    return tuple(r for r in ROLES if _switch(cfg, r)[0])


def role_backend(cfg: DictConfig, role: str) -> Optional[str]:
    """The backend a role runs on; ref defaults to the actor's; the reward role's is its model's class name."""
    if role == "ref":
        return value(cfg, "ref.backend") or value(cfg, "actor.backend")
    if role == "reward":
        return str(value(cfg, "reward.model._target_") or "reward model").rsplit(".", 1)[-1]
    return value(cfg, f"{role}.backend")


def ref_inherits_parallel(cfg: DictConfig) -> bool:
    return value(cfg, "ref.parallel") is None


def role_parallel(cfg: DictConfig, role: str) -> Dict[str, Optional[int]]:
    """A role's parallel sizes as a dict (tp, pp, vpp, cp, ep, dp); ref defaults to the actor's."""
    section = "actor" if role == "ref" and ref_inherits_parallel(cfg) else role
    node = value(cfg, f"{section}.parallel")
    return dict(to_dict(node, resolve=False)) if node is not None else {}


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
    ep: int  # expert-parallel rank: position in the ep group (megatron's expert ranks: etp fastest, then ep)
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
    etp: Optional[int] = None  # megatron: tensor parallelism inside each expert; None: tp

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def sizes(self) -> Dict[str, Optional[int]]:
        """The parallel sizes as a dict (what a backend's model description takes)."""
        return {
            "tp": self.tp, "pp": self.pp, "vpp": self.vpp, "cp": self.cp, "ep": self.ep, "etp": self.etp, "dp": self.dp
        }

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
        ep_r = (local_rank % (self.tp * self.cp * self.dp) // (self.etp or self.tp)) % self.ep
        return Coords(self.role, tp_r, pp_r, cp_r, dp_r, ep_r, self._shown_axes())

    def _shown_axes(self) -> Tuple[str, ...]:
        if self.role == "rollout":
            base = {"tp", "dp"}
        elif self.backend == "megatron":
            base = {"tp", "pp", "dp"}
        else:  # fsdp and other data-parallel backends: only dp varies
            base = {"dp"}
        return tuple(a for a in AXES if a in base or getattr(self, a) > 1)


def _pool_name(pool: Any, index: int) -> str:
    name = value(pool, "name")
    return str(name) if name is not None else f"#{index}"


def _pool_roles(pool: Any) -> List[str]:
    roles = value(pool, "roles")
    return [str(r) for r in roles] if roles is not None else []


def _total_devices(cfg: DictConfig) -> Tuple[Optional[int], List[ConfigProblem]]:
    sizes = {key: value(cfg, key) for key in ("placement.nnodes", "placement.devices_per_node")}
    problems = [
        ConfigProblem(key, f"must be >= 1, got {v}", f"set {key}=1 or more") for key, v in sizes.items() if (v or 0) < 1
    ]
    return (None if problems else math.prod(sizes.values())), problems


def resolve_pools(
    cfg: DictConfig, role_pool: Sequence[Tuple[str, str]]
) -> Tuple[Tuple[Pool, ...], List[ConfigProblem]]:
    """Each pool whose device range resolves, with the enabled roles placed in it (`role_pool`), and the problems."""
    total, problems = _total_devices(cfg)
    pools = list(value(cfg, "placement.pools") or [])
    if not pools:
        fix = "add a pool, e.g. placement.pools=[{name: hybrid, roles: [actor, rollout, ref, critic]}]"
        return (), problems + [ConfigProblem("placement.pools", "no pools: no role has devices", fix)]
    names = Counter(_pool_name(pool, i) for i, pool in enumerate(pools))
    problems += [
        ConfigProblem("placement.pools", f"{count} pools are named '{name}'", "give each pool its own name")
        for name, count in sorted(names.items())
        if count > 1
    ]
    resolved: List[Pool] = []
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
        resolved.append(Pool(name, tuple(r for r, p in role_pool if p == name), taken, devices))
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
        name, pool_roles = _pool_name(pool, i), _pool_roles(pool)
        for role in pool_roles:
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
    lora_actor = isinstance(value(cfg, "actor.lora.rank"), int) and value(cfg, "actor.lora.rank") >= 1
    if lora_actor and "ref" in roles and "ref" not in found and found.get("actor"):
        found["ref"] = found["actor"][:1]  # a LoRA actor's reference is the actor itself, adapters off
    for role in roles:
        pools_of = found.get(role, [])
        if not pools_of:
            problems.append(
                ConfigProblem(
                    "placement.pools",
                    f"role '{role}' is enabled ({_switch(cfg, role)[1]}) but is in no pool",
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
    role: str, backend: str, parallel: Dict[str, Any], pool: Tuple[str, int, int], key: str, note: str = ""
) -> Tuple[Optional[Layout], List[ConfigProblem]]:
    """Lay `parallel` over a pool (name, first rank, size), deriving dp; None and the problems if it does not fit."""
    name, first, devices = pool
    problems = [
        ConfigProblem(f"{key}.{axis}", f"must be >= 1, got {parallel[axis]}{note}", f"set {key}.{axis}=1")
        for axis in ("tp", "pp", "cp", "ep", "etp", "dp", "vpp")
        if parallel.get(axis) is not None and parallel[axis] < 1
    ]
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
        role,
        backend,
        name,
        first,
        tp,
        pp,
        cp,
        devices // mp,
        parallel.get("ep") or 1,
        parallel.get("vpp"),
        sp,
        etp=parallel.get("etp"),
    )
    return layout, []


def resolve_sequence_parallel(setting: Optional[bool], tp: int) -> bool:
    """A megatron role's parallel.sequence_parallel: None (the default) means on whenever tp > 1.

    Megatron's advice: sequence parallelism computes the same function and keeps 1/tp of the activations
    outside the tensor-parallel layers (norms, residuals) on each rank."""
    return tp > 1 if setting is None else bool(setting)


def resolve_layouts(
    cfg: DictConfig, role_pool: Sequence[Tuple[str, str]], pools: Sequence[Pool]
) -> Tuple[Tuple[Layout, ...], List[ConfigProblem]]:
    by_name = {p.name: p for p in pools}
    layouts: List[Layout] = []
    problems: List[ConfigProblem] = []
    for role, pool_name in role_pool:
        pool = by_name.get(pool_name)
        if pool is None:  # its pool's devices did not resolve: already reported
            continue
        inherited = role == "ref" and ref_inherits_parallel(cfg)
        note = " (ref.parallel is unset, so it uses actor.parallel)" if inherited else ""
        actor_pool = by_name.get(dict(role_pool).get("actor", ""))
        actor_failed = actor_pool is not None and not any(x.role == "actor" for x in layouts)
        if inherited and actor_failed and actor_pool.size == pool.size:
            continue  # the same layout over as many devices: the actor's problem already says it
        where = (pool.name, pool.first_rank, pool.size)
        layout, found = derive_layout(
            role, role_backend(cfg, role) or "", role_parallel(cfg, role), where, f"{role}.parallel", note
        )
        problems += found
        if layout is not None:
            layouts.append(layout)
    return tuple(layouts), problems
