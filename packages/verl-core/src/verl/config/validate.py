"""Checks a typed config cannot express: layouts that fit the devices, batch sizes that divide, backends
(and, in `algorithm_checks`, the algorithm keys).

`validate_and_plan` runs every check and returns every problem (errors and warnings), each with its dotted
key and a concrete fix, and the plan when there is no error. The arithmetic lives in `verl.config.placement`
and `verl.config.plan`; the checks read its draft. A field's own rules (`one_of`, `at_least` in the schema)
are checked generically.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from verl.config.algorithm_checks import (
    check_dapo,
    check_full_kl,
    check_group_size,
    check_kl_controller,
    check_kl_has_a_reference,
    check_policy_loss,
    check_registry_names,
    check_values_have_a_critic,
    plugin_problems,
)
from verl.config.checks import Check, Context, error_at, not_one_of
from verl.config.errors import ConfigProblem
from verl.config.placement import TRAIN_ROLES, as_config, ref_inherits_parallel, role_backend, role_parallel, value
from verl.config.plan import Plan, TrainBatch, draft_plan, plan_of
from verl.config.schema import VerlConfig


def _nearest_divisors(n: int, x: int) -> str:
    """The divisors of n closest to x (below and above), for 'use one of these' fixes."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    below = [d for d in divisors if d < x][-1:]
    above = [d for d in divisors if d > x][:1]
    return " or ".join(str(d) for d in below + above)


