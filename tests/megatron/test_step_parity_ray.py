"""One actor update of the megatron engine through the project's worker (ActorRolloutRefWorker on Ray, gloo):
TP=2 (with and without sequence parallelism), PP=2 (plain and interleaved), CP=2 and DP=2 (distributed optimizer) each take the same
step as TP=1 on one worker; a mixture of experts at EP=2 takes the step it takes at EP=1.

Same batch, same starting weights: the loss and grad norm agree to float32 rounding and every updated weight
agrees within WEIGHT_ATOL. Splitting the model changes only the order of float32 sums (TP's row-parallel all-reduce,
PP's stage boundary, DP's gradient reduce-scatter). AdamW runs with eps=0.1 so its first step is close to
lr * g / eps, linear in the gradient: with the usual eps=1e-8 the first step is lr * g / |g|, which turns a 1e-10
rounding difference on a near-zero gradient into a 1e-5 weight difference and would hide a real error among them.
Updates are ~1e-3; measured differences are <= 7.5e-9. A context-parallel gradient off by the factor cp (each
rank's share is summed over the group, then averaged over dp*cp) would move weights by 2x and fail here.
Every layout's ranks also hold the state verl_megatron.memory_model estimates, to the byte.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from tests.support.engines import policy_batch
from tests.support.run_configs import tiny_config
from verl.config.plan import build_plan
from verl.controller import make_worker_group, pools_from_plan
from verl.embedded.models import materialize_embedded_model
from verl.protocol import DataProto
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl_megatron.memory_model import state_bytes

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

ROWS, P, R = 8, 6, 4
WEIGHT_ATOL = 5e-8
# The all-to-all regroups a layer's tokens per expert, which reorders the sums behind the norms' gradients: one
# float32 ulp at 1.0 (a norm weight). Measured: 6.0e-8 on one norm, every other tensor within 5e-8.
MOE_WEIGHT_ATOL = 1.2e-7


@pytest.fixture(scope="module")
def model_path(embedded_cache):
    return materialize_embedded_model("tiny-llama", embedded_cache)


def _batch(vocab: int) -> DataProto:
    return policy_batch(ROWS, P, R, vocab, old_log_prob=-4.5)


def _step(model_path: str, tmp, name: str, devices: int, *overrides: str):
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp / name),
        "trainer.controller=ray",
        "rollout.n=1",
        "data.train_batch_size=8",
        "actor.backend=megatron",
        "actor.ppo_mini_batch_size=8",
        "actor.ppo_micro_batch_size_per_device=2",
        "actor.optim.lr=1e-2",
        "actor.optim.eps=0.1",
        "placement.pools=[{name: hybrid, roles: [actor, rollout]}]",
        f"placement.devices_per_node={devices}",
        *overrides,
    )
    plan = build_plan(cfg, total_steps=10)
    pool = pools_from_plan(plan, cpus_per_device=2 / devices)["hybrid"]
    group = make_worker_group("ray", pool, ActorRolloutRefWorker, cfg, plan, model_path, roles=["actor"], role="actor")
    try:
        group.call("init_model")
        metrics = group.call("update_actor", _batch(vocab=83))
        states = group.call("actor_state")
        held = group.call("held_bytes")
    finally:
        group.shutdown()
        pool.remove()
    _assert_estimate(held, model_path, plan.layout("actor"))
    return metrics, states


def _assert_estimate(held, model_path: str, layout) -> None:
    """Each pipeline stage's largest rank holds what verl_megatron.memory_model estimates, to the byte."""
    stages = state_bytes(AutoConfig.from_pretrained(model_path), layout.sizes(), dtype=torch.float32)
    per_stage = layout.world // layout.pp
    for stage, estimate in enumerate(stages):
        ranks = held[stage * per_stage : (stage + 1) * per_stage]
        assert max(ranks, key=lambda h: sum(h.values())) == estimate.as_dict(), (stage, ranks, estimate)


@pytest.fixture(scope="module")
def reference(ray_two_cpus, model_path, tmp_path_factory):
    return _step(model_path, tmp_path_factory.mktemp("tp1"), "tp1", 1)


