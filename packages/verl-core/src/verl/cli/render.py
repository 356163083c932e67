"""The plan as text: per-role layouts, the batch arithmetic and a rank table (`verl validate`, `--dry-run`)."""

from __future__ import annotations

from typing import List, Optional

from verl.config.placement import Layout, Pool
from verl.config.plan import Plan

BALANCE_COSTS = {"tokens": "token count", "attention": "tokens and attention"}  # plan.balance_cost, as shown


def _count(n: int, word: str) -> str:
    """'1 device', '2 devices', '2 micro-batches'."""
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word}{'es' if word.endswith('ch') else 's'}"


def _node_span(pool: Pool, devices_per_node: int) -> str:
    first, last = pool.nodes(devices_per_node)
    return f"node {first}" if first == last else f"nodes {first}-{last}"


def _sizes(layout: Layout) -> str:
    if layout.role == "reward":  # a copy of the model on each device
        return f"DP={layout.dp}"
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
    lines = _table(rows)
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


def _batch_lines(plan: Plan) -> List[str]:
    batch = plan.batch
    if plan.trainer == "sft":
        lines = [f"batch: {_count(batch.prompts, 'example')}/step"]
    elif plan.trainer == "dpo":  # (the rollout only generates for validation)
        lines = [f"batch: {_count(batch.prompts, 'pair')} x 2 replies (chosen, rejected) = {batch.samples} rows/step"]
    else:
        lines = [
            f"batch: {_count(batch.prompts, 'prompt')} x {_count(batch.n, 'sample')} = {batch.samples} samples/step"
        ]
    if batch.rollout_dp is not None and plan.trainer != "dpo":
        per = batch.prompts_per_replica
        tail = f" x {batch.n} = {per * batch.n} samples" if per is not None else ""
        lines.append(
            f"rollout: {batch.prompts} prompts / DP {batch.rollout_dp} = "
            f"{_ratio(batch.prompts, batch.rollout_dp, per)} prompts per replica{tail}"
        )
    for t in batch.train:
        per_rank = _ratio(t.mini_samples, t.dp, t.per_rank)
        if t.max_tokens:
            micro = f"micro-batches of <= {t.max_tokens} tokens"
        elif t.micro_batches is not None:
            micro = f"{_count(t.micro_batches, 'micro-batch')} of {t.micro}"
        else:
            micro = f"micro-batches of {t.micro} (do not divide)"
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
    if plan.log_prob_passes and plan.trainer == "online_dpo":
        lines.append(f"log-prob passes: ref over the pairs only (<= {2 * batch.prompts} rows)")
    elif plan.log_prob_passes:
        passes = [
            f"{r.name} {_ratio(batch.samples, r.layout.dp, batch.per_rank(r.layout.dp))} per DP rank "
            f"(micro-batches of {f'<= {r.max_tokens} tokens' if r.max_tokens else r.micro_batch})"
            for r in plan.log_prob_passes
        ]
        lines.append(f"log-prob passes over {batch.samples} samples: " + "; ".join(passes))
    if plan.has("actor") and plan.trainer == "ppo":
        lines.append(
            "old log-probs: the update's own forward (on-policy; actor.recompute_old_log_probs=always for a pass)"
            if plan.old_log_probs == "update"
            else f"old log-probs: a pass before the update ({plan.old_log_probs_why})"
        )
    if plan.has("actor") and plan.trainer == "ppo" and plan.routing_replay != "none":
        source = {"r2": "the old-log-prob pass", "r3": "the rollout"}.get(plan.routing_replay, plan.routing_replay)
        lines.append(
            f"routing replay: {plan.routing_replay} ({source} records the experts each token goes to, as a batch "
            "column; every later actor pass routes each token to them)"
        )
    if plan.shared_prefix:
        lines.append(
            f"packed rows ({', '.join(plan.shared_prefix)}): the samples of a prompt are one sequence, its prompt "
            "computed once, and no padding (model.shared_prefix=false for padded rows)"
        )
    if plan.balance_dp > 1:
        lines.append(
            f"balanced ranks: each step's prompt groups are placed on the actor's {plan.balance_dp} data-parallel "
            f"ranks by {BALANCE_COSTS[plan.balance_cost]} (trainer.balance_ranks, trainer.balance_cost)"
        )
    if plan.ref_from_actor:
        lines.append("ref: the actor's own model with its LoRA adapters off (actor.lora; no second model)")
    if plan.lora_sync == "adapter":
        lines.append("weight sync: the LoRA adapters alone, loaded by the rollout's LoRA support (rollout.lora_sync)")
    elif plan.lora_sync == "merged":
        lines.append("weight sync: the base weights with the LoRA adapters merged in (rollout.lora_sync)")
    if plan.rollout_apart:
        rollout, actor = plan.pool("rollout"), plan.pool("actor")
        lines.append(
            f"weight sync: pool '{actor.name}' -> pool '{rollout.name}' over a transfer group (the actor's rank 0 "
            f"and the rollout's {_count(rollout.size, 'rank')}, {'gloo' if plan.device == 'cpu' else 'nccl'}), "
            "full tensors in buckets (rollout.weight_sync_bucket_mb)"
        )
    if plan.has("reward"):
        shared = [r for r in plan.roles if r != "reward" and plan.colocated(r, "reward")]
        where = f"sharing the devices of {', '.join(shared)}" if shared else "on devices of its own"
        lines.append(
            f"reward model: on {_count(plan.layout('reward').dp, 'worker')} ({where}), each batch's samples split "
            "over them"
        )
    if plan.agent_loop is not None:
        lines.append(
            f"rollout: agent loop {plan.agent_loop}, up to {_count(plan.agent_max_turns, 'model turn')} per "
            f"trajectory in {plan.response_length} response tokens (tool results included, untrained)"
        )
    if plan.mode == "one_step_off":
        lines.append(
            "mode: one_step_off: the rollout generates step k+1's batch while the actor trains on step k's (samples "
            "one update old; the actor's log-probs are the proximal policy's)"
        )
    elif plan.mode == "async":
        lines.append(
            f"mode: async: the rollout service ({_count(plan.pool('rollout').size, 'replica')}) generates up to "
            f"{plan.max_staleness} batch(es) ahead; weights reach it between its turns, samples midway continue "
            f"under them (trainer.max_staleness={plan.max_staleness}: no sample trains on a policy more updates "
            "newer than the oldest that sampled it)"
        )
    elif plan.rollout_apart:
        lines.append(
            "mode: sync: each step generates on the rollout's pool, then trains (trainer.mode=one_step_off "
            "overlaps them)"
        )
    return lines


