"""trainer.mode=async through the trainer: the rollout service generates ahead within the staleness bound, a
resumed run neither skips nor repeats prompts (the samples in flight at the checkpoint are generated anew), and
a replica that dies is reported by name. Real Ray actors: an FSDP actor worker and hf rollout replicas."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import pytest
import ray
import torch

from tests.support.agent_loops import TWO_TURNS
from tests.support.run_configs import RECORDING_REWARD, tiny_config
from verl.trainer.ppo import PPOTrainer
from verl.trainer.rollout_client import ReplicaFailed

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

ASYNC = ("trainer.mode=async", "trainer.max_staleness=2", "rollout.service_chunk_tokens=2", "rollout.n=4")


def _config(out, *overrides, steps=4):
    return tiny_config("grpo_tiny_async", str(out), RECORDING_REWARD, *ASYNC, *overrides, steps=steps)


def _fit(cfg) -> None:
    with PPOTrainer(cfg) as trainer:
        trainer.fit()


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, "logs", "metrics.jsonl"))]


def test_async_trains_within_the_bound_and_resumes_without_skipping_or_repeating(
    tmp_path, ray_three_cpus, embedded_cache, monkeypatch
):
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    save = ("checkpoint.save_every=2", "checkpoint.keep_last=2", "checkpoint.save_last=false")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    monkeypatch.setenv("VERL_TEST_PROMPT_LOG", str(tmp_path / "straight.prompts"))
    _fit(_config(straight, *save))
    rows = _rows(straight)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["async/staleness_max"] for r in rows][:1] == [0.0]
    assert all(r["async/staleness_max"] <= 2 for r in rows)  # trainer.max_staleness
    assert max(r["async/staleness_max"] for r in rows) >= 1  # it did run ahead
    assert all(r["async/regenerated"] == 0 for r in rows)
    assert [r["rollout/weight_version"] for r in rows] == [1.0, 2.0, 3.0, 4.0]

    # The step-2 checkpoint's data position is before batch 3 (the oldest in flight then): batches 3 and 4 were
    # generating (2 x 4 prompts x 4 samples) and are generated anew by a run resumed from it.
    checkpoint = straight / "checkpoints" / "step_2"
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    assert state["in_flight"] == 2 * 4 * 4 and state["ahead"] is None
    shutil.copytree(checkpoint, resumed / "checkpoints" / "step_2")  # as if the run was killed right after it
    monkeypatch.setenv("VERL_TEST_PROMPT_LOG", str(tmp_path / "resumed.prompts"))
    _fit(_config(resumed, *save))
    assert [r["step"] for r in _rows(resumed)] == [3, 4]

    # Steps 3 and 4 scored the same prompts in both runs (each step 4 prompts x 4 samples): none skipped, none twice.
    def per_step(path) -> list[Counter]:
        lines = open(path).read().splitlines()
        return [Counter(lines[i : i + 16]) for i in range(0, len(lines), 16)]

    assert per_step(tmp_path / "resumed.prompts") == per_step(tmp_path / "straight.prompts")[2:]


THREE_RANKS = (
    "placement.devices_per_node=3",
    "placement.pools=[{name: train, roles: [actor], devices: 1}, {name: gen, roles: [rollout], devices: 2}]",
)


def _train_past_a_dead_replica(trainer: PPOTrainer, steps: int = 3) -> list[dict]:
    """One step, then replica 1 killed, then `steps` more steps: their metrics."""
    trainer.train_step()
    trainer.step += 1
    ray.kill(trainer.workers.rollout.executor.actors[1], no_restart=True)
    rows = []
    for _ in range(steps):
        rows.append(trainer.train_step())
        trainer.step += 1
    return rows


def test_a_replica_that_dies_is_reported_by_name(tmp_path, ray_three_cpus, embedded_cache, monkeypatch):
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    monkeypatch.setenv("VERL_TEST_PROMPT_LOG", str(tmp_path / "prompts"))
    with PPOTrainer(_config(tmp_path, *THREE_RANKS)) as trainer:
        assert len(trainer.rollout.client.replicas) == 2
        trainer.train_step()
        trainer.step += 1
        ray.kill(trainer.workers.rollout.executor.actors[1], no_restart=True)
        with pytest.raises(ReplicaFailed, match=r"rollout replica 1 \(rank 1 of pool 'gen'\) failed") as err:
            trainer.train_step()
        assert err.value.replica == 1


def test_with_continue_the_run_goes_on_with_the_replicas_left(tmp_path, ray_three_cpus, embedded_cache, monkeypatch):
    """rollout.on_replica_failure=continue: the dead replica's requests go to the other, the transfer group is formed
    again without it, and training and validation (through the service) go on."""
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    monkeypatch.setenv("VERL_TEST_PROMPT_LOG", str(tmp_path / "prompts"))
    cfg = _config(
        tmp_path, *THREE_RANKS, "rollout.on_replica_failure=continue", "data.val_files=[embedded:arithmetic-val]"
    )
    with PPOTrainer(cfg) as trainer:
        before = trainer.validate()["val/n"]
        rows = _train_past_a_dead_replica(trainer)
        assert trainer.rollout.client.dead == [1] and trainer.workers.rollout_ranks == [0]
        assert [r["rollout/replicas"] for r in rows] == [1.0, 1.0, 1.0]
        assert [r["rollout/weight_version"] for r in rows] == [2.0, 3.0, 4.0]  # the live replica keeps up
        assert all(r["async/staleness_max"] <= 2 for r in rows)
        assert trainer.validate()["val/n"] == before  # every held-out prompt, on the replica left


def test_agent_loops_go_on_when_a_replica_dies_and_stop_by_name_when_none_may(
    tmp_path, ray_three_cpus, embedded_cache, monkeypatch
):
    """Agent loops over the service (each turn a request): with `continue`, a turn lost with the dead replica is
    generated again on the other and every trajectory still has its two turns; with `stop`, the run stops with
    the replica's name, not as an error of the agent loop."""
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    monkeypatch.setenv("VERL_TEST_PROMPT_LOG", str(tmp_path / "prompts"))
    agents = (TWO_TURNS, "data.max_response_length=16")
    with PPOTrainer(_config(tmp_path / "on", *THREE_RANKS, *agents, "rollout.on_replica_failure=continue")) as trainer:
        rows = _train_past_a_dead_replica(trainer)
        assert trainer.rollout.client.dead == [1]
        assert [r["agent/turns/mean"] for r in rows] == [2.0, 2.0, 2.0]
        assert [r["rollout/weight_version"] for r in rows] == [2.0, 3.0, 4.0]
    with PPOTrainer(_config(tmp_path / "stop", *THREE_RANKS, *agents)) as trainer:
        with pytest.raises(ReplicaFailed, match=r"rollout replica 1 \(rank 1 of pool 'gen'\) failed"):
            _train_past_a_dead_replica(trainer)