def _nearest_multiples(x: int, m: int) -> str:
    """The multiples of m closest to x."""
    below, above = (x // m) * m, (x // m + 1) * m
    return " or ".join(str(v) for v in (below, above) if v >= 1)


def _train_roles(ctx: Context) -> List[str]:
    """Enabled training roles with their own settings (a ref that inherits everything repeats the actor's problems)."""
    cfg = ctx.cfg
    return [
        r
        for r in TRAIN_ROLES
        if r in ctx.draft.roles
        and not (r == "ref" and value(cfg, "ref.backend") is None and ref_inherits_parallel(cfg))
    ]


# ---------------------------------------------------------------------------------------------
# placement
# ---------------------------------------------------------------------------------------------


def _field_rules(schema: type, node: Any, prefix: str) -> List[ConfigProblem]:
    """The `one_of` / `at_least` metadata of every field of `schema` (a section), checked against `node`."""
    problems = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        if OmegaConf.is_missing(node, f.name):
            continue  # reported by check_missing
        v = node[f.name]
        section = _section_type(hints[f.name])
        if section is not None:
            if v is not None:
                problems += _field_rules(section, v, key + ".")
            continue
        if "choices" in f.metadata and v is not None:
            problems += not_one_of(key, v, f.metadata["choices"])
        bound = f.metadata.get("min")
        if bound is not None and isinstance(v, (int, float)) and v < bound:
            problems.append(error_at(key, f"must be >= {bound}, got {v}", f"set {key}={bound} or more"))
    return problems


def _section_type(tp: Any) -> Optional[type]:
    """The dataclass of a section field (Optional[...] allowed), else None."""
    if typing.get_origin(tp) is typing.Union:  # Optional[Section]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def check_field_rules(ctx: Context) -> List[ConfigProblem]:
    """Every section's field rules; a ref or critic that does not run is not checked."""
    skip = {r for r in ("ref", "critic") if r not in ctx.draft.roles}
    hints = typing.get_type_hints(VerlConfig)
    return [
        p
        for f in dataclasses.fields(VerlConfig)
        if f.name not in skip
        for p in _field_rules(hints[f.name], ctx.cfg[f.name], f"{f.name}.")
    ]


def check_missing(ctx: Context) -> List[ConfigProblem]:
    return [
        error_at(key, "required value is not set", f"set {key} in the recipe or as an override {key}=...")
        for key in sorted(OmegaConf.missing_keys(ctx.cfg))
    ]


def check_placement(ctx: Context) -> List[ConfigProblem]:
    """Pools, their devices and the roles in them (computed by verl.config.placement)."""
    return list(ctx.draft.problems)


def check_hybrid_engine(ctx: Context) -> List[ConfigProblem]:
    """The actor, its rollout and the reference share one pool: the hybrid engine (the only placement yet)."""
    pools = {role: ctx.draft.pool_of(role) for role in ("actor", "rollout", "ref") if ctx.draft.pool_of(role)}
    if len(set(pools.values())) <= 1:
        return []
    where = ", ".join(f"{role} in '{pool}'" for role, pool in pools.items())
    return [
        error_at(
            "placement.pools",
            f"the actor, rollout and ref must share one pool (the hybrid engine) in this version; got {where}",
            "list them in the same placement.pools entry",
        )
    ]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def check_cuda_here(ctx: Context) -> List[ConfigProblem]:
    # Only when strict: planning a GPU run from a laptop is fine.
    if not ctx.strict or value(ctx.cfg, "placement.device") != "cuda" or _cuda_available():
        return []
    return [
        error_at(
            "placement.device",
            "placement.device=cuda but CUDA is not available here (torch.cuda.is_available() is False)",
            "set placement.device=cpu, or run on a GPU node",
        )
    ]


def check_controller(ctx: Context) -> List[ConfigProblem]:
    controller = value(ctx.cfg, "trainer.controller")
    problems = []
    nnodes = value(ctx.cfg, "placement.nnodes")
    if controller == "local" and isinstance(nnodes, int) and nnodes > 1:
        problems.append(
            error_at(
                "trainer.controller",
                f"the local controller runs workers in this process and cannot span placement.nnodes={nnodes} nodes",
                "set trainer.controller=ray, or placement.nnodes=1",
            )
        )
    return problems


# ---------------------------------------------------------------------------------------------
# layouts
# ---------------------------------------------------------------------------------------------


def _axes_not_one(cfg: DictConfig, role: str, axes: Sequence[str]) -> List[str]:
    parallel = role_parallel(cfg, role)
    return [a for a in axes if (parallel.get(a) or 1) != 1]


def check_fsdp_layout(ctx: Context) -> List[ConfigProblem]:
    """FSDP shards over data parallel ranks only."""
    problems = []
    for role in _train_roles(ctx):
        if role_backend(ctx.cfg, role) != "fsdp":
            continue
        parallel = role_parallel(ctx.cfg, role)
        for axis in _axes_not_one(ctx.cfg, role, ("tp", "pp", "cp")):  # ep: check_expert_parallel
            problems.append(
                error_at(
                    f"{role}.parallel.{axis}",
                    f"backend fsdp is data parallel only; {axis}={parallel[axis]} is not supported",
                    f"set {role}.backend=megatron for {axis} > 1, or {role}.parallel.{axis}=1",
                )
            )
    return problems


def check_megatron_offload(ctx: Context) -> List[ConfigProblem]:
    """The megatron engine keeps parameters and optimizer state on the device: refuse switches it would ignore."""
    problems = []
    for key in ("actor.param_offload", "ref.param_offload"):
        role = key.split(".")[0]
        if role in ctx.draft.roles and role_backend(ctx.cfg, role) == "megatron" and value(ctx.cfg, key):
            problems.append(
                error_at(key, "the megatron engine does not offload in this version", f"set {key}=false, or use fsdp")
            )
    return problems


def check_rollout_layout(ctx: Context) -> List[ConfigProblem]:
    """A rollout engine splits over tp (and the derived dp) only."""
    parallel = role_parallel(ctx.cfg, "rollout")
    problems = [
        error_at(
            f"rollout.parallel.{axis}",
            f"rollouts support tensor parallelism only; {axis}={parallel[axis]} is not supported",
            f"set rollout.parallel.{axis}=1 (use rollout.parallel.tp to split the model)",
        )
        for axis in _axes_not_one(ctx.cfg, "rollout", ("pp", "cp", "ep"))
    ]
    if parallel.get("vpp") is not None:
        problems.append(
            error_at(
                "rollout.parallel.vpp",
                f"rollouts have no pipeline stages; vpp={parallel['vpp']}",
                "set rollout.parallel.vpp=null",
            )
        )
    if ctx.cfg.rollout.backend == "sglang":
        if (parallel.get("tp") or 1) != 1:
            problems.append(
                error_at(
                    "rollout.parallel.tp",
                    f"the sglang rollout generates with tp=1 only in this version; got tp={parallel['tp']}",
                    "set rollout.parallel.tp=1, or use rollout.backend=vllm for tensor-parallel generation",
                )
            )
        if ctx.cfg.placement.device != "cuda":
            problems.append(
                error_at(
                    "rollout.backend",
                    "the sglang rollout runs on CUDA GPUs only",
                    "set placement.device=cuda, or use rollout.backend=vllm (it has a CPU build) or hf",
                )
            )
    return problems


def check_virtual_pipeline(ctx: Context) -> List[ConfigProblem]:
    problems = []
    for role in _train_roles(ctx):
        parallel = role_parallel(ctx.cfg, role)
        vpp, pp = parallel.get("vpp"), parallel.get("pp") or 1
        if vpp is not None and pp <= 1:
            problems.append(
                error_at(
                    f"{role}.parallel.vpp",
                    f"vpp={vpp} needs pipeline parallelism, but {role}.parallel.pp={pp}",
                    f"set {role}.parallel.pp to 2 or more, or {role}.parallel.vpp=null",
                )
            )
    return problems


def check_sequence_parallel(ctx: Context) -> List[ConfigProblem]:
    """Sequence parallelism is megatron's, and splits sequences over tensor-parallel ranks."""
    problems = []
    for role in [*_train_roles(ctx), "rollout"]:
        parallel = role_parallel(ctx.cfg, role)
        if not parallel.get("sequence_parallel"):
            continue
        key = f"{role}.parallel.sequence_parallel"
        if role == "rollout" or role_backend(ctx.cfg, role) != "megatron":
            backend = role_backend(ctx.cfg, role)
            problems.append(
                error_at(key, f"sequence parallelism is a megatron setting; {role} uses {backend}", f"remove {key}")
            )
        elif (parallel.get("tp") or 1) == 1:
            problems.append(
                error_at(
                    key,
                    "sequence parallelism splits sequences over tensor-parallel ranks, but tp=1",
                    f"set {role}.parallel.tp to 2 or more, or {key}=null",
                )
            )
    return problems


def check_expert_parallel(ctx: Context) -> List[ConfigProblem]:
    """Expert parallelism splits mixture-of-experts layers; the megatron backend converts dense models only."""
    problems = []
    for role in _train_roles(ctx):
        ep = role_parallel(ctx.cfg, role).get("ep") or 1
        if ep > 1:
            problems.append(
                error_at(
                    f"{role}.parallel.ep",
                    f"ep={ep}: expert parallelism splits mixture-of-experts layers, and the megatron backend "
                    "converts dense models (Llama, Qwen2, Qwen3) only, which have none",
                    f"set {role}.parallel.ep=1",
                )
            )
    return problems


# ---------------------------------------------------------------------------------------------
# batch sizes
# ---------------------------------------------------------------------------------------------


def check_rollout_batch(ctx: Context) -> List[ConfigProblem]:
    """Prompts are split over rollout DP replicas before each samples rollout.n responses."""
    batch = ctx.draft.batch
    if batch is None or batch.rollout_dp is None or batch.prompts_per_replica is not None:
        return []
    return [
        error_at(
            "data.train_batch_size",
            f"{batch.prompts} prompts do not split over rollout DP={batch.rollout_dp} "
            f"(prompts go to rollout replicas before each samples n={batch.n})",
            f"use a multiple of {batch.rollout_dp} (e.g. {_nearest_multiples(batch.prompts, batch.rollout_dp)}), "
            "or change rollout.parallel.tp",
        )
    ]


def _mini_key(ctx: Context, role: str) -> str:
    if role == "critic" and value(ctx.cfg, "critic.ppo_mini_batch_size") is None:
        return "critic.ppo_mini_batch_size"  # inherited from the actor; the key to set is still the critic's
    return f"{role}.ppo_mini_batch_size"


def _train_batch_problems(t: TrainBatch, mini_key: str) -> List[ConfigProblem]:
    role, problems = t.role, []
    if t.mini_batches is None:
        problems.append(
            error_at(
                mini_key,
                f"data.train_batch_size={t.prompts} is not a multiple of {mini_key}={t.mini_prompts}",
                f"set {mini_key} to a divisor of {t.prompts} (e.g. {_nearest_divisors(t.prompts, t.mini_prompts)})",
            )
        )
    if t.dp is None:  # the role's layout did not resolve: reported with the placement
        return problems
    if t.per_rank is None:
        problems.append(
            error_at(
                mini_key,
                f"a mini-batch of {t.mini_prompts} prompts x n={t.n} = {t.mini_samples} samples "
                f"does not split over {role} DP={t.dp}",
                f"make {mini_key} x rollout.n a multiple of {t.dp}, or change {role}.parallel",
            )
        )
    elif t.micro_batches is None:
        key = f"{role}.ppo_micro_batch_size_per_device"
        problems.append(
            error_at(
                key,
                f"{t.per_rank} samples per DP rank ({t.mini_samples} samples / DP {t.dp}) "
                f"is not a multiple of {key}={t.micro}",
                f"set {key} to a divisor of {t.per_rank} (e.g. {_nearest_divisors(t.per_rank, t.micro)})",
            )
        )
    return problems


def check_train_batches(ctx: Context) -> List[ConfigProblem]:
    """Actor and critic mini-batches split into DP shards and micro-batches."""
    batch = ctx.draft.batch
    if batch is None:
        return []
    return [p for t in batch.train for p in _train_batch_problems(t, _mini_key(ctx, t.role))]


def check_log_prob_batches(ctx: Context) -> List[ConfigProblem]:
    """Every sample of a step goes through actor, ref and critic forward passes split over their DP."""
    batch = ctx.draft.batch
    if batch is None:
        return []
    return [
        error_at(
            "data.train_batch_size",
            f"{batch.prompts} prompts x n={batch.n} = {p.samples} samples do not split over "
            f"{p.role} DP={p.dp} (its forward pass over the whole step)",
            f"make data.train_batch_size x rollout.n a multiple of {p.dp}, or change {p.role}.parallel",
        )
        for p in batch.log_prob
        if p.per_rank is None
    ]


# ---------------------------------------------------------------------------------------------
# backends
# ---------------------------------------------------------------------------------------------


def check_backends(ctx: Context) -> List[ConfigProblem]:
    from verl.backends import check_backend  # lazy: backends report their problems with verl.config's types

    cfg, roles = ctx.cfg, ctx.draft.roles
    wanted = [
        ("actor.backend", value(cfg, "actor.backend"), "train"),
        ("rollout.backend", value(cfg, "rollout.backend"), "rollout"),
    ]
    # A ref without its own backend runs the actor's, already checked above.
    if "ref" in roles and value(cfg, "ref.backend") is not None:
        wanted.append(("ref.backend", value(cfg, "ref.backend"), "train"))
    if "critic" in roles:
        wanted.append(("critic.backend", value(cfg, "critic.backend"), "train"))
    if value(cfg, "actor.use_fused_kernels"):
        wanted.append(("actor.fused_kernel_impl", value(cfg, "actor.fused_kernel_impl"), "kernels"))
    return [
        p
        for key, name, kind in wanted
        if name is not None
        for p in check_backend(key, name, kind, installed=ctx.installed, strict=ctx.strict)
    ]


# ---------------------------------------------------------------------------------------------
# small enums and ranges
# ---------------------------------------------------------------------------------------------


def check_loggers(ctx: Context) -> List[ConfigProblem]:
    from verl.tracking import LOGGERS  # lazy: the registry the Tracker builds from, one list of logger names

    loggers = value(ctx.cfg, "tracking.loggers") or []
    return [p for i, name in enumerate(loggers) for p in not_one_of(f"tracking.loggers[{i}]", name, tuple(LOGGERS))]


def check_sampling(ctx: Context) -> List[ConfigProblem]:
    problems = []
    for key in ("rollout.temperature", "rollout.val_temperature"):
        t = value(ctx.cfg, key)
        if t is not None and t < 0:
            problems.append(error_at(key, f"must be >= 0, got {t}", f"set {key}=0 (greedy) or a positive value"))
    top_p = value(ctx.cfg, "rollout.top_p")
    if top_p is not None and not 0 < top_p <= 1:
        problems.append(
            error_at(
                "rollout.top_p", f"must be in (0, 1], got {top_p}", "set rollout.top_p=1.0 (off) or a value in (0, 1)"
            )
        )
    return problems


CHECKS: Sequence[Check] = (
    check_missing,
    check_field_rules,
    check_placement,
    check_hybrid_engine,
    check_cuda_here,
    check_controller,
    check_fsdp_layout,
    check_megatron_offload,
    check_rollout_layout,
    check_virtual_pipeline,
    check_sequence_parallel,
    check_expert_parallel,
    check_rollout_batch,
    check_train_batches,
    check_log_prob_batches,
    check_group_size,
    check_values_have_a_critic,
    check_backends,
    check_loggers,
    check_sampling,
    check_registry_names,
    check_policy_loss,
    check_kl_controller,
    check_full_kl,
    check_kl_has_a_reference,
    check_dapo,
)


def validate_and_plan(
    cfg: Any, strict: bool = True, installed: Optional[Mapping[str, Any]] = None
) -> Tuple[Optional[Plan], List[ConfigProblem]]:
    """Every problem with `cfg` (errors and warnings), and its plan when there is no error.

    strict: the run starts here, so missing third-party engines and CUDA are errors (not warnings).
    installed: backends by name (default: those installed in this environment).
    """
    cfg = as_config(cfg)
    problems = plugin_problems(cfg)
    ctx = Context(cfg, strict, installed, draft_plan(cfg))
    problems += [p for check in CHECKS for p in check(ctx)]
    plan = None if errors(problems) else plan_of(cfg, ctx.draft)
    return plan, problems


def validate(cfg: Any, strict: bool = True, installed: Optional[Mapping[str, Any]] = None) -> List[ConfigProblem]:
    """Every problem with `cfg` (a DictConfig from the schema, a VerlConfig or a dict), errors and warnings."""
    return validate_and_plan(cfg, strict, installed)[1]


def errors(problems: Sequence[ConfigProblem]) -> List[ConfigProblem]:
    return [p for p in problems if p.severity == "error"]
