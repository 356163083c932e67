"""A seeded run repeats bit for bit on one machine and software: each kind of run twice, the same weights and every
logged metric (timings and throughput aside): grpo_tiny in-process (at one and at two threads), the megatron recipe
(TP=2 over two Ray workers) and the disaggregated one_step_off recipe (the rollout on a worker of its own)."""

from __future__ import annotations

import pytest
import torch

from tests.support.run_configs import ODD_LENGTH_REWARD, fit, tiny_config

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

MEASURED = ("timing/", "perf/", "memory/")  # wall-clock and memory readings, not results of the computation


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


RUNS = {
    "grpo_tiny": ("trainer.controller=local",),
    # the recipe's own batch (32 prompts x 8 packed by prompt) at two threads: before a prompt's shared position
    # was gathered with index_select (take_positions), its gradients were added in a thread-dependent order and two
    # runs parted at step 7-10
    "grpo_tiny@2threads": (
        "trainer.controller=local",
        "placement.threads_per_worker=2",
        "data.train_batch_size=32",
        "actor.ppo_mini_batch_size=16",
        "actor.ppo_micro_batch_size_per_device=128",
    ),
    "grpo_tiny_megatron": ("rollout.n=2",),
    "grpo_tiny_async": ("rollout.n=4",),
}


@pytest.mark.parametrize("recipe", list(RUNS))
def test_a_seeded_run_repeats_bit_for_bit(tmp_path, recipe):
    from safetensors.torch import load_file

    runs = []
    for name in ("first", "second"):
        out = tmp_path / name
        cfg = tiny_config(
            recipe.split("@")[0],
            str(out),
            "placement.threads_per_worker=1",
            *RUNS[recipe],
            "checkpoint.save_hf=true",
            ODD_LENGTH_REWARD,  # spread: every step moves the weights
            steps=12 if "@" in recipe else 6,
        )
        _, rows = fit(cfg)
        results = [{k: v for k, v in row.items() if k != "time" and not k.startswith(MEASURED)} for row in rows]
        runs.append((results, load_file(str(out / "hf" / "model.safetensors"))))
    (rows_a, weights_a), (rows_b, weights_b) = runs
    assert len(rows_a) in (6, 12) and rows_a == rows_b  # every metric of every step, exactly
    assert rows_a[-1]["actor/grad_norm"] > 0
    assert weights_a.keys() == weights_b.keys()
    for name, weight in weights_a.items():
        assert torch.equal(weight, weights_b[name]), name
