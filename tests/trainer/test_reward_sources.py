"""Reward sources in a run: a client of the run's reward server (reward.server), a process of its own; scores that
do not come (on_timeout=default); a sequence-classification reward model with a tokenizer of its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import reward_client  # noqa: F401 (run as a child process: imported so the file ships with the test)
from tests.support.run_configs import fit, tiny_config

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


@pytest.fixture(autouse=True)
def _env(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    monkeypatch.setenv("VERL_REWARD_TOKEN", "run-token")


def test_a_run_trains_on_scores_posted_by_a_separate_client(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    client = subprocess.Popen([sys.executable, "-m", "tests.support.reward_client", str(tmp_path)], env=env)
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


def test_a_reward_model_with_its_own_tokenizer_scores_a_grpo_run(tmp_path):
    from tests.support.fixtures import build_reward_model

    rm = build_reward_model(tmp_path / "rm")
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path / "run"),
        "trainer.controller=local",
        "rollout.n=4",
        "reward.fn=null",
        f"reward.model={{_target_: verl.reward.hf_model.HFRewardModel, path: {rm}, batch_size: 8}}",
    )
    _, metrics = fit(cfg)
    for m in metrics:
        assert m["reward/score/mean"] == pytest.approx(m["reward/model_score/mean"], abs=1e-6)
        assert m["reward/score/max"] > m["reward/score/min"]  # the model tells the samples apart
        assert m["actor/pg_loss"] != 0 or m["actor/grad_norm"] > 0
