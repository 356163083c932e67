"""A GRPO run scored by a client of its reward server (reward.server), the client a process of its own; and a run
whose scores do not come, under on_timeout=default."""

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
