"""Reward sources in a run: a client of the run's reward server (reward.server), a process of its own, posting
scores or preferences (online DPO trains on the pairs it prefers); scores that do not come (on_timeout=default); a
sequence-classification reward model with a tokenizer of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.support import reward_client  # noqa: F401 (run as a child process: imported so the file ships with the test)
from tests.support.reward_client import preferred_key
from tests.support.run_configs import fit, tiny_config

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


@pytest.fixture(autouse=True)
def _env(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    monkeypatch.setenv("VERL_REWARD_TOKEN", "run-token")


def _client(tmp_path, *mode: str) -> subprocess.Popen:
    """tests.support.reward_client in a process of its own, answering the run in `tmp_path`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.Popen([sys.executable, "-m", "tests.support.reward_client", str(tmp_path), *mode], env=env)


def test_a_run_trains_on_scores_posted_by_a_separate_client(tmp_path):
    client = _client(tmp_path)
    try:
        cfg = tiny_config(
            "grpo_tiny",
            str(tmp_path),
            "trainer.controller=local",
            "rollout.n=4",
            "reward.fn=null",
            "reward.server={timeout_s: 60}",
        )
        _, metrics = fit(cfg)
    finally:
        client.kill()
        client.wait()
    for m in metrics:
        assert m["reward/server_scored"] == 16 and m["reward/server_missing"] == 0  # 4 prompts x 4 samples
        assert 0 < m["reward/score/mean"] < 1  # the client's odd-length scores: a random model's lengths vary
    lines = (tmp_path / "reward_server" / "scores.jsonl").read_text().splitlines()
    assert len(lines) == 32  # every accepted score, persisted


def test_online_dpo_trains_on_the_pairs_a_separate_client_prefers(tmp_path):
    from verl.trainer.dpo import OnlineDPOTrainer

    class RecordingTrainer(OnlineDPOTrainer):
        """OnlineDPOTrainer, keeping the (uid, chosen text, rejected text) of each pair it updates on."""

        pairs: list = []

        def update_pairs(self, batch):
            mask = batch.batch["response_mask"].bool()
            texts = self.tokenizer.batch_decode(
                [row[m].tolist() for row, m in zip(batch.batch["responses"], mask)], skip_special_tokens=True
            )
            uids = batch.non_tensor_batch["uid"]
            assert batch.batch["is_chosen"].tolist() == [1, 0] * (len(batch) // 2)
            self.pairs += [(uids[i], texts[i], texts[i + 1]) for i in range(0, len(batch), 2)]
            return super().update_pairs(batch)

    client = _client(tmp_path, "preferences")
    try:
        cfg = tiny_config(
            "dpo_tiny",
            str(tmp_path),
            "algorithm.name=online_dpo",
            "data.train_files=[embedded:arithmetic]",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=4",
            "reward.fn=null",
            "reward.server={timeout_s: 60, feedback: preferences}",
        )
        with RecordingTrainer(cfg) as trainer:
            trainer.fit()
    finally:
        client.kill()
        client.wait()
    metrics = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    for m in metrics:
        assert m["reward/server_scored"] == 16 and m["reward/server_missing"] == 0  # 4 prompts x 4 samples
        assert m["reward/server_preferences"] == 4 * 6  # every two samples of each group compared
        # a strict order's Copeland scores: 3, 1, -1, -3; every group has a pair, at 3 - (-3)
        assert m["dpo/pairs"] == 4 and m["dpo/tied_groups"] == 0 and m["dpo/score_gap"] == 6
    # Each trained pair: the group's most preferred response (the client's order) chosen, the least one rejected.
    samples = [json.loads(line) for line in (tmp_path / "reward_server" / "samples.jsonl").read_text().splitlines()]
    groups = {}
    for row in samples:
        groups.setdefault(row["group"].split("-", 1)[1], []).append(row["response"])  # (group: "<run>-<uid>")
    assert len(RecordingTrainer.pairs) == 8 and len(groups) == 8
    for uid, chosen, rejected in RecordingTrainer.pairs:
        assert chosen == max(groups[uid], key=preferred_key) and rejected == min(groups[uid], key=preferred_key)
    assert len((tmp_path / "reward_server" / "preferences.jsonl").read_text().splitlines()) == 48


def test_scores_that_do_not_come_are_the_default_score(tmp_path):
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path),
        "trainer.controller=local",
        "rollout.n=2",
        "reward.fn=null",
        "reward.server={timeout_s: 0.2, on_timeout: default, default_score: 0.5}",
        steps=1,
    )
    _, metrics = fit(cfg)
    assert metrics[0]["reward/server_missing"] == 8 and metrics[0]["reward/score/mean"] == 0.5