def _run_lines(plan: Plan) -> List[str]:
    """Lengths, the log-prob temperature, and (when the run's length is known) each role's optimizer steps."""
    lines = [
        f"lengths: prompts <= {plan.prompt_length} tokens, responses <= {plan.response_length} tokens; "
        f"log-probs at temperature {plan.temperature:g}"
    ]
    if plan.trainer == "sft":
        lines.append("trainer: sft: the token-mean negative log-likelihood of data.train_files' replies; val/loss")
    elif plan.trainer == "dpo":
        lines.append("trainer: dpo: preference pairs from data.train_files, the loss against the reference (ref)")
    elif plan.trainer == "online_dpo":
        lines.append(
            f"trainer: online_dpo: rollout.n={plan.batch.n} samples per prompt ranked by the reward; the best and the "
            "worst form a pair (prompts whose samples all score the same are skipped)"
        )
    lines.append(f"controller: {plan.controller} ({plan.controller_why})")
    if plan.threads:
        lines.append(f"threads: {plan.threads} per worker process ({plan.threads_from})")
    trained = [r for r in ("actor", "critic") if plan.has(r) and plan.role(r).train is not None]
    if plan.total_steps is not None and trained:
        steps = ", ".join(f"{r} {plan.optimizer_steps(r)}" for r in trained)
        lines.append(f"run: {_count(plan.total_steps, 'step')}; optimizer steps (each role's LR schedule): {steps}")
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


def _table(rows: List[List[str]]) -> List[str]:
    """Rows in aligned columns; the last column is left as it is."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1] for r in rows]


def format_plan(plan: Plan, max_rows: int = 64) -> str:
    """The plan as text: per-role layouts, batch arithmetic and a rank table."""
    lines = [
        f"placement: {_count(plan.nnodes, 'node')} x {_count(plan.devices_per_node, plan.device + ' device')} "
        f"= {_count(plan.world_size, 'rank')}",
        *_role_lines(plan),
        "",
    ]
    if plan.batch is not None:
        lines += _batch_lines(plan) + _run_lines(plan) + [""]
    lines += _table([["node", "device", "rank", "workers"], *_rank_rows(plan, max_rows)])
    return "\n".join(lines)