def test_the_client_streams_tokens_from_a_replica(tmp_path, embedded_cache, monkeypatch):
    """RolloutClient.stream over a real RolloutWorker (in-process): each poll hands out the tokens sampled since
    the last one, and the finished request holds them all, each with its log-prob and version."""
    from verl.config.plan import build_plan
    from verl.controller import local_group
    from verl.embedded.models import materialize_embedded_model
    from verl.trainer.rollout_client import RolloutClient
    from verl.workers.rollout import RolloutWorker

    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    # 48 turns of one token: the first poll comes long before the last turn (4 turns of 2 tokens could all finish
    # between the submit and the first poll on a loaded machine, leaving nothing to stream)
    cfg = _config(
        tmp_path,
        "placement.devices_per_node=1",
        "placement.pools=[{name: gen, roles: [rollout, actor]}]",
        "data.max_response_length=48",
    )
    model = materialize_embedded_model("tiny-llama", embedded_cache)
    group = local_group(None, RolloutWorker, cfg, build_plan(cfg, total_steps=1), model, role="rollout")
    try:
        group.call(RolloutWorker.init_model)
        client = RolloutClient(group, chunk=1, max_batch=8)
        client.submit([{"id": f"r{i}", "prompt": [1, 5 + i, 6], "temperature": 1.0} for i in range(4)])
        streamed, done = {}, {}
        while len(done) < 4:
            finished, updates = client.stream(0.5)
            for u in updates:
                streamed.setdefault(u.id, []).extend(u.tokens)
            done.update({f.id: f for f in finished})
    finally:
        group.shutdown()
    for rid, f in done.items():
        assert f.tokens[: len(streamed.get(rid, []))] == streamed.get(rid, [])
        assert len(f.log_probs) == len(f.versions) == len(f.tokens) and set(f.versions) == {0}
    assert any(streamed.values())  # an untrained model rarely ends early: up to 48 turns of a token each