@pytest.mark.parametrize("where", ["driver", "hybrid pool"])
def test_a_reward_model_with_its_own_tokenizer_scores_a_grpo_run(tmp_path, where):
    """In the driver, or as the reward role listed in the hybrid pool: a worker of its own beside the actor's (here
    in this process)."""
    from tests.support.fixtures import build_reward_model

    rm = build_reward_model(tmp_path / "rm")
    placed = ["placement.pools=[{name: hybrid, roles: [actor, rollout, ref, reward]}]"] if where != "driver" else []
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path / "run"),
        "trainer.controller=local",
        "rollout.n=4",
        "reward.fn=null",
        f"reward.model={{_target_: verl.reward.hf_model.HFRewardModel, path: {rm}, batch_size: 8}}",
        *placed,
        steps=1,
    )
    _, (m,) = fit(cfg)
    assert m["reward/score/mean"] == pytest.approx(m["reward/model_score/mean"], abs=1e-6)
    assert m["reward/score/max"] > m["reward/score/min"]  # the model tells the samples apart
    assert m["actor/pg_loss"] != 0 or m["actor/grad_norm"] > 0


def test_a_reward_model_on_a_pool_of_its_own_scores_as_in_the_driver(tmp_path):
    """The reward role on two Ray workers of its own: each batch split over them (5 rows as 3 + 2), the same
    scores as the model in this process, and a run trained on them."""
    from tests.support.fixtures import build_reward_model
    from verl.reward.hf_model import HFRewardModel
    from verl.trainer.registry import RLTrainer

    rm = build_reward_model(tmp_path / "rm")
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path / "run"),
        "trainer.controller=ray",
        "rollout.n=4",
        "reward.fn=null",
        f"reward.model={{_target_: verl.reward.hf_model.HFRewardModel, path: {rm}, batch_size: 4}}",
        "placement.devices_per_node=3",
        "placement.pools=[{name: hybrid, roles: [actor, rollout, ref], devices: 1}, {name: rm, roles: [reward]}]",
        steps=1,
    )
    with RLTrainer(cfg) as trainer:
        assert trainer.plan.layout("reward").dp == 2 and trainer.workers.reward.world_size == 2
        conversations = [[{"role": "user", "content": f"{a}+{a}="}] for a in range(5)]
        responses = ["2", "4", "six", "8", "10 and more"]
        pooled = trainer.workers.reward_model.score_texts(conversations, responses)
        local = HFRewardModel(str(rm), batch_size=4).score_texts(conversations, responses)
        assert pooled.shape == (5,) and torch.allclose(pooled.float(), local, atol=1e-5)
        trainer.fit()
    with open(tmp_path / "run" / "logs" / "metrics.jsonl") as f:
        (m,) = [json.loads(line) for line in f]
    assert m["reward/score/mean"] == pytest.approx(m["reward/model_score/mean"], abs=1e-6)
    assert m["reward/score/max"] > m["reward/score/min"]


def test_a_generative_judge_scores_a_grpo_run(tmp_path):
    """An LLM judge (reward.model: GenerativeJudge) generating through the hf rollout engine; its counts reach the
    run's metrics as reward/model/judge/*."""
    from tests.support.fixtures import build_judge_model

    judge = build_judge_model(tmp_path / "judge")
    spec = (
        f"{{_target_: verl.reward.judge.GenerativeJudge, path: {judge}, template: 'Q: {{question}} A: {{response}}',"
        " score_pattern: '(\\d)', max_new_tokens: 4}"  # the random judge writes digits now and then
    )
    overrides = ("trainer.controller=local", "rollout.n=4", "reward.fn=null", f"reward.model={spec}")
    cfg = tiny_config("grpo_tiny", str(tmp_path / "run"), *overrides)
    _, metrics = fit(cfg)
    assert len(metrics) == 2
    for m in metrics:
        assert m["reward/score/mean"] == pytest.approx(m["reward/model_score/mean"], abs=1e-6)
        assert 0 <= m["reward/model/judge/unparsed"] < 16  # of 4 prompts x 4 samples, some parsed
        assert m["reward/model/judge/mean_output_tokens"] == 4  # the random judge never writes its eos in 4 tokens
        assert m["reward/score/max"] > m["reward/score/min"]  # the judge tells the samples apart
        assert m["actor/pg_loss"] != 0 or m["actor/grad_norm"] > 0
