"""The placement plan: pools, per-role layouts, rank coordinates and the printed plan."""

from __future__ import annotations

import re

import pytest

from tests.support.fixtures import make_cfg, make_plan
from verl.cli.render import format_plan
from verl.config.placement import Layout, enabled_roles
from verl.config.schema import VerlConfig

SIXTEEN = {
    "data": {"train_batch_size": 256},
    "placement": {"nnodes": 2, "devices_per_node": 8, "device": "cuda"},
    "actor": {
        "backend": "megatron",
        "parallel": {"tp": 4, "pp": 2},
        "ppo_mini_batch_size": 64,
        "ppo_micro_batch_size_per_device": 4,
        "use_kl_loss": True,
    },
    "rollout": {"backend": "vllm", "n": 8, "parallel": {"tp": 2}},
}


def plan_of(*updates: dict):
    plan, problems = make_plan(make_cfg(*updates))
    assert plan is not None, [p.format() for p in problems]
    return plan


def squash(text: str) -> str:
    return re.sub(r"[ \t]+", " ", text)


# --------------------------------------------------------------------------- the 16-GPU layout


def test_sixteen_gpu_layout_sizes():
    plan = plan_of(SIXTEEN)
    actor, rollout, ref = plan.layout("actor"), plan.layout("rollout"), plan.layout("ref")
    assert (actor.tp, actor.pp, actor.cp, actor.dp) == (4, 2, 1, 2)
    assert (rollout.tp, rollout.dp) == (2, 8)
    assert (ref.backend, ref.tp, ref.pp, ref.dp) == ("megatron", 4, 2, 2)  # ref defaults to the actor's
    assert plan.roles == ("actor", "rollout", "ref")
    assert plan.rollout_groups_per_actor_group() == 4  # (4*2)/2


@pytest.mark.parametrize(
    "rank, node_device, actor, rollout",
    [
        (0, (0, 0), (0, 0, 0), (0, 0)),
        (6, (0, 6), (2, 0, 1), (0, 3)),  # 6 = tp2 + 4*(dp1)
        (10, (1, 2), (2, 1, 0), (0, 5)),  # 10 = tp2 + 4*(dp0 + 2*pp1)
        (13, (1, 5), (1, 1, 1), (1, 6)),  # 13 = tp1 + 4*(dp1 + 2*pp1); rollout 13 = tp1 + 2*dp6
        (15, (1, 7), (3, 1, 1), (1, 7)),
    ],
)
def test_sixteen_gpu_rank_coordinates(rank, node_device, actor, rollout):
    plan = plan_of(SIXTEEN)
    assert plan.location(rank) == node_device
    a, r = plan.role_coords(rank, "actor"), plan.role_coords(rank, "rollout")
    assert (a.tp, a.pp, a.dp, a.cp) == actor + (0,)
    assert (r.tp, r.dp) == rollout
    assert str(r) == f"rollout tp{rollout[0]} dp{rollout[1]}"


def test_coordinates_are_a_bijection_with_tp_fastest_then_cp_dp_pp():
    layout = Layout("actor", "megatron", "p", 0, tp=2, pp=2, cp=2, dp=2)
    seen = set()
    for rank in range(layout.world):
        c = layout.coords(rank)
        assert layout.rank(tp=c.tp, pp=c.pp, cp=c.cp, dp=c.dp) == rank
        seen.add((c.tp, c.pp, c.cp, c.dp))
    assert len(seen) == 16
    c5, c14 = layout.coords(5), layout.coords(14)
    assert (c5.tp, c5.cp, c5.dp, c5.pp) == (1, 0, 1, 0)  # 5 = 1 + 2*(0 + 2*(1 + 2*0))
    assert (c14.tp, c14.cp, c14.dp, c14.pp) == (0, 1, 1, 1)  # 14 = 0 + 2*(1 + 2*(1 + 2*1))
    assert str(c14) == "actor tp0 pp1 cp1 dp1"  # cp shown because it is > 1
    with pytest.raises(ValueError):
        layout.coords(16)


