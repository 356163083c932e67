"""Checks a typed config cannot express: layouts that fit the devices, batch sizes that divide, backends,
and algorithm names that exist in the verl.algos registries (after importing trainer.plugins).

`validate` runs every check and returns every problem (errors and warnings), each with its dotted key
and a concrete fix. The arithmetic lives in `verl.config.placement` and `verl.config.plan`; the checks here read its draft.
A field's own rules (`one_of`, `at_least` in the schema) are checked generically.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from verl.config.errors import ConfigError, ConfigProblem
from verl.config.placement import TRAIN_ROLES, as_config, ref_inherits_parallel, role_backend, role_parallel, value
from verl.config.plan import Draft, Plan, TrainBatch, draft_plan, plan_of
from verl.config.schema import VerlConfig

# Keys that name a registry entry (verl.algos), and the registry: "critic." keys only when a critic runs.
REGISTRY_KEYS = (
    ("algorithm.adv_estimator", "ADV_ESTIMATORS"),
    ("actor.policy_loss", "POLICY_LOSSES"),
    ("actor.loss_agg_mode", "AGG_MODES"),
    ("critic.loss_agg_mode", "AGG_MODES"),
    ("algorithm.kl_penalty", "KL_ESTIMATORS"),
    ("actor.kl_loss_type", "KL_ESTIMATORS"),
    ("algorithm.kl_ctrl.type", "KL_CONTROLLERS"),
)


@dataclass(frozen=True)
class Context:
    cfg: DictConfig
    strict: bool
    installed: Optional[Mapping[str, Any]]  # backends by name (verl.backends.BackendSpec)
    draft: Draft


Check = Callable[[Context], List[ConfigProblem]]


def _error(key: str, message: str, fix: str = "") -> ConfigProblem:
    return ConfigProblem(key, message, fix)


def _warning(key: str, message: str, fix: str = "") -> ConfigProblem:
    return ConfigProblem(key, message, fix, severity="warning")


def _one_of(key: str, got: Any, allowed: Sequence[str]) -> List[ConfigProblem]:
    if got in allowed:
        return []
    close = difflib.get_close_matches(str(got), allowed, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return [
        _error(key, f"'{got}' is not one of {', '.join(allowed)}", f"{hint}set {key} to one of {', '.join(allowed)}")
    ]


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
            problems += _one_of(key, v, f.metadata["choices"])
        bound = f.metadata.get("min")
        if bound is not None and isinstance(v, (int, float)) and v < bound:
            problems.append(_error(key, f"must be >= {bound}, got {v}", f"set {key}={bound} or more"))
    return problems


def _section_type(tp: Any) -> Optional[type]:
    """The dataclass of a section field (Optional[...] allowed), else None."""
    if typing.get_origin(tp) is typing.Union:  # Optional[Section]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def check_field_rules(ctx: Context) -> List[ConfigProblem]:
    return _field_rules(VerlConfig, ctx.cfg, "")


def check_missing(ctx: Context) -> List[ConfigProblem]:
    return [
        _error(key, "required value is not set", f"set {key} in the recipe or as an override {key}=...")
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
        _error(
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
        _error(
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
            _error(
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
                _error(
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
                _error(key, "the megatron engine does not offload in this version", f"set {key}=false, or use fsdp")
            )
    return problems


def check_rollout_layout(ctx: Context) -> List[ConfigProblem]:
    """A rollout engine splits over tp (and the derived dp) only."""
    parallel = role_parallel(ctx.cfg, "rollout")
    problems = [
        _error(
            f"rollout.parallel.{axis}",
            f"rollouts support tensor parallelism only; {axis}={parallel[axis]} is not supported",
            f"set rollout.parallel.{axis}=1 (use rollout.parallel.tp to split the model)",
        )
        for axis in _axes_not_one(ctx.cfg, "rollout", ("pp", "cp", "ep"))
    ]
    if parallel.get("vpp") is not None:
        problems.append(
            _error(
                "rollout.parallel.vpp",
                f"rollouts have no pipeline stages; vpp={parallel['vpp']}",
                "set rollout.parallel.vpp=null",
            )
        )
    if ctx.cfg.rollout.backend == "sglang":
        if (parallel.get("tp") or 1) != 1:
            problems.append(
                _error(
                    "rollout.parallel.tp",
                    f"the sglang rollout generates with tp=1 only in this version; got tp={parallel['tp']}",
                    "set rollout.parallel.tp=1, or use rollout.backend=vllm for tensor-parallel generation",
                )
            )
        if ctx.cfg.placement.device != "cuda":
            problems.append(
                _error(
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
                _error(
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
                _error(key, f"sequence parallelism is a megatron setting; {role} uses {backend}", f"remove {key}")
            )
        elif (parallel.get("tp") or 1) == 1:
            problems.append(
                _error(
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
                _error(
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
        _error(
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
            _error(
                mini_key,
                f"data.train_batch_size={t.prompts} is not a multiple of {mini_key}={t.mini_prompts}",
                f"set {mini_key} to a divisor of {t.prompts} (e.g. {_nearest_divisors(t.prompts, t.mini_prompts)})",
            )
        )
    if t.dp is None:  # the role's layout did not resolve: reported with the placement
        return problems
    if t.per_rank is None:
        problems.append(
            _error(
                mini_key,
                f"a mini-batch of {t.mini_prompts} prompts x n={t.n} = {t.mini_samples} samples "
                f"does not split over {role} DP={t.dp}",
                f"make {mini_key} x rollout.n a multiple of {t.dp}, or change {role}.parallel",
            )
        )
    elif t.micro_batches is None:
        key = f"{role}.ppo_micro_batch_size_per_device"
        problems.append(
            _error(
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
        _error(
            "data.train_batch_size",
            f"{batch.prompts} prompts x n={batch.n} = {p.samples} samples do not split over "
            f"{p.role} DP={p.dp} (its forward pass over the whole step)",
            f"make data.train_batch_size x rollout.n a multiple of {p.dp}, or change {p.role}.parallel",
        )
        for p in batch.log_prob
        if p.per_rank is None
    ]


def _estimator_label(spec: Any) -> str:
    if isinstance(spec, Mapping):
        return str(spec.get("_target_", spec))
    return str(spec)


def check_values_have_a_critic(ctx: Context) -> List[ConfigProblem]:
    """An estimator that needs values (gae) cannot run with the critic turned off."""
    from verl.algos import estimator_needs_values

    spec = value(ctx.cfg, "algorithm.adv_estimator")
    try:
        needs = estimator_needs_values(spec)
    except (LookupError, ValueError, TypeError, ConfigError):  # reported by check_registry_names
        return []
    if not needs or "critic" in ctx.draft.roles:
        return []
    return [
        _error(
            "critic.enable",
            f"algorithm.adv_estimator={_estimator_label(spec)} needs values, but the critic is off",
            "set critic.enable=true, or pick an estimator without a critic (e.g. grpo)",
        )
    ]


def check_group_size(ctx: Context) -> List[ConfigProblem]:
    """Estimators with a group baseline (they need the group index) learn nothing from groups of one."""
    from verl.algos import estimator_requires

    spec, n = value(ctx.cfg, "algorithm.adv_estimator"), value(ctx.cfg, "rollout.n")
    if n != 1:
        return []
    try:
        grouped = "index" in estimator_requires(spec)
    except (LookupError, ValueError, TypeError, ConfigError):  # reported by check_registry_names
        return []
    if not grouped:
        return []
    return [
        _warning(
            "rollout.n",
            f"rollout.n=1 with algorithm.adv_estimator={_estimator_label(spec)}: groups of one sample give zero advantages",
            "set rollout.n to 2 or more (e.g. 8)",
        )
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
    return [p for i, name in enumerate(loggers) for p in _one_of(f"tracking.loggers[{i}]", name, tuple(LOGGERS))]


def check_sampling(ctx: Context) -> List[ConfigProblem]:
    problems = []
    for key in ("rollout.temperature", "rollout.val_temperature"):
        t = value(ctx.cfg, key)
        if t is not None and t < 0:
            problems.append(_error(key, f"must be >= 0, got {t}", f"set {key}=0 (greedy) or a positive value"))
    top_p = value(ctx.cfg, "rollout.top_p")
    if top_p is not None and not 0 < top_p <= 1:
        problems.append(
            _error(
                "rollout.top_p", f"must be in (0, 1], got {top_p}", "set rollout.top_p=1.0 (off) or a value in (0, 1)"
            )
        )
    return problems


# ---------------------------------------------------------------------------------------------
# algorithms (verl.algos registries)
# ---------------------------------------------------------------------------------------------


def _registered(key: str, spec: Any, registry: Any) -> List[ConfigProblem]:
    """A registry entry by name, or a {_target_: ...} mapping whose target imports."""
    if isinstance(spec, str):
        if spec in registry:
            return []
        names = registry.names()
        close = difflib.get_close_matches(spec, names, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return [
            _error(
                key,
                f"'{spec}' is not a registered {registry.kind} (registered: {', '.join(names)})",
                f"{hint}set {key} to one of them, register yours in a module listed in trainer.plugins, "
                f"or give {{_target_: pkg.module.fn}}",
            )
        ]
    if isinstance(spec, Mapping):
        if "_target_" not in spec:
            return [
                _error(
                    key,
                    f"a mapping here needs '_target_', got keys {list(spec)}",
                    f"write {key}: {{_target_: pkg.module.fn}}",
                )
            ]
        try:
            registry.get(spec, key=key)
        except ConfigError as e:
            return list(e.problems)
        return []
    return [
        _error(
            key,
            f"expected a registered {registry.kind} name or a {{_target_: ...}} mapping, got {type(spec).__name__} {spec!r}",
            f"set {key} to one of {', '.join(registry.names())}",
        )
    ]


def check_registry_names(ctx: Context) -> List[ConfigProblem]:
    from verl import algos  # lazy: torch only once the algorithm keys are checked

    problems = []
    for key, registry_name in REGISTRY_KEYS:
        if key.startswith("critic.") and "critic" not in ctx.draft.roles:
            continue
        problems += _registered(key, value(ctx.cfg, key), getattr(algos, registry_name))
    return problems


def check_policy_loss(ctx: Context) -> List[ConfigProblem]:
    cfg, problems = ctx.cfg, []
    clip = value(cfg, "actor.clip_ratio")
    low = value(cfg, "actor.clip_ratio_low")
    high = value(cfg, "actor.clip_ratio_high")
    low_key = "actor.clip_ratio_low" if low is not None else "actor.clip_ratio"
    high_key = "actor.clip_ratio_high" if high is not None else "actor.clip_ratio"
    low, high = (clip if low is None else low), (clip if high is None else high)
    if low is not None and not 0 <= low < 1:
        problems.append(
            _error(low_key, f"the lower clip must be in [0, 1) (ratios clip to 1 - {low})", f"set {low_key}=0.2")
        )
    if high is not None and high < 0:
        problems.append(
            _error(high_key, f"the upper clip must be >= 0, got {high}", f"set {high_key}=0.2 (DAPO clip-higher: 0.28)")
        )
    c = value(cfg, "actor.clip_ratio_c")
    if c is not None and c <= 1:
        problems.append(
            _error("actor.clip_ratio_c", f"the dual-clip bound must be > 1, got {c}", "set actor.clip_ratio_c=3.0")
        )
    cap = value(cfg, "actor.tis_imp_ratio_cap")
    if cap is not None and cap <= 0:
        problems.append(
            _error(
                "actor.tis_imp_ratio_cap",
                f"must be > 0, got {cap}",
                "set it to e.g. 2.0, or null to turn truncated IS off",
            )
        )
    norm = value(cfg, "actor.loss_norm_length")
    if norm is not None and norm < 1:
        problems.append(
            _error("actor.loss_norm_length", f"must be >= 1, got {norm}", "set it to data.max_response_length, or null")
        )
    mode = value(cfg, "actor.loss_agg_mode")
    if value(cfg, "actor.policy_loss") == "gspo" and isinstance(mode, str) and mode != "seq-mean-token-mean":
        problems.append(
            _warning(
                "actor.loss_agg_mode",
                f"policy_loss=gspo with loss_agg_mode={mode}: GSPO's objective is a mean over sequences of per-sequence "
                "losses, which only seq-mean-token-mean gives",
                "set actor.loss_agg_mode=seq-mean-token-mean",
            )
        )
    return problems


def check_kl_controller(ctx: Context) -> List[ConfigProblem]:
    if value(ctx.cfg, "algorithm.kl_ctrl.type") != "adaptive":
        return []
    problems = []
    for key in ("algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon"):
        v = value(ctx.cfg, key)
        if v is not None and v <= 0:
            problems.append(
                _error(key, f"the adaptive KL controller needs a positive value, got {v}", f"set {key} > 0")
            )
    return problems


def check_full_kl(ctx: Context) -> List[ConfigProblem]:
    """The `full` KL estimator needs full-vocabulary log-probs; the trainer passes per-token ones."""
    problems = []
    for key, used in (
        ("algorithm.kl_penalty", "algorithm.use_kl_in_reward"),
        ("actor.kl_loss_type", "actor.use_kl_loss"),
    ):
        if value(ctx.cfg, used) and value(ctx.cfg, key) == "full":
            problems.append(
                _error(
                    key,
                    "'full' needs the full-vocabulary distributions, which a training run does not keep",
                    f"set {key} to low_var_kl (k3), k1, abs or mse",
                )
            )
    return problems


def check_dapo(ctx: Context) -> List[ConfigProblem]:
    cfg, problems = ctx.cfg, []
    if value(cfg, "algorithm.overlong_buffer.enable"):
        buffer, max_len = value(cfg, "algorithm.overlong_buffer.len"), value(cfg, "data.max_response_length")
        if buffer is not None and isinstance(max_len, int) and not 1 <= buffer <= max_len:
            problems.append(
                _error(
                    "algorithm.overlong_buffer.len",
                    f"must be in [1, data.max_response_length={max_len}], got {buffer}",
                    f"set it to a fraction of the response length, e.g. {max(1, max_len // 4)}",
                )
            )
        factor = value(cfg, "algorithm.overlong_buffer.penalty_factor")
        if factor is not None and factor < 0:
            problems.append(
                _error("algorithm.overlong_buffer.penalty_factor", f"must be >= 0, got {factor}", "set it to 1.0")
            )
    if value(cfg, "algorithm.filter_groups.enable"):
        if value(cfg, "rollout.n") == 1:
            problems.append(
                _error(
                    "algorithm.filter_groups.enable",
                    "dynamic sampling with rollout.n=1 drops every group (a group of one has no score spread)",
                    "set rollout.n to 2 or more, or algorithm.filter_groups.enable=false",
                )
            )
        tries = value(cfg, "algorithm.filter_groups.max_num_gen_batches")
        if tries is not None and tries < 0:
            problems.append(
                _error(
                    "algorithm.filter_groups.max_num_gen_batches",
                    f"must be >= 0 (0: no limit), got {tries}",
                    "set it to 0 or more",
                )
            )
    return problems


def _load_plugins(cfg: DictConfig) -> List[ConfigProblem]:
    """Import trainer.plugins first: their registrations must exist before any name is looked up."""
    from verl.algos import load_plugins

    plugins = value(cfg, "trainer.plugins") or []
    try:
        load_plugins(list(plugins))
    except ConfigError as e:
        return list(e.problems)
    return []


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
    problems = _load_plugins(cfg)
    ctx = Context(cfg, strict, installed, draft_plan(cfg))
    problems += [p for check in CHECKS for p in check(ctx)]
    plan = None if errors(problems) else plan_of(cfg, ctx.draft)
    return plan, problems


def validate(cfg: Any, strict: bool = True, installed: Optional[Mapping[str, Any]] = None) -> List[ConfigProblem]:
    """Every problem with `cfg` (a DictConfig from the schema, a VerlConfig or a dict), errors and warnings."""
    return validate_and_plan(cfg, strict, installed)[1]


def errors(problems: Sequence[ConfigProblem]) -> List[ConfigProblem]:
    return [p for p in problems if p.severity == "error"]
