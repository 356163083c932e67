"""PPOTrainer with megatron engines on Ray workers: the hybrid engine's weight sync (measured), exact resume from
a megatron checkpoint, and PPO with a megatron critic. Tiny runs: a random model, a few prompts, a few steps."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from tests.support.run_configs import tiny_config
from verl.trainer.ppo import PPOTrainer

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _run(cfg):
    with PPOTrainer(cfg) as trainer:
        return trainer.fit()


def _metrics(out_dir) -> list:
    with open(os.path.join(out_dir, "logs", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _hf_state(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


def test_weight_sync_is_measured_and_resume_is_exact(tmp_path):
    straight = tmp_path / "straight"
    common = ("checkpoint.save_every=2", "checkpoint.save_hf=true", "rollout.n=2", "trainer.resume=auto")
    summary = _run(tiny_config("grpo_tiny_megatron", str(straight), *common, steps=3))
    assert summary["steps"] == 3
    rows = _metrics(straight)
    hf = _hf_state(straight / "hf")
    params = sum(t.numel() for t in hf.values())
    # Each of the two workers loads the full model into its rollout, in float32.
    assert rows[-1]["perf/weight_sync_bytes"] == 2 * 4 * params
    # Each receives the other TP rank's shard of every split tensor: half of each projection and 42 of the 84
    # padded rows (vocab 83) of the embedding and lm_head, hidden 128; norms are replicated and not sent.
    halves = (
        sum(
            t.numel()
            for k, t in hf.items()
            if "norm" not in k and k not in ("model.embed_tokens.weight", "lm_head.weight")
        )
        // 2
    )
    per_rank = (halves + 2 * 42 * 128) * 4
    assert rows[-1]["perf/weight_sync_comm_bytes"] == 2 * per_rank
    assert all(r["timing/weight_sync_s"] > 0 for r in rows)
    # Each sync is checked (rollout.verify_weights_every): the two replicas hold every parameter as sent.
    assert all(r["weight_sync/checked_params"] == 2 * len(hf) and r["timing/weight_check_s"] > 0 for r in rows)
    # After each sync the hf rollout samples with the actor's weights: the trainer's log-probs (TP=2) of the sampled
    # tokens are the rollout's (TP=1) up to float rounding, every step.
    for r in rows:
        assert 0 <= r["rollout/logprob_diff_mean"] <= r["rollout/logprob_diff_max"] < 1e-4, r["step"]
    print(
        f"weight sync TP=2 -> rollout TP=1: {rows[-1]['perf/weight_sync_bytes']:.0f} B loaded, "
        f"{rows[-1]['perf/weight_sync_comm_bytes']:.0f} B exchanged, {rows[-1]['timing/weight_sync_s']:.3f} s"
    )

    # Resume from step 2 in a fresh run: the step-3 weights are the straight run's, bit for bit.
    resumed = tmp_path / "resumed"
    shutil.copytree(straight / "checkpoints" / "step_2", resumed / "checkpoints" / "step_2")
    summary = _run(tiny_config("grpo_tiny_megatron", str(resumed), *common, steps=3))
    assert summary["steps"] == 3 and [r["step"] for r in _metrics(resumed)] == [3]
    again = _hf_state(resumed / "hf")
    assert again.keys() == hf.keys()
    for key in hf:
        assert torch.equal(again[key], hf[key]), key


def test_ppo_with_megatron_actor_and_critic(tmp_path):
    cfg = tiny_config(
        "ppo_tiny",
        str(tmp_path),
        "actor.backend=megatron",
        "critic.backend=megatron",
        "actor.ppo_micro_batch_size_per_device=2",  # a mini-batch of 2 prompts x n=1 is 2 rows
        "critic.ppo_micro_batch_size_per_device=2",
        "trainer.controller=ray",
    )
    _run(cfg)
    row = _metrics(tmp_path)[-1]
    for key in ("critic/vf_loss", "critic/grad_norm", "actor/pg_loss", "actor/grad_norm", "critic/vpred_mean"):
        assert key in row, key
    for r in _metrics(tmp_path):  # the megatron actor's log-probs are the rollout's (fp32)
        assert 0 <= r["rollout/logprob_diff_mean"] <= r["rollout/logprob_diff_max"] < 1e-4, r["step"]
    assert os.path.exists(tmp_path / "checkpoints" / "step_2" / "critic" / "verl_megatron.json")


def test_dpo_on_a_tp2_megatron_actor_matches_fsdp(tmp_path):
    """The DPO loss is an engine-agnostic micro-batch loss: a megatron actor and reference at TP=2 on two workers
    train the same pairs as an FSDP actor on one, to float summation order."""
    import pandas as pd

    from tests.support.run_configs import fit
    from verl.embedded.arithmetic import make_preference_rows

    path = str(tmp_path / "pairs.parquet")
    pd.DataFrame(make_preference_rows(8, seed=0)).to_parquet(path)
    common = (f"data.train_files=[{path}]", "actor.ppo_mini_batch_size=4", "actor.optim.lr=1e-3")
    _, fsdp = fit(tiny_config("dpo_tiny", str(tmp_path / "fsdp"), *common))
    megatron = (
        "actor.backend=megatron",
        "actor.parallel.tp=2",
        "placement.devices_per_node=2",
        "trainer.controller=ray",
    )
    _, tp2 = fit(tiny_config("dpo_tiny", str(tmp_path / "megatron"), *common, *megatron))
    assert tp2[0]["actor/dpo_loss"] == pytest.approx(0.6931471805599453, abs=1e-6)  # log 2: policy = reference
    for key in ("actor/dpo_loss", "actor/grad_norm", "actor/dpo/reward_margins"):
        assert [m[key] for m in tp2] == pytest.approx([m[key] for m in fsdp], rel=1e-4, abs=1e-5), key


def test_sft_on_a_tp2_megatron_actor_matches_fsdp(tmp_path):
    """SFTTrainer's update and validation loss on a megatron actor at TP=2 (two Ray workers) equal FSDP's on one."""
    import pandas as pd

    from tests.support.run_configs import fit
    from verl.embedded.arithmetic import make_sft_rows

    train, val = str(tmp_path / "train.parquet"), str(tmp_path / "val.parquet")
    pd.DataFrame(make_sft_rows(16, seed=0)).to_parquet(train)
    pd.DataFrame(make_sft_rows(8, seed=0, split="val")).to_parquet(val)
    common = (
        f"data.train_files=[{train}]",
        f"data.val_files=[{val}]",
        "trainer.val_before_train=true",
        "data.train_batch_size=8",
        "actor.ppo_mini_batch_size=8",
        "actor.optim.lr=1e-2",
    )
    _, fsdp = fit(tiny_config("sft_tiny", str(tmp_path / "fsdp"), *common))
    megatron = ("actor.backend=megatron", "actor.parallel.tp=2", "placement.devices_per_node=2")
    _, tp2 = fit(tiny_config("sft_tiny", str(tmp_path / "megatron"), *common, *megatron, "trainer.controller=ray"))
    assert [m["step"] for m in tp2] == [0, 1, 2]
    assert tp2[0]["val/loss"] == pytest.approx(fsdp[0]["val/loss"], abs=1e-5)
    assert tp2[-1]["val/loss"] == pytest.approx(fsdp[-1]["val/loss"], rel=1e-4)
    for key in ("actor/loss", "actor/grad_norm"):
        assert [m[key] for m in tp2[1:]] == pytest.approx([m[key] for m in fsdp[1:]], rel=1e-4), key


@pytest.mark.parametrize("mode", ["r2", "r3"])
def test_grpo_on_a_mixture_of_experts_with_routing_replay(tmp_path, mode):
    """recipes:grpo_tiny_moe (EP=2 over two Ray workers) with actor.routing_replay: the experts of the old-log-prob
    pass (r2) or of the rollout (r3) travel as a batch column and the actor's passes replay them, every step, while
    the rollout samples with the actor's weights."""
    from tests.support.run_configs import ODD_LENGTH_REWARD

    common = ("rollout.n=4", "actor.log_prob_micro_batch_size_per_device=4", ODD_LENGTH_REWARD)
    summary = _run(tiny_config("grpo_tiny_moe", str(tmp_path), *common, f"actor.routing_replay={mode}", steps=2))
    assert summary["steps"] == 2
    for r in _metrics(tmp_path):
        assert r["actor/moe/routes_replayed"] == 1.0 and r["actor/moe/load_max"] >= 1.0, r["step"]
        # (later mini-batches train on moved weights: the router's own choice drifts from the recorded one)
        assert 0.9 < r["actor/moe/routing_agreement"] <= 1.0, r["step"]
        assert 0 <= r["rollout/logprob_diff_max"] < 1e-4, r["step"]
