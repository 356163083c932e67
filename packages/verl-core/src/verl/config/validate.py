"""Checks a typed config cannot express: layouts that fit the devices, batch sizes that divide, backends
(and, in `algorithm_checks`, the algorithm keys).

`validate_and_plan` runs every check and returns every problem (errors and warnings), each with its dotted
key and a concrete fix, and the plan when there is no error. The arithmetic lives in `verl.config.placement`
and `verl.config.plan`; the checks read its draft. A field's own rules (`one_of`, `at_least`, `checked` in
the schema) are checked generically.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl.config.agent_checks import check_agent
from verl.config.algorithm_checks import (
    check_dapo,
    check_full_kl,
    check_group_size,
    check_kl_has_a_reference,
    check_policy_loss,
    check_preference,
    check_registry_names,
    check_reward,
    check_sft,
    check_values_have_a_critic,
    plugin_problems,
)
from verl.config.checks import Check, Context, error_at, not_one_of, warning_at
from verl.config.errors import ConfigProblem, errors
from verl.config.placement import TRAIN_ROLES, as_config, ref_inherits_parallel, role_backend, role_parallel, value
from verl.config.placement import estimator_inputs as _estimator_inputs
from verl.config.plan import PASS_TOKEN_KEYS, TRAIN_TOKEN_KEYS, Plan, TrainBatch, draft_plan, lora_rank
from verl.config.schema import VerlConfig, field_types, is_section, strip_optional


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


def _train_parallels(ctx: Context) -> List[Tuple[str, Optional[str], Dict[str, Any]]]:
    """(role, backend, parallel sizes) of the enabled training roles with their own settings (a ref that
    inherits everything repeats the actor's problems)."""
    cfg = ctx.cfg
    return [
        (r, role_backend(cfg, r), role_parallel(cfg, r))
        for r in TRAIN_ROLES
        if r in ctx.draft.roles
        and not (r == "ref" and value(cfg, "ref.backend") is None and ref_inherits_parallel(cfg))
    ]


def _not_finite(v: Any) -> bool:
    """A float (or a list holding one) that is NaN or infinite."""
    items = list(v) if OmegaConf.is_list(v) or isinstance(v, (list, tuple)) else [v]
    return any(isinstance(x, float) and not math.isfinite(x) for x in items)


def _field_rules(schema: type, node: Any, prefix: str, skip: Sequence[str] = ()) -> List[ConfigProblem]:
    """The `one_of` / `checked` metadata of every field of `schema` (a section), checked against `node`."""
    problems = []
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        if f.name in skip or OmegaConf.is_missing(node, f.name):
            continue  # missing: reported by check_missing
        v, tp = node[f.name], strip_optional(field_types(schema)[f.name])
        if is_section(tp):
            problems += _field_rules(tp, v, key + ".") if v is not None else []
            continue
        if "choices" in f.metadata and v is not None:
            problems += not_one_of(key, v, f.metadata["choices"])
        if _not_finite(v):  # NaN passes every comparison's negation, so it is refused before the field's rule
            problems.append(error_at(key, f"must be a finite number, got {v}", f"set {key} to a finite value"))
            continue
        ok, message, fix = f.metadata.get("check", (None, "", ""))
        if ok is not None and v is not None and not ok(v):
            problems.append(error_at(key, message.format(key=key, v=v), fix.format(key=key, v=v)))
    return problems


def check_field_rules(ctx: Context) -> List[ConfigProblem]:
    """Every section's field rules; a ref or critic that does not run is not checked."""
    return _field_rules(VerlConfig, ctx.cfg, "", skip=[r for r in ("ref", "critic") if r not in ctx.draft.roles])


def check_missing(ctx: Context) -> List[ConfigProblem]:
    return [
        error_at(key, "required value is not set", f"set {key} in the recipe or as an override {key}=...")
        for key in sorted(OmegaConf.missing_keys(ctx.cfg))
    ]


def check_placement(ctx: Context) -> List[ConfigProblem]:
    """Pools, their devices and the roles in them (computed by verl.config.placement)."""
    return list(ctx.draft.problems)


def check_hybrid_engine(ctx: Context) -> List[ConfigProblem]:
    """The actor and its reference share one pool (the reference computes on the actor's slice of each batch).
    The rollout shares it too (the hybrid engine) or has a pool of its own (disaggregated), which needs Ray
    workers, a rollout that receives full weights, and lets generation overlap training (trainer.mode)."""
    pools = dict(ctx.draft.role_pool)
    problems = []
    if "ref" in pools and "actor" in pools and pools["ref"] != pools["actor"]:
        problems.append(
            error_at(
                "placement.pools",
                f"the reference must share the actor's pool; got actor in '{pools['actor']}', ref in '{pools['ref']}'",
                "list ref in the actor's placement.pools entry",
            )
        )
    apart = "rollout" in pools and "actor" in pools and pools["rollout"] != pools["actor"]
    mode = value(ctx.cfg, "trainer.mode")
    if apart and value(ctx.cfg, "trainer.controller") == "local":
        problems.append(
            error_at(
                "trainer.controller",
                f"the rollout has a pool of its own ('{pools['rollout']}'), whose workers run beside the actor's as "
                "Ray actors; the local controller runs every worker in this one process",
                "set trainer.controller=auto (or ray), or list rollout in the actor's pool",
            )
        )
    if apart and value(ctx.cfg, "rollout.lora_sync") == "adapter" and lora_rank(ctx.cfg, "actor") >= 1:
        problems.append(
            error_at(
                "rollout.lora_sync",
                "adapter: a rollout on a pool of its own receives full (merged) weights over the transfer group",
                "set rollout.lora_sync=merged, or list rollout in the actor's pool",
            )
        )
    if mode in OVERLAP_MODES and not apart and "rollout" in pools:
        problems.append(
            error_at(
                "trainer.mode",
                f"{mode} generates the next batch while the actor trains, which needs the rollout on devices of its "
                f"own; here it shares pool '{pools['rollout']}' with the actor",
                "give the rollout a pool of its own, e.g. placement.pools=[{name: train, roles: [actor], devices: 1}, "
                "{name: gen, roles: [rollout]}] with placement.devices_per_node=2, or set trainer.mode=sync",
            )
        )
    if mode == "async":
        problems += _async_problems(ctx)
    elif value(ctx.cfg, "rollout.on_replica_failure") == "continue":
        problems.append(
            error_at(
                "rollout.on_replica_failure",
                f"continue drops a failed replica of the rollout service, which trainer.mode={mode} does not run "
                "(a failed rollout rank stops it, named)",
                "set trainer.mode=async, or rollout.on_replica_failure=stop",
            )
        )
    if mode in OVERLAP_MODES and apart and value(ctx.cfg, "actor.tis_imp_ratio_cap") is None:
        problems.append(
            warning_at(
                "actor.tis_imp_ratio_cap",
                f"{mode} trains on samples of an older policy than the actor's, uncorrected",
                "set actor.tis_imp_ratio_cap=2.0: each token weighted by min(pi_old / pi_rollout, 2), the decoupled "
                "PPO objective (recipes/grpo_tiny_async.yaml: +45.0 points with it, +17.5 without, at staleness 2)",
            )
        )
    return problems


def _async_problems(ctx: Context) -> List[ConfigProblem]:
    """What the rollout service does not serve yet."""
    cfg, problems = ctx.cfg, []
    tp = value(cfg, "rollout.parallel.tp") or 1
    if tp > 1:
        problems.append(
            error_at(
                "rollout.parallel.tp",
                f"trainer.mode=async serves requests on tp=1 replicas; got tp={tp}",
                "set rollout.parallel.tp=1 (each rollout rank a replica), or trainer.mode=one_step_off",
            )
        )
    if value(cfg, "algorithm.filter_groups.enable"):
        problems.append(
            error_at(
                "algorithm.filter_groups.enable",
                "dynamic sampling generates extra batches on demand; trainer.mode=async generates ahead",
                "set trainer.mode=one_step_off, or algorithm.filter_groups.enable=false",
            )
        )
    if "reward_baselines" in _estimator_inputs(cfg):
        problems.append(
            error_at(
                "algorithm.adv_estimator",
                f"{value(cfg, 'algorithm.adv_estimator')} needs a greedy baseline per prompt, which "
                "trainer.mode=async does not generate",
                "set trainer.mode=one_step_off, or another estimator (grpo, rloo)",
            )
        )
    return problems


OVERLAP_MODES = ("one_step_off", "async")  # trainer.mode values where generation runs beside training


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
    nnodes = value(ctx.cfg, "placement.nnodes")
    if value(ctx.cfg, "trainer.controller") != "local" or not isinstance(nnodes, int) or nnodes <= 1:
        return []
    return [
        error_at(
            "trainer.controller",
            f"the local controller runs workers in this process and cannot span placement.nnodes={nnodes} nodes",
            "set trainer.controller=ray, or placement.nnodes=1",
        )
    ]


def _not_one(parallel: Dict[str, Any], axes: Sequence[str]) -> List[str]:
    return [a for a in axes if (parallel.get(a) or 1) != 1]


def check_fsdp_layout(ctx: Context) -> List[ConfigProblem]:
    """FSDP shards over data parallel ranks only."""
    return [
        error_at(
            f"{role}.parallel.{axis}",
            f"backend fsdp is data parallel only; {axis}={parallel[axis]} is not supported",
            f"set {role}.backend=megatron for {axis} > 1, or {role}.parallel.{axis}=1",
        )
        for role, backend, parallel in _train_parallels(ctx)
        if backend == "fsdp"
        for axis in _not_one(parallel, ("tp", "pp", "cp"))  # ep: check_expert_parallel
    ]


def check_attention(ctx: Context) -> List[ConfigProblem]:
    """flash-attention kernels run on CUDA only."""
    attn = value(ctx.cfg, "model.attn_implementation")
    if isinstance(attn, str) and attn.startswith("flash_attention") and ctx.draft.plan.device == "cpu":
        return [
            error_at(
                "model.attn_implementation",
                f"{attn} runs on CUDA devices only; this run's placement.device is cpu",
                "set model.attn_implementation=sdpa (packed rows take its 4D mask), or place the run on GPUs",
            )
        ]
    return []


OFFLOAD_KEYS = (
    "actor.param_offload",
    "actor.optimizer_offload",
    "ref.param_offload",
    "critic.param_offload",
    "critic.optimizer_offload",
)


def check_offload(ctx: Context) -> List[ConfigProblem]:
    """Offload frees device memory; a CPU run has none to free (it works, copying within host memory)."""
    if ctx.draft.plan.device != "cpu":
        return []
    return [
        warning_at(
            key,
            "offload moves tensors from the device to host memory; on a CPU run it only copies them within host "
            "memory each step",
            f"set {key}=false on CPU (keep it for GPU runs)",
        )
        for key in OFFLOAD_KEYS
        if key.split(".")[0] in ctx.draft.roles and value(ctx.cfg, key)
    ]


def check_rollout_layout(ctx: Context) -> List[ConfigProblem]:
    """A rollout engine splits over tp (and the derived dp) only."""
    parallel = role_parallel(ctx.cfg, "rollout")
    problems = [
        error_at(
            f"rollout.parallel.{axis}",
            f"rollouts support tensor parallelism only; {axis}={parallel[axis]} is not supported",
            f"set rollout.parallel.{axis}=1 (use rollout.parallel.tp to split the model)",
        )
        for axis in _not_one(parallel, ("pp", "cp", "ep"))
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
    return [
        error_at(
            f"{role}.parallel.vpp",
            f"vpp={parallel['vpp']} needs pipeline parallelism, but {role}.parallel.pp={parallel.get('pp') or 1}",
            f"set {role}.parallel.pp to 2 or more, or {role}.parallel.vpp=null",
        )
        for role, _, parallel in _train_parallels(ctx)
        if parallel.get("vpp") is not None and (parallel.get("pp") or 1) <= 1
    ]


def check_sequence_parallel(ctx: Context) -> List[ConfigProblem]:
    """Sequence parallelism is megatron's, and splits sequences over tensor-parallel ranks."""
    problems = []
    rollout = ("rollout", role_backend(ctx.cfg, "rollout"), role_parallel(ctx.cfg, "rollout"))
    for role, backend, parallel in [*_train_parallels(ctx), rollout]:
        if not parallel.get("sequence_parallel"):
            continue
        key = f"{role}.parallel.sequence_parallel"
        if role == "rollout" or backend != "megatron":
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
    return [
        error_at(
            f"{role}.parallel.ep",
            f"ep={parallel['ep']}: expert parallelism splits mixture-of-experts layers, and the megatron backend "
            "converts dense models (Llama, Qwen2, Qwen3) only, which have none",
            f"set {role}.parallel.ep=1",
        )
        for role, _, parallel in _train_parallels(ctx)
        if (parallel.get("ep") or 1) > 1
    ]


def check_rollout_batch(ctx: Context) -> List[ConfigProblem]:
    """Prompts are split over rollout DP replicas before each samples rollout.n responses."""
    batch = ctx.draft.plan.batch
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


def _mini_batch_problem(role: str, prompts: int, mini: int) -> ConfigProblem:
    # A critic that inherits the actor's mini-batch size is still told to set its own key.
    key = f"{role}.ppo_mini_batch_size"
    return error_at(
        key,
        f"data.train_batch_size={prompts} is not a multiple of {key}={mini}",
        f"set {key} to a divisor of {prompts} (e.g. {_nearest_divisors(prompts, mini)})",
    )


def _train_batch_problems(t: TrainBatch) -> List[ConfigProblem]:
    role, problems, mini_key = t.role, [], f"{t.role}.ppo_mini_batch_size"
    if t.mini_batches is None:
        problems.append(_mini_batch_problem(role, t.prompts, t.mini_prompts))
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
    elif t.max_tokens is None and t.micro_batches is None:
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
    batch = ctx.draft.plan.batch
    if batch is None:  # rollout.n is bad (reported with its field): the mini-batches, in prompts, still divide or not
        return _mini_batches_without_n(ctx)
    return [p for t in batch.train for p in _train_batch_problems(t)]


def _mini_batches_without_n(ctx: Context) -> List[ConfigProblem]:
    prompts = value(ctx.cfg, "data.train_batch_size")
    if not isinstance(prompts, int) or prompts < 1:
        return []
    minis = {  # the critic's defaults to the actor's
        role: value(ctx.cfg, f"{role}.ppo_mini_batch_size") or value(ctx.cfg, "actor.ppo_mini_batch_size")
        for role in ("actor", "critic")
        if role in ctx.draft.roles
    }
    return [
        _mini_batch_problem(role, prompts, mini)
        for role, mini in minis.items()
        if isinstance(mini, int) and mini >= 1 and prompts % mini
    ]


def check_log_prob_batches(ctx: Context) -> List[ConfigProblem]:
    """Every sample of a step goes through actor, ref and critic forward passes split over their DP."""
    plan, batch = ctx.draft.plan, ctx.draft.plan.batch
    if batch is None:
        return []
    return [
        error_at(
            "data.train_batch_size",
            f"{batch.prompts} prompts x n={batch.n} = {batch.samples} samples do not split over "
            f"{r.name} DP={r.layout.dp} (its forward pass over the whole step)",
            f"make data.train_batch_size x rollout.n a multiple of {r.layout.dp}, or change {r.name}.parallel",
        )
        for r in plan.log_prob_passes
        if batch.per_rank(r.layout.dp) is None
    ]


def check_token_budgets(ctx: Context) -> List[ConfigProblem]:
    """A token budget holds at least one whole row."""
    cfg, problems = ctx.cfg, []
    row = (ctx.draft.plan.prompt_length or 0) + (ctx.draft.plan.response_length or 0)  # (as the plan resolves them)
    roles = {r.name for r in ctx.draft.plan.role_plans}
    keys = [(role, key) for role, key in PASS_TOKEN_KEYS.items()]
    keys += [(role, key) for role, key in TRAIN_TOKEN_KEYS.items() if key not in PASS_TOKEN_KEYS.values()]
    for role, key in keys:
        budget = value(cfg, key)
        if role not in roles or not isinstance(budget, int) or budget < 1:
            continue
        if budget < row:
            problems.append(
                error_at(
                    key,
                    f"{budget} tokens hold no whole row: a row has up to {row} (data.max_prompt_length + the "
                    "response length)",
                    f"set {key} to at least {row}",
                )
            )
    return problems


ADAPTER_ROLLOUTS = ("vllm",)  # rollout engines that load LoRA adapters themselves (rollout.lora_sync: adapter)


def check_lora(ctx: Context) -> List[ConfigProblem]:
    """LoRA runs on the fsdp engine; a LoRA actor's reference is the actor itself, adapters off, so it must sit
    where the actor is, with the actor's backend and layout."""
    cfg, problems = ctx.cfg, []
    roles = {r.name: r for r in ctx.draft.plan.role_plans}
    for role in ("actor", "critic"):
        if role in roles and lora_rank(cfg, role) >= 1 and roles[role].backend != "fsdp":
            problems.append(
                error_at(
                    f"{role}.lora.rank",
                    f"LoRA is an fsdp engine feature; {role} runs on {roles[role].backend} (its column/row-parallel "
                    "linears take no peft adapters here)",
                    f"set {role}.backend=fsdp, or {role}.lora.rank=0 (full training)",
                )
            )
    if value(cfg, "rollout.lora_sync") == "adapter" and "rollout" in roles:
        if lora_rank(cfg, "actor") < 1:
            problems.append(
                error_at(
                    "rollout.lora_sync",
                    "adapter: the rollout loads the actor's LoRA adapters, but the actor trains in full",
                    "set actor.lora.rank (e.g. 16), or rollout.lora_sync=merged",
                )
            )
        elif roles["rollout"].backend not in ADAPTER_ROLLOUTS:
            problems.append(
                error_at(
                    "rollout.lora_sync",
                    f"adapter: the {roles['rollout'].backend} rollout loads no LoRA adapters (the vllm one does)",
                    "set rollout.lora_sync=merged, or rollout.backend=vllm",
                )
            )
    if not ctx.draft.plan.ref_from_actor or "ref" not in roles or "actor" not in roles:
        return problems
    ref, actor = roles["ref"], roles["actor"]
    if ref.layout.pool != actor.layout.pool or ref.backend != actor.backend or value(cfg, "ref.parallel") is not None:
        problems.append(
            error_at(
                "ref",
                "with actor.lora the reference is the actor's own model with its adapters off, so it runs where "
                f"the actor runs (pool '{actor.layout.pool}', backend {actor.backend}, the actor's layout)",
                "place ref in the actor's pool and leave ref.backend and ref.parallel unset",
            )
        )
    return problems


def check_backends(ctx: Context) -> List[ConfigProblem]:
    from verl.backends import check_backend  # lazy: backends report their problems with verl.config's types

    cfg, roles = ctx.cfg, ctx.draft.roles
    wanted = (  # (key, backend kind, whether the run uses it); a ref without its own backend runs the actor's
        ("actor.backend", "train", True),
        ("rollout.backend", "rollout", "rollout" in roles),  # (an SFT run has none)
        ("ref.backend", "train", "ref" in roles),
        ("critic.backend", "train", "critic" in roles),
        ("actor.fused_kernel_impl", "kernels", value(cfg, "actor.use_fused_kernels")),
    )
    return [
        p
        for key, kind, used in wanted
        if used and value(cfg, key) is not None
        for p in check_backend(key, value(cfg, key), kind, installed=ctx.installed, strict=ctx.strict)
    ]


def check_loggers(ctx: Context) -> List[ConfigProblem]:
    from verl.tracking import LOGGERS  # lazy: the registry the Tracker builds from, one list of logger names

    loggers = value(ctx.cfg, "tracking.loggers") or []
    return [p for i, name in enumerate(loggers) for p in not_one_of(f"tracking.loggers[{i}]", name, tuple(LOGGERS))]


def check_reward_feedback(ctx: Context) -> List[ConfigProblem]:
    """reward.server.feedback=preferences compares the samples of one prompt group: groups of two or more, and no
    validation (one sample per held-out prompt: nothing to compare, so its scores would never come)."""
    cfg = ctx.cfg
    if value(cfg, "reward.server.feedback") != "preferences":
        return []
    label = "reward.server.feedback=preferences compares the samples of a prompt group"
    problems = []
    n = value(cfg, "rollout.n")
    if isinstance(n, int) and n < 2:
        problems.append(error_at("rollout.n", f"{label}; got groups of {n}", "set rollout.n=2 or more"))
    if value(cfg, "data.val_files"):
        problems.append(
            error_at(
                "data.val_files",
                f"{label}, and validation generates one sample per prompt",
                "set data.val_files=[] (or reward.server.feedback=scores)",
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
    check_attention,
    check_offload,
    check_rollout_layout,
    check_virtual_pipeline,
    check_sequence_parallel,
    check_expert_parallel,
    check_rollout_batch,
    check_train_batches,
    check_log_prob_batches,
    check_token_budgets,
    check_lora,
    check_group_size,
    check_values_have_a_critic,
    check_backends,
    check_loggers,
    check_registry_names,
    check_policy_loss,
    check_full_kl,
    check_kl_has_a_reference,
    check_dapo,
    check_reward,
    check_reward_feedback,
    check_preference,
    check_sft,
    check_agent,
)


def _unresolved(node: Any, prefix: str = "") -> List[ConfigProblem]:
    """An interpolation (`${...}`) that does not resolve, at each key that has one."""
    problems: List[ConfigProblem] = []
    keys = range(len(node)) if OmegaConf.is_list(node) else list(node.keys())
    for k in keys:
        key = f"{prefix}[{k}]" if OmegaConf.is_list(node) else f"{prefix}{'.' if prefix else ''}{k}"
        if OmegaConf.is_missing(node, k):  # `???`: check_missing names it
            continue
        try:
            v = node[k]
        except OmegaConfBaseException as e:
            reason = str(e).splitlines()[0]
            problems.append(error_at(key, f"does not resolve: {reason}", "fix the ${...} reference or give a value"))
            continue
        if OmegaConf.is_config(v):
            problems += _unresolved(v, key)
    return problems


def validate_and_plan(
    cfg: Any, strict: bool = True, installed: Optional[Mapping[str, Any]] = None
) -> Tuple[Optional[Plan], List[ConfigProblem]]:
    """Every problem with `cfg` (errors and warnings), and its plan when there is no error.

    strict: the run starts here, so missing third-party engines and CUDA are errors (not warnings).
    installed: backends by name (default: those installed in this environment).
    """
    cfg = as_config(cfg)
    unresolved = _unresolved(cfg)
    if unresolved:  # every check reads values: they would fail on these
        return None, unresolved
    problems = plugin_problems(cfg)
    ctx = Context(cfg, strict, installed, draft_plan(cfg))
    problems += [p for check in CHECKS for p in check(ctx)]
    return (None if errors(problems) else ctx.draft.plan), problems


def validate(cfg: Any, strict: bool = True, installed: Optional[Mapping[str, Any]] = None) -> List[ConfigProblem]:
    """Every problem with `cfg` (a DictConfig from the schema, a VerlConfig or a dict), errors and warnings."""
    return validate_and_plan(cfg, strict, installed)[1]
