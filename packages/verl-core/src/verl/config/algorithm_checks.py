"""Config checks of the algorithm keys: registry names (verl.algos, after importing trainer.plugins), the
estimator's needs (values, groups) and the ranges of the policy-loss, KL and DAPO settings."""

from __future__ import annotations

import difflib
from typing import Any, List, Mapping

from omegaconf import DictConfig

from verl.config.checks import Context, error_at, warning_at
from verl.config.errors import ConfigError, ConfigProblem
from verl.config.placement import estimator_inputs, value
from verl.config.schema import PREFERENCE_ALGORITHMS

# Keys that name a registry entry (verl.algos), and the registry: "critic." keys only when a critic runs.
REGISTRY_KEYS = (
    ("algorithm.adv_estimator", "ADV_ESTIMATORS"),
    ("actor.policy_loss", "POLICY_LOSSES"),
    ("actor.loss_agg_mode", "AGG_MODES"),
    ("critic.loss_agg_mode", "AGG_MODES"),
    ("algorithm.kl_penalty", "KL_ESTIMATORS"),
    ("actor.kl_loss_type", "KL_ESTIMATORS"),
    ("algorithm.kl_ctrl.type", "KL_CONTROLLERS"),
    ("algorithm.dpo.loss", "DPO_LOSSES"),
)


def _estimator_label(cfg: DictConfig) -> str:
    spec = value(cfg, "algorithm.adv_estimator")
    return str(spec.get("_target_", spec) if isinstance(spec, Mapping) else spec)


def check_values_have_a_critic(ctx: Context) -> List[ConfigProblem]:
    """An estimator that needs values (gae) cannot run with the critic turned off."""
    if "values" not in estimator_inputs(ctx.cfg) or "critic" in ctx.draft.roles:
        return []  # (an estimator that does not resolve is reported by check_registry_names)
    return [
        error_at(
            "critic.enable",
            f"algorithm.adv_estimator={_estimator_label(ctx.cfg)} needs values, but the critic is off",
            "set critic.enable=true, or pick an estimator without a critic (e.g. grpo)",
        )
    ]


def check_group_size(ctx: Context) -> List[ConfigProblem]:
    """Estimators with a group baseline (they need the group index) learn nothing from groups of one."""
    if value(ctx.cfg, "rollout.n") != 1 or "index" not in estimator_inputs(ctx.cfg):
        return []
    if value(ctx.cfg, "algorithm.name") not in (None, "ppo", "grpo"):  # (online DPO: check_preference asks n >= 2)
        return []
    return [
        warning_at(
            "rollout.n",
            f"rollout.n=1 with algorithm.adv_estimator={_estimator_label(ctx.cfg)}: groups of one sample give zero "
            "advantages",
            "set rollout.n to 2 or more (e.g. 8)",
        )
    ]


