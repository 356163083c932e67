"""GRPO on a vision-language model end to end (local mode): the embedded tiny Qwen2.5-VL and Qwen3-VL on the embedded shapes task,
the FSDP actor and the hf rollout colocated; image prompts through generation, the old-log-prob pass, the update and
validation, the rollout's log-probs equal to the actor's."""

from __future__ import annotations

import json
import os

import pytest

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