@pytest.mark.parametrize(
    "name, overrides, replicas",
    [
        ("tp2", ("actor.parallel.tp=2", "actor.parallel.sequence_parallel=false"), 1),
        ("tp2-sp", ("actor.parallel.tp=2",), 1),  # sequence parallelism is on by default with tp > 1
        ("pp2", ("actor.parallel.pp=2",), 1),
        # interleaved: two chunks a stage; two stages exchange activations and gradients with one peer
        ("pp2-vpp2", ("actor.parallel.pp=2", "actor.parallel.vpp=2"), 1),
        ("cp2", ("actor.parallel.cp=2",), 1),  # context parallelism: each rank holds half of every sequence
        ("dp2", (), 2),  # two data-parallel ranks: megatron DDP + the distributed optimizer
    ],
)
def test_split_step_equals_single_worker(reference, model_path, tmp_path, name, overrides, replicas):
    m2, states = _step(model_path, tmp_path, name, 2, *overrides)
    _assert_same_step(reference, m2, states, replicas, model_path, name)


@pytest.fixture(scope="module")
def moe_path(embedded_cache):
    return materialize_embedded_model("tiny-qwen3-moe", embedded_cache)


_EP1: dict = {}


def _ep1(moe_path: str, tmp, aux: float):
    """The MoE step at EP=1 on one worker with the load-balancing loss `aux` (each computed once)."""
    if aux not in _EP1:
        _EP1[aux] = _step(moe_path, tmp, f"ep1-aux{aux}", 1, f"actor.moe_aux_loss_coeff={aux}")
    return _EP1[aux]


@pytest.mark.parametrize("aux", [0.0, 0.01], ids=["aux-off", "aux-on"])
def test_expert_parallel_step_equals_single_worker(ray_two_cpus, moe_path, tmp_path, aux):
    """EP=2 (each worker holds 4 of every layer's 8 experts, tokens sent to them all-to-all, DP=2 for the dense
    part) takes the step EP=1 takes on one worker, with megatron's load-balancing loss off and on (it is computed
    per micro-batch, and both layouts cut the same micro-batches)."""
    reference = _ep1(moe_path, tmp_path, aux)
    m2, states = _step(moe_path, tmp_path, "ep2", 2, "actor.parallel.ep=2", f"actor.moe_aux_loss_coeff={aux}")
    _assert_same_step(reference, m2, states, 2, moe_path, f"ep2 aux {aux}", atol=MOE_WEIGHT_ATOL)
    (m1,), _ = reference
    for key in ("actor/moe/load_max", "actor/moe/load_min") + (("actor/moe/balance_loss",) if aux else ()):
        # the tokens each expert got, summed over both ranks' micro-batches: the one worker's counts
        assert all(m[key] == pytest.approx(m1[key], rel=1e-6) for m in m2), key
    if aux:  # the loss takes effect: the routers move otherwise than without it (the experts' weights too)
        (_,), (without,) = _ep1(moe_path, tmp_path, 0.0)
        (_,), (with_aux,) = reference
        router = "model.layers.0.mlp.gate.weight"
        moved = (with_aux[router] - without[router]).abs().max().item()
        print(f"router moved by the aux loss: {moved:.2e}")
        assert moved > 1e-5  # measured 7.8e-5, against the layouts' agreement of 1.2e-7


def _assert_same_step(
    reference, m2, states, replicas: int, model_path: str, name: str, atol: float = WEIGHT_ATOL
) -> None:
    (m1,), (w1,) = reference
    assert len(m2) == replicas  # one metrics dict per data-parallel replica
    loss2 = sum(m["actor/pg_loss"] for m in m2) / replicas
    assert m1["actor/pg_loss"] == pytest.approx(loss2, rel=1e-6, abs=1e-7)
    assert m1["actor/grad_norm"] == pytest.approx(m2[0]["actor/grad_norm"], rel=1e-5)
    before = _initial(model_path)
    worst = 0.0
    for w2 in states:  # every rank streams the full model
        assert w1.keys() == w2.keys() == before.keys()
        for key in w1:
            torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=atol, msg=key)
            worst = max(worst, (w2[key] - w1[key]).abs().max().item())
    moved = sum(not torch.equal(w1[k], before[k]) for k in w1)
    assert moved == len(w1)  # every parameter changed: the comparison is not of two untouched models
    print(f"{name}: loss {loss2:.6f} vs {m1['actor/pg_loss']:.6f}, max |w - w_tp1| = {worst:.1e}")


_INITIAL: dict = {}


def _initial(model_path: str) -> dict:
    if model_path not in _INITIAL:
        from safetensors.torch import load_file

        _INITIAL[model_path] = load_file(f"{model_path}/model.safetensors")
    return _INITIAL[model_path]