def test_expert_parallel_rank_comes_from_dp_and_cp():
    layout = Layout("actor", "megatron", "p", 0, tp=2, pp=1, cp=1, dp=4, ep=2)
    assert [layout.coords(r).ep for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


def test_fsdp_coordinates_show_dp_only():
    plan = plan_of({"placement": {"devices_per_node": 4}, "rollout": {"parallel": {"tp": 2}}})
    assert [str(c) for c in plan.coords(3)] == ["actor dp3", "rollout tp1 dp1"]


# --------------------------------------------------------------------------- pools


def test_pools_take_devices_in_order_and_last_takes_the_rest():
    plan = plan_of(
        {
            "algorithm": {"adv_estimator": "gae"},
            "placement": {
                "nnodes": 2,
                "devices_per_node": 8,
                "pools": [
                    {"name": "hybrid", "roles": ["actor", "rollout"], "devices": 12},
                    {"name": "critic", "roles": ["critic"]},
                ],
            },
        }
    )
    hybrid, critic = plan.pool("actor"), plan.pool("critic")
    assert (hybrid.first_rank, hybrid.size, critic.first_rank, critic.size) == (0, 12, 12, 4)
    assert plan.layout("critic").dp == 4 and plan.layout("actor").dp == 12
    assert [c.role for c in plan.coords(13)] == ["critic"]
    assert str(plan.role_coords(13, "critic")) == "critic dp1"
    assert plan.role_coords(13, "actor") is None
    assert hybrid.nodes(8) == (0, 1) and critic.nodes(8) == (1, 1)
    assert plan.rollout_groups_per_actor_group() is None  # fsdp actor: no micro-DP line


def test_only_the_last_pool_may_leave_devices_unset():
    cfg = make_cfg(
        {
            "placement": {
                "devices_per_node": 4,
                "pools": [{"name": "a", "roles": ["actor"]}, {"name": "b", "roles": ["rollout"]}],
            }
        }
    )
    plan, problems = make_plan(cfg)
    assert plan is None
    assert [p.key for p in problems] == ["placement.pools.0.devices"]
    assert "only the last pool" in problems[0].message


def test_layout_that_does_not_fit_gives_no_plan_and_the_numbers():
    plan, problems = make_plan(
        make_cfg({"placement": {"devices_per_node": 12}, "actor": {"backend": "megatron", "parallel": {"tp": 8}}})
    )
    assert plan is None
    (problem,) = problems
    assert problem.key == "actor.parallel.tp"
    assert "tp*pp*cp = 8 does not divide the 12 devices of pool 'hybrid'" in problem.message
    assert "1, 2, 3, 4, 6, 12" in problem.fix


def test_explicit_dp_must_match_the_pool():
    plan, problems = make_plan(make_cfg({"placement": {"devices_per_node": 8}, "actor": {"parallel": {"dp": 4}}}))
    assert plan is None
    assert problems[0].key == "actor.parallel.dp"
    assert "= 4 does not equal the 8 devices" in problems[0].message
    assert "actor.parallel.dp=8" in problems[0].fix
    assert make_plan(make_cfg({"placement": {"devices_per_node": 8}, "actor": {"parallel": {"dp": 8}}}))[0] is not None


# --------------------------------------------------------------------------- enabled roles


@pytest.mark.parametrize(
    "update, roles",
    [
        ({}, ("actor", "rollout")),
        ({"actor": {"use_kl_loss": True}}, ("actor", "rollout", "ref")),
        ({"algorithm": {"use_kl_in_reward": True}}, ("actor", "rollout", "ref")),
        ({"ref": {"enable": True}}, ("actor", "rollout", "ref")),
        ({"actor": {"use_kl_loss": True}, "ref": {"enable": False}}, ("actor", "rollout")),
        ({"algorithm": {"adv_estimator": "gae"}}, ("actor", "rollout", "critic")),
        ({"algorithm": {"adv_estimator": "gae"}, "critic": {"enable": False}}, ("actor", "rollout")),
        ({"critic": {"enable": True}}, ("actor", "rollout", "critic")),
    ],
)
def test_enabled_roles(update, roles):
    assert enabled_roles(make_cfg(update)) == roles


def test_ref_with_its_own_layout():
    plan = plan_of(
        {
            "placement": {"devices_per_node": 8},
            "actor": {"backend": "megatron", "parallel": {"tp": 2}, "use_kl_loss": True},
            "ref": {"backend": "fsdp", "parallel": {"tp": 1}},
        }
    )
    assert (plan.layout("ref").backend, plan.layout("ref").dp) == ("fsdp", 8)
    assert plan.layout("actor").dp == 4


# --------------------------------------------------------------------------- printed plan


def test_plan_shows_sequence_parallelism_as_resolved():
    def actor_line(parallel: dict) -> str:
        cfg = {"placement": {"devices_per_node": 4}, "actor": {"backend": "megatron", "parallel": parallel}}
        return next(line for line in squash(format_plan(plan_of(cfg))).splitlines() if line.startswith("actor"))

    assert "TP=2+SP PP=1" in actor_line({"tp": 2})
    assert "TP=2 PP=1" in actor_line({"tp": 2, "sequence_parallel": False})
    assert "TP=1 PP=1" in actor_line({"tp": 1})


def test_format_plan_sixteen_gpus():
    text = squash(format_plan(plan_of(SIXTEEN)))
    # Sequence parallelism is on by default with tp > 1, and the plan says so.
    assert "actor megatron TP=4+SP PP=2 CP=1 DP=2 16 devices in pool 'hybrid' (nodes 0-1)" in text
    assert "rollout vllm TP=2 DP=8 16 devices in pool 'hybrid' (nodes 0-1)" in text
    assert "holds 4 rollout replicas of TP=2" in text
    assert "256 prompts x 8 samples = 2048 samples/step" in text
    assert "256 prompts / DP 8 = 32 prompts per replica" in text
    assert "mini-batch 64 prompts = 512 samples = 256 per DP rank = 64 micro-batches of 4" in text
    assert "4 mini-batches x 1 epoch = 4 optimizer steps/step" in text
    assert "lengths: prompts <= 512 tokens, responses <= 512 tokens; log-probs at temperature 1" in text
    assert "\n1 5 13 actor tp1 pp1 dp1 | rollout tp1 dp6 | ref tp1 pp1 dp1\n" in text
    assert "\n0 0 0 actor tp0 pp0 dp0 | rollout tp0 dp0 | ref tp0 pp0 dp0\n" in text
    assert len(re.findall(r"^\d+ \d+ \d+ actor", text, re.M)) == 16


def test_format_plan_shows_uneven_batches_instead_of_failing():
    plan = plan_of({"placement": {"devices_per_node": 3}, "data": {"train_batch_size": 16}})
    text = format_plan(plan)
    assert "16 prompts / DP 3 = 16/3 (does not divide)" in text


def test_format_plan_elides_rows_of_big_clusters():
    plan = plan_of(
        {
            "placement": {"nnodes": 16, "devices_per_node": 8},
            "data": {"train_batch_size": 128},
            "actor": {"ppo_mini_batch_size": 128},
        }
    )
    text = format_plan(plan, max_rows=8)
    assert "(122 ranks not shown)" in text  # 128 ranks: 4 first + 2 last shown
    assert re.search(r"^15\s+7\s+127\s+actor dp127", text, re.M)


def test_make_plan_accepts_a_verl_config():
    cfg = VerlConfig()
    cfg.data.train_batch_size = 4
    cfg.actor.ppo_mini_batch_size = 4
    plan, problems = make_plan(cfg)
    assert problems == [] and plan is not None
    assert plan.batch.samples == 4


def test_the_plan_counts_each_roles_optimizer_steps_over_the_run():
    from verl.config.plan import build_plan

    gae = {"algorithm": {"adv_estimator": "gae"}, "actor": {"ppo_epochs": 2}, "critic": {"ppo_epochs": 3}}
    plan = build_plan(make_cfg(SIXTEEN, gae, {"trainer": {"total_steps": 10}}))
    # 256 prompts / mini-batches of 64 = 4 per step; x epochs; x 10 steps
    assert plan.optimizer_steps("actor") == 4 * 2 * 10 and plan.optimizer_steps("critic") == 4 * 3 * 10
    assert plan.role("ref").backend == "megatron" and plan.layout("ref").tp == 4  # inherited from the actor
    assert plan.role("actor").rows_per_rank == 256 and plan.train_dp == 16  # lcm of actor DP 2, critic DP 16
    assert "run: 10 steps; optimizer steps (each role's LR schedule): actor 80, critic 120" in squash(format_plan(plan))


@pytest.mark.parametrize(
    "update, why",
    [
        ({}, None),  # the minimal config: 16 prompts in 4 mini-batches of 4
        ({"actor": {"ppo_mini_batch_size": 16}}, ""),  # one mini-batch of one epoch: on-policy
        ({"actor": {"ppo_mini_batch_size": 16, "ppo_epochs": 2}}, "1 mini-batch(es) x 2 epoch(s)"),
        ({"actor": {"ppo_mini_batch_size": 16}, "algorithm": {"use_kl_in_reward": True}}, "use_kl_in_reward"),
        ({"actor": {"ppo_mini_batch_size": 16, "recompute_old_log_probs": "always"}}, "always"),
    ],
)
def test_an_on_policy_update_needs_no_old_log_prob_pass(update, why):
    plan = plan_of(update)
    text = squash(format_plan(plan))
    if why == "":
        assert plan.old_log_probs == "update" and "actor" not in [r.name for r in plan.log_prob_passes]
        assert "old log-probs: the update's own forward (on-policy" in text
    else:
        assert plan.old_log_probs == "recompute" and "actor" in [r.name for r in plan.log_prob_passes]
        assert f"old log-probs: a pass before the update ({plan.old_log_probs_why})" in text
        assert why is None or why in plan.old_log_probs_why


def test_cpu_worker_threads_come_from_the_recipe_then_the_environment_then_the_cores(monkeypatch):
    two = {"placement": {"devices_per_node": 2}, "data": {"train_batch_size": 16}}
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    plan = plan_of(two)
    assert (plan.threads, plan.threads_from) == (4, "8 cores / 2 workers per node")
    assert "threads: 4 per worker process (8 cores / 2 workers per node)" in squash(format_plan(plan))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's setting is kept, not overridden
    assert (plan_of(two).threads, plan_of(two).threads_from) == (3, "OMP_NUM_THREADS")
    recipe = plan_of(two, {"placement": {"threads_per_worker": 5}})
    assert (recipe.threads, recipe.threads_from) == (5, "placement.threads_per_worker")
    assert plan_of(SIXTEEN).threads is None  # GPUs: not the plan's to set


RM = {"_target_": "verl.reward.hf_model.HFRewardModel", "path": "rm"}


def test_the_reward_model_is_a_role_only_where_a_pool_lists_it(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert enabled_roles(make_cfg({"reward": {"model": RM}})) == ("actor", "rollout")  # in the driver
    apart = plan_of(
        {"reward": {"model": RM}, "data": {"train_batch_size": 16}},
        {
            "placement": {
                "devices_per_node": 4,
                "pools": [
                    {"name": "hybrid", "roles": ["actor", "rollout"], "devices": 2},
                    {"name": "rm", "roles": ["reward"]},
                ],
            }
        },
    )
    assert apart.layout("reward").dp == 2 and apart.layout("reward").backend == "HFRewardModel"
    assert apart.threads == 2  # one process on each of 4 devices
    text = squash(format_plan(apart))
    assert "reward HFRewardModel DP=2 2 devices in pool 'rm'" in text
    assert "reward model: on 2 workers (on devices of its own)" in text
    shared = plan_of(
        {"reward": {"model": RM}, "data": {"train_batch_size": 16}},
        {"placement": {"devices_per_node": 2, "pools": [{"name": "hybrid", "roles": ["actor", "rollout", "reward"]}]}},
    )
    assert shared.colocated("reward", "actor") and shared.threads == 2  # 8 cores / (2 devices x 2 processes)
    assert "reward model: on 2 workers (sharing the devices of actor, rollout)" in squash(format_plan(shared))
