"""GRPO on a vision-language model end to end (local mode): the embedded tiny Qwen2.5-VL and Qwen3-VL on the embedded shapes task,
the FSDP actor and the hf rollout colocated; image prompts through generation, the old-log-prob pass, the update and
validation, the rollout's log-probs equal to the actor's."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.support.fixtures import ray_four_cpus  # noqa: F401
from tests.support.run_configs import ODD_LENGTH_REWARD, tiny_config
from verl.trainer.ppo import PPOTrainer

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


@pytest.mark.parametrize("model", ["tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_grpo_steps_on_image_prompts(tmp_path, embedded_cache, monkeypatch, model):
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path),
        "trainer.controller=local",
        f"model.path=embedded:{model}",
        "data.train_files=[embedded:shapes]",
        "data.val_files=[embedded:shapes-val]",
        "data.val_batch_size=100",
        "trainer.val_before_train=true",
        "data.max_prompt_length=32",
        "data.max_response_length=6",
        "rollout.n=4",
        "actor.recompute_old_log_probs=always",  # (a pass of its own: the rollout/actor mismatch is measured)
        ODD_LENGTH_REWARD,  # (the untrained model never counts right: rewards with spread, so the steps move it)
    )
    with PPOTrainer(cfg) as trainer:
        assert trainer.processor is not None
        summary = trainer.fit()
        batch = trainer.train_loader.collate([trainer.train_loader.dataset[i] for i in range(2)])
    assert summary["steps"] == 2 and len(batch.non_tensor_batch["multi_modal_inputs"]) == 2
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "logs", "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[0]["val/n"] == 200 == rows[-1]["val/n"]
    for row in rows[1:]:
        assert row["rollout/logprob_diff_max"] < 1e-4, row["rollout/logprob_diff_max"]
        assert row["actor/grad_norm"] > 0


def test_one_step_off_sends_the_vision_tower_to_rollout_replicas(tmp_path, ray_four_cpus, embedded_cache, monkeypatch):  # noqa: F811
    """trainer.mode=one_step_off with image prompts: two FSDP ranks train, two hf rollout replicas on a pool of their
    own generate the next batch; after each step's sync both replicas hold the actor's weights bitwise, the vision
    tower's too; the first batch's log-probs are the trainer's, later ones one update old."""
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from verl.workers.rollout import RolloutWorker

    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    cfg = tiny_config(
        "grpo_tiny_async",
        str(tmp_path),
        "model.path=embedded:tiny-qwen2.5-vl",
        "data.train_files=[embedded:shapes]",
        "data.val_files=[embedded:shapes-val]",
        "data.max_prompt_length=32",
        "data.max_response_length=6",
        "rollout.n=4",
        "checkpoint.save_last=false",
        "actor.recompute_old_log_probs=always",
        "placement.devices_per_node=4",
        "placement.pools=[{name: train, roles: [actor], devices: 2}, {name: gen, roles: [rollout], devices: 2}]",
        ODD_LENGTH_REWARD,
        steps=2,
    )
    from transformers import AutoModelForImageTextToText

    from verl.embedded.models import materialize_embedded_model
    from verl_rollout.hf_weights import renames

    # the actor streams checkpoint names (visual.*, model.layers.*); the replicas' modules hold them renamed
    model = AutoModelForImageTextToText.from_pretrained(materialize_embedded_model("tiny-qwen2.5-vl", embedded_cache))
    param_of = renames(model)
    rows = []
    with PPOTrainer(cfg) as trainer:
        for _ in range(2):
            rows.append(trainer.train_step())
            trainer.step += 1
            actor = trainer.workers.actor_rollout.call(ActorRolloutRefWorker.actor_state)[0]
            assert any(name.startswith("visual.") for name in actor)
            for replica in trainer.workers.rollout.call(RolloutWorker.rollout_state):
                assert len(replica) == len(actor)
                for name in actor:
                    assert torch.equal(replica[param_of.get(name, name)], actor[name]), name
            assert rows[-1]["weight_sync/checked_params"] == 2 * len(actor)  # both replicas, every parameter
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0]
    assert rows[0]["rollout/logprob_diff_max"] < 1e-5 < rows[1]["rollout/logprob_diff_max"]
