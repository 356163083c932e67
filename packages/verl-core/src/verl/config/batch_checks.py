"""Checks of a config's batch arithmetic: rollout, mini- and micro-batches that divide over each role's
data-parallel ranks, and token budgets that hold a whole row."""

from __future__ import annotations

from typing import List

from verl.config.checks import Context, error_at
from verl.config.errors import ConfigProblem
from verl.config.placement import value
from verl.config.plan import PASS_TOKEN_KEYS, TRAIN_TOKEN_KEYS, TrainBatch


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