def _registered(key: str, spec: Any, registry: Any) -> List[ConfigProblem]:
    """A registry entry by name, or a {_target_: ...} mapping whose target imports."""
    if isinstance(spec, str):
        if spec in registry:
            return []
        names = registry.names()
        close = difflib.get_close_matches(spec, names, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return [
            error_at(
                key,
                f"'{spec}' is not a registered {registry.kind} (registered: {', '.join(names)})",
                f"{hint}set {key} to one of them, register yours in a module listed in trainer.plugins, "
                f"or give {{_target_: pkg.module.fn}}",
            )
        ]
    if isinstance(spec, Mapping):
        if "_target_" not in spec:
            return [
                error_at(
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
        error_at(
            key,
            f"expected a registered {registry.kind} name or a {{_target_: ...}} mapping, got {type(spec).__name__} {spec!r}",
            f"set {key} to one of {', '.join(registry.names())}",
        )
    ]


def check_registry_names(ctx: Context) -> List[ConfigProblem]:
    from verl import algos  # lazy: torch only once the algorithm keys are checked

    return [
        p
        for key, registry_name in REGISTRY_KEYS
        if not key.startswith("critic.") or "critic" in ctx.draft.roles
        if not key.startswith("algorithm.dpo.") or value(ctx.cfg, "algorithm.name") in PREFERENCE_ALGORITHMS
        for p in _registered(key, value(ctx.cfg, key), getattr(algos, registry_name))
    ]


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
            error_at(low_key, f"the lower clip must be in [0, 1) (ratios clip to 1 - {low})", f"set {low_key}=0.2")
        )
    if high is not None and high < 0:
        problems.append(
            error_at(
                high_key, f"the upper clip must be >= 0, got {high}", f"set {high_key}=0.2 (DAPO clip-higher: 0.28)"
            )
        )
    mode = value(cfg, "actor.loss_agg_mode")
    if value(cfg, "actor.policy_loss") == "gspo" and isinstance(mode, str) and mode != "seq-mean-token-mean":
        problems.append(
            warning_at(
                "actor.loss_agg_mode",
                f"policy_loss=gspo with loss_agg_mode={mode}: GSPO's objective is a mean over sequences of per-sequence "
                "losses, which only seq-mean-token-mean gives",
                "set actor.loss_agg_mode=seq-mean-token-mean",
            )
        )
    return problems


def check_kl_has_a_reference(ctx: Context) -> List[ConfigProblem]:
    """A KL loss or KL reward penalty compares with the reference model's log-probs: the ref must run."""
    if "ref" in ctx.draft.roles:
        return []
    return [
        error_at(
            key, f"{key}=true needs the reference model, but ref.enable=false", f"set ref.enable=true, or {key}=false"
        )
        for key in ("actor.use_kl_loss", "algorithm.use_kl_in_reward")
        if value(ctx.cfg, key)
    ]


def check_full_kl(ctx: Context) -> List[ConfigProblem]:
    """The `full` KL estimator needs full-vocabulary log-probs; the trainer passes per-token ones."""
    return [
        error_at(
            key,
            "'full' needs the full-vocabulary distributions, which a training run does not keep",
            f"set {key} to low_var_kl (k3), k1, abs or mse",
        )
        for key, used in (
            ("algorithm.kl_penalty", "algorithm.use_kl_in_reward"),
            ("actor.kl_loss_type", "actor.use_kl_loss"),
        )
        if value(ctx.cfg, used) and value(ctx.cfg, key) == "full"
    ]


def check_dapo(ctx: Context) -> List[ConfigProblem]:
    cfg, problems = ctx.cfg, []
    if value(cfg, "algorithm.overlong_buffer.enable"):
        buffer, max_len = value(cfg, "algorithm.overlong_buffer.len"), value(cfg, "data.max_response_length")
        if buffer is not None and isinstance(max_len, int) and not 1 <= buffer <= max_len:
            problems.append(
                error_at(
                    "algorithm.overlong_buffer.len",
                    f"must be in [1, data.max_response_length={max_len}], got {buffer}",
                    f"set it to a fraction of the response length, e.g. {max(1, max_len // 4)}",
                )
            )
    if value(cfg, "algorithm.filter_groups.enable"):
        if value(cfg, "rollout.n") == 1:
            problems.append(
                error_at(
                    "algorithm.filter_groups.enable",
                    "dynamic sampling with rollout.n=1 drops every group (a group of one has no score spread)",
                    "set rollout.n to 2 or more, or algorithm.filter_groups.enable=false",
                )
            )
    return problems


def plugin_problems(cfg: DictConfig) -> List[ConfigProblem]:
    """Import trainer.plugins first: their registrations must exist before any name is looked up."""
    from verl.algos import load_plugins

    try:
        load_plugins(list(value(cfg, "trainer.plugins") or []))
    except ConfigError as e:
        return list(e.problems)
    return []


def check_reward(ctx: Context) -> List[ConfigProblem]:
    """reward.fn resolves to a function with the reward signature, reward.model's _target_ to a callable. (Neither
    set is the trainer's error: a reward function may come from Python, `PPOTrainer(cfg, reward_fn=...)`.)"""
    from verl.config.instantiate import resolve_target
    from verl.reward.functions import get_reward_fn  # lazy: the reward module imports torch

    fn, model = value(ctx.cfg, "reward.fn"), value(ctx.cfg, "reward.model")
    problems: List[ConfigProblem] = []
    try:
        if fn is not None:
            get_reward_fn(fn)
        if isinstance(model, Mapping) and not callable(
            resolve_target(model.get("_target_"), key="reward.model._target_")
        ):
            problems.append(error_at("reward.model._target_", "does not name a class or function", "name a class"))
    except ConfigError as e:
        problems += e.problems
    pools = list(value(ctx.cfg, "placement.pools") or [])
    listed = [i for i, pool in enumerate(pools) if "reward" in list(value(pool, "roles") or [])]
    if listed and model is None:
        problems.append(
            error_at(
                f"placement.pools.{listed[0]}.roles",
                "lists the reward role, but reward.model is unset: there is no reward model to place",
                "set reward.model (e.g. {_target_: verl.reward.hf_model.HFRewardModel, path: ...}), or remove "
                "reward from the pool (a reward function runs in the driver)",
            )
        )
    return problems


def check_sft(ctx: Context) -> List[ConfigProblem]:
    """SFT trains the actor alone, synchronously: no rollout, reference, critic or KL term."""
    cfg = ctx.cfg
    if value(cfg, "algorithm.name") != "sft":
        return []
    problems = []
    if value(cfg, "trainer.mode") not in (None, "sync"):
        problems.append(
            error_at("trainer.mode", "algorithm.name=sft generates nothing to overlap", "set trainer.mode=sync")
        )
    for role in ("ref", "critic"):
        if role in ctx.draft.roles:
            problems.append(
                error_at(
                    f"{role}.enable",
                    f"algorithm.name=sft trains the actor alone, not a {role}",
                    f"set {role}.enable=false",
                )
            )
    if "reward" in ctx.draft.roles:
        problems.append(
            error_at(
                "placement.pools",
                "algorithm.name=sft scores nothing, so a reward model on workers would sit idle",
                "remove reward from placement.pools",
            )
        )
    for key in ("actor.use_kl_loss", "algorithm.use_kl_in_reward", "rollout.agent.loop"):
        if value(cfg, key):
            problems.append(error_at(key, "algorithm.name=sft: the loss is the data's likelihood alone", "remove it"))
    return problems


def check_preference(ctx: Context) -> List[ConfigProblem]:
    """What DPO and online DPO need: whole (chosen, rejected) pairs on every rank and in every micro-batch, a
    synchronous step, no critic, and (online) groups of at least two samples to rank."""
    cfg, name = ctx.cfg, value(ctx.cfg, "algorithm.name")
    if name not in PREFERENCE_ALGORITHMS:  # ppo / grpo: only a name, the estimator decides; say when they disagree
        critic = "critic" in ctx.draft.roles
        if (name == "ppo" and not critic) or (name == "grpo" and critic):
            has = "without" if name == "ppo" else "with"
            return [
                warning_at(
                    "algorithm.name",
                    f"{name} {has} a critic: algorithm.adv_estimator={_estimator_label(cfg)} decides the advantages",
                    "set algorithm.adv_estimator=gae for PPO with a critic, grpo for group baselines",
                )
            ]
        return []
    label = f"algorithm.name={name}"
    problems = []
    if value(cfg, "trainer.mode") not in (None, "sync"):
        problems.append(error_at("trainer.mode", f"{label} trains synchronously", "set trainer.mode=sync"))
    if value(cfg, "rollout.agent.loop") is not None:
        problems.append(error_at("rollout.agent.loop", f"{label} ranks single completions", "remove it"))
    if "critic" in ctx.draft.roles:
        problems.append(
            error_at("critic.enable", f"{label} trains no critic", "set critic.enable=false (and adv_estimator=grpo)")
        )
    if "ref" not in ctx.draft.roles and name == "online_dpo":
        problems.append(error_at("ref.enable", f"{label} needs the reference's log-probs", "set ref.enable=true"))
    for key in ("actor.use_kl_loss", "algorithm.use_kl_in_reward"):
        if value(cfg, key):
            problems.append(
                error_at(
                    key,
                    f"{label}: the DPO loss holds its own pull to the reference",
                    "set it to false and tune algorithm.dpo.beta",
                )
            )
    if value(cfg, "actor.ppo_max_tokens_per_device") is not None:
        problems.append(
            error_at(
                "actor.ppo_max_tokens_per_device",
                f"{label}: micro-batches cut by tokens could part a chosen reply from its rejected one",
                "remove it; actor.ppo_micro_batch_size_per_device (even) cuts them by rows",
            )
        )
    micro = value(cfg, "actor.ppo_micro_batch_size_per_device")
    if isinstance(micro, int) and micro % 2:
        problems.append(
            error_at(
                "actor.ppo_micro_batch_size_per_device",
                f"{label}: a micro-batch holds whole (chosen, rejected) pairs, so an even number of rows; got {micro}",
                f"set it to {micro + 1}",
            )
        )
    actor = ctx.draft.plan.batch.train_of("actor") if ctx.draft.plan.batch is not None else None
    if actor is not None and isinstance(actor.dp, int) and actor.mini_prompts % actor.dp:
        problems.append(
            error_at(
                "actor.ppo_mini_batch_size",
                f"{label}: {actor.mini_prompts} pairs per optimizer step do not split into whole pairs over the "
                f"actor's {actor.dp} data-parallel ranks",
                f"make it a multiple of {actor.dp}",
            )
        )
    n = value(cfg, "rollout.n")
    if name == "online_dpo" and isinstance(n, int) and n < 2:
        problems.append(
            error_at("rollout.n", f"{label} ranks rollout.n samples per prompt; got {n}", "set rollout.n=2 or more")
        )
    return problems
