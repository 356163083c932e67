"""The FSDP actor across 2 Ray workers (world size 2, gloo) takes the same step as world size 1 (a plain module).

Same batch, same starting weights: the loss and every updated parameter agree within float32 reduction-order
noise (atol 1e-6 on weights of size ~0.02-1), also with unequal token counts on the two ranks (token-mean).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from tests.support.engines import policy_batch
from tests.support.run_configs import ODD_LENGTH_REWARD, fit, tiny_config
from verl.cli import main
from verl.config.plan import build_plan
from verl.controller import make_worker_group, pools_from_plan
from verl.embedded.models import materialize_embedded_model
from verl.protocol import DataProto
from verl.utils.shared_prefix import pack_shared_prefixes
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl_fsdp import backends, export  # noqa: F401  (what `verl export` discovers and runs)
from verl_fsdp.memory_model import fsdp_state_bytes, hf_parameter_shapes, trained_shapes

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

ROWS, P, R = 8, 6, 4


def _batch(vocab: int) -> DataProto:
    """Rows in pairs with the same prompt, as rollout.n=2 gives them, so both worlds pack shared prefixes (and
    world 2's FSDP units carry the packed forward and the head applied outside it)."""
    batch = policy_batch(ROWS, P, R, vocab, old_log_prob=-2.0)
    b = batch.batch
    for key in ("input_ids", "attention_mask", "position_ids"):
        b[key][1::2, :P] = b[key][0::2, :P]
    # Rank 1's responses are shorter (11 tokens against rank 0's 16): its token-mean weighs 11/27 of the batch's,
    # which the engines' token count over both ranks gets right (a mean of the two ranks' means would not).
    for row, length in zip(range(ROWS // 2, ROWS), (4, 3, 2, 2)):
        b["response_mask"][row, length:] = 0
        b["attention_mask"][row, P + length :] = 0
    return batch


_HELD: dict = {}  # world size -> each rank's held_bytes after the step


def _step(cfg, model_path: str, batch: DataProto, save_to: str | None = None):
    plan = build_plan(cfg, total_steps=10)
    pool = pools_from_plan(plan)["hybrid"]
    group = make_worker_group("ray", pool, ActorRolloutRefWorker, cfg, plan, model_path, roles=["actor"], role="actor")
    try:
        group.call("init_model")
        metrics = group.call("update_actor", batch)
        state = group.call("actor_state")[0]
        _HELD[len(metrics)] = group.call("held_bytes")
        if save_to is not None:
            group.call("save_checkpoint", save_to)
    finally:
        group.shutdown()
        pool.remove()
    return metrics, state


def test_world_two_equals_world_one(ray_two_cpus, tmp_path, embedded_cache):  # noqa: F811
    model_path = materialize_embedded_model("tiny-llama", embedded_cache)
    common = (
        "trainer.controller=ray",
        "rollout.n=1",
        "data.train_batch_size=8",
        "actor.ppo_mini_batch_size=8",
        "actor.ppo_micro_batch_size_per_device=4",
        "actor.optim.lr=1e-3",
        "placement.pools=[{name: hybrid, roles: [actor, rollout]}]",
    )
    one = tiny_config("grpo_tiny", str(tmp_path / "one"), *common, "placement.devices_per_node=1")
    two = tiny_config("grpo_tiny", str(tmp_path / "two"), *common, "placement.devices_per_node=2")
    batch = _batch(vocab=83)
    b = batch.batch
    for half in (slice(0, ROWS // 2), slice(ROWS // 2, ROWS)):  # each world-2 rank's rows pack
        assert pack_shared_prefixes(b["input_ids"][half], b["attention_mask"][half], b["position_ids"][half], R)
    m1, w1 = _step(one, model_path, batch)
    m2, w2 = _step(two, model_path, batch, save_to=str(tmp_path / "ckpt"))
    assert len(m1) == 1 and len(m2) == 2  # one metrics dict per dp rank
    loss1 = m1[0]["actor/pg_loss"]
    loss2 = sum(m["actor/pg_loss"] for m in m2) / 2
    assert loss1 == pytest.approx(loss2, rel=1e-6, abs=1e-7)
    assert m1[0]["actor/grad_norm"] == pytest.approx(m2[0]["actor/grad_norm"], rel=1e-5)
    # what each rank holds is what the memory model says before launch (FSDP2 cuts dim 0 unevenly: 83 rows, 42/41)
    shapes = trained_shapes(hf_parameter_shapes(AutoConfig.from_pretrained(model_path)), True)
    for world in (1, 2):
        for rank, held in enumerate(_HELD[world]):
            assert held == fsdp_state_bytes(shapes, dp=world, rank=rank).as_dict(), (world, rank)
    assert _HELD[2][0]["params"] < _HELD[1][0]["params"] * 0.51
    assert w1.keys() == w2.keys()
    changed = 0
    for name in w1:
        torch.testing.assert_close(w1[name], w2[name], rtol=0, atol=1e-6, msg=name)
        changed += int(not torch.equal(w1[name], materialize_reference(model_path)[name]))
    assert changed == len(w1)  # every parameter moved: the comparison is not of two untouched models

    # `verl export` of the world-2 checkpoint, in this one process: the trained weights, bitwise
    assert main(["export", str(tmp_path / "ckpt" / "actor"), str(tmp_path / "hf")]) == 0
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert exported.keys() == w2.keys()
    for name in w2:
        assert torch.equal(exported[name], w2[name]), name


_REF = {}


def materialize_reference(model_path: str) -> dict:
    if model_path not in _REF:
        from transformers import AutoModelForCausalLM

        _REF[model_path] = {
            k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(model_path).named_parameters()
        }
    return _REF[model_path]


def test_a_two_rank_run_balances_its_ranks_by_tokens(ray_two_cpus, tmp_path, embedded_cache, monkeypatch):  # noqa: F811
    """trainer.balance_ranks: at DP 2 every step places whole prompt groups so that the two ranks' token counts
    are no further apart than in generation order, and says how far apart both were."""
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path),
        "trainer.controller=ray",
        "placement.devices_per_node=2",
        "placement.pools=[{name: hybrid, roles: [actor, rollout]}]",
        "trainer.balance_ranks=true",
        "rollout.n=2",
        "actor.ppo_micro_batch_size_per_device=2",
        ODD_LENGTH_REWARD,
        steps=3,
    )
    summary, rows = fit(cfg)
    assert summary["steps"] == 3
    for row in rows:
        assert 1.0 <= row["perf/rank_imbalance"] <= row["perf/rank_imbalance_before"]
