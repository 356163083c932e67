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
from typing import Any, List, Mapping, Optional, Sequence, Tuple

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
from verl.config.batch_checks import (
    check_log_prob_batches,
    check_rollout_batch,
    check_token_budgets,
    check_train_batches,
)
from verl.config.checks import Check, Context, error_at, not_one_of
from verl.config.errors import ConfigProblem, errors
from verl.config.layout_checks import (
    check_attention,
    check_controller,
    check_cuda_here,
    check_expert_parallel,
    check_fsdp_layout,
    check_hybrid_engine,
    check_offload,
    check_placement,
    check_rollout_layout,
    check_sequence_parallel,
    check_virtual_pipeline,
)
from verl.config.placement import as_config, value
from verl.config.plan import Plan, draft_plan, lora_rank
from verl.config.schema import VerlConfig, field_types, is_section, strip_optional
from verl.config.vision_checks import check_vision_model


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
    wanted: Tuple[
        Tuple[str, Any, Any], ...
    ] = (  # (key, backend kind, whether the run uses it); a ref without its own backend runs the actor's
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


def check_stopping(ctx: Context) -> List[ConfigProblem]:
    """trainer.stop_when: one bound, a validation metric, and validation to read it; a warm start that stops at an
    exact-match share needs held-out files to measure it on."""
    cfg, problems = ctx.cfg, []
    if value(cfg, "trainer.stop_when") is not None:
        bounds = [k for k in ("at_least", "at_most") if value(cfg, f"trainer.stop_when.{k}") is not None]
        if len(bounds) != 1:
            message = f"needs one bound, got {len(bounds)} ({', '.join(bounds) or 'none'})"
            fix = "set trainer.stop_when.at_least (a metric that rises) or trainer.stop_when.at_most (one that falls)"
            problems.append(error_at("trainer.stop_when", message, fix))
        metric = value(cfg, "trainer.stop_when.metric")
        if isinstance(metric, str) and not metric.startswith("val/"):
            fix = "name a validation metric, e.g. val/accuracy (RL), val/exact_match or val/loss (SFT)"
            problems.append(error_at("trainer.stop_when.metric", f"{metric!r} is not a validation metric", fix))
        if not value(cfg, "data.val_files") or not value(cfg, "trainer.val_every"):
            message = "is read when the run validates, and this run validates only at its end"
            fix = "set data.val_files and trainer.val_every (steps between validations)"
            problems.append(error_at("trainer.stop_when", message, fix))
    ws = "model.warm_start"
    if value(cfg, ws) is not None and value(cfg, f"{ws}.until_exact_match") is not None:
        if not value(cfg, f"{ws}.val_files"):
            message = "is measured on held-out prompt/response files, and none are given"
            fix = f"set {ws}.val_files (e.g. [embedded:arithmetic-sft-val]), or remove until_exact_match"
            problems.append(error_at(f"{ws}.until_exact_match", message, fix))
    return problems


def check_validation_samples(ctx: Context) -> List[ConfigProblem]:
    """rollout.val_n samples must be drawn at a temperature above 0 (at 0 every one is the greedy answer)."""
    n, t = value(ctx.cfg, "rollout.val_n"), value(ctx.cfg, "rollout.val_sample_temperature")
    if isinstance(n, int) and n > 0 and t == 0:
        message = f"is 0, so the {n} samples of rollout.val_n per held-out prompt would all be the greedy answer"
        return [error_at("rollout.val_sample_temperature", message, "set it above 0 (e.g. 1.0 or 0.6)")]
    return []


CHECKS: Sequence[Check] = (
    check_missing,
    check_field_rules,
    check_placement,
    check_hybrid_engine,
    check_cuda_here,
    check_controller,
    check_fsdp_layout,
    check_vision_model,
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
    check_stopping,
    check_validation_samples,
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
