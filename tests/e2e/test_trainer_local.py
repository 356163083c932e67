"""PPOTrainer end to end in local mode (same workers, in-process): GRPO and PPO with critic, ref and KL."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.run_configs import odd_length_reward, tiny_config
from verl.trainer.ppo import PPOTrainer

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


def _run(cfg):
    with PPOTrainer(cfg) as trainer:
        summary = trainer.fit()
    return summary


def _metrics(out_dir):
    with open(os.path.join(out_dir, "logs", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_grpo_steps_log_grouped_metrics_and_checkpoint(tmp_path):
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path),
        "trainer.controller=local",
        "rollout.n=4",
        "data.val_files=[embedded:arithmetic-val]",
        "data.val_batch_size=50",
        "trainer.val_before_train=true",  # and val_every=0: validated before and at the end only
    )
    summary = _run(cfg)
    assert summary["steps"] == 2
    rows = _metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2] and "val/accuracy" not in rows[1]
    # The summary's "after" is a validation of the final weights, not the "before" repeated.
    assert summary["val_accuracy_before"] == rows[0]["val/accuracy"]
    assert summary["val_accuracy_after"] == rows[-1]["val/accuracy"]
    rows = rows[1:]
    keys = set(rows[-1])
    for key in (
        "reward/score/mean",
        "actor/pg_loss",
        "actor/entropy",
        "actor/pg_clipfrac",
        "actor/grad_norm",
        "actor/lr",
        "timing/gen_s",
        "timing/update_s",
        "timing/step_s",
        "perf/tokens_per_s",
        "perf/weight_sync_bytes",
    ):
        assert key in keys, key
    assert "critic/vf_loss" not in keys  # no critic in GRPO (critic/score etc. are batch statistics)
    # The colocated hf rollout generates with the actor's own weights: nothing to move, and the trainer's
    # log-probs of the sampled tokens are the rollout's (up to float rounding in another batch shape).
    assert rows[-1]["perf/weight_sync_bytes"] == 0
    for row in rows:
        assert 0 <= row["rollout/logprob_diff_mean"] <= row["rollout/logprob_diff_max"] < 1e-4
    assert os.path.exists(tmp_path / "checkpoints" / "step_2" / "COMPLETE")


def test_ppo_with_critic_reference_and_kl_in_reward(tmp_path):
    """Also with every role's offload switches on: each phase brings back what it needs (the engine contract
    checks the results are bitwise those without offload)."""
    cfg = tiny_config(
        "ppo_tiny",
        str(tmp_path),
        "trainer.controller=local",
        "actor.ppo_micro_batch_size_per_device=2",  # a mini-batch of 2 prompts x n=1 is 2 rows
        "critic.ppo_micro_batch_size_per_device=2",
        *(f"{key}=true" for key in ("actor.param_offload", "actor.optimizer_offload", "ref.param_offload")),
        *(f"{key}=true" for key in ("critic.param_offload", "critic.optimizer_offload")),
        "algorithm.kl_ctrl.kl_coef=0.1",  # a penalty large enough to see in the rewards
        steps=4,
    )
    _run(cfg)
    rows = _metrics(tmp_path)
    row = rows[-1]
    for key in ("critic/vf_loss", "critic/grad_norm", "actor/reward_kl", "actor/reward_kl_coef", "actor/pg_loss"):
        assert key in row, key
    # The KL penalty: nothing at step 1 (the actor is the reference), then the rewards are the scores minus it.
    first, later = rows[0], rows[1:]
    assert first["actor/reward_kl"] == 0 and first["critic/rewards/mean"] == first["critic/score/mean"]
    for r in later:
        assert r["actor/reward_kl"] != 0 and r["critic/rewards/mean"] != pytest.approx(r["critic/score/mean"], abs=1e-9)
    # The critic learns: its loss falls from the first step's (random values) to the last.
    assert rows[-1]["critic/vf_loss"] < 0.5 * first["critic/vf_loss"], [r["critic/vf_loss"] for r in rows]
    # peak memory of each phase of the step (CPU: the process's resident set, here the driver's own)
    for phase in ("gen", "log_probs", "update", "values", "critic_update"):
        assert 0.1 < row[f"memory/{phase}_peak_gib"] < 24, phase
    ckpt = tmp_path / "checkpoints" / "step_4"
    assert (ckpt / "actor").is_dir() and (ckpt / "critic").is_dir()


def test_dapo_dynamic_sampling_and_overlong_penalty(tmp_path):
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path),
        "trainer.controller=local",
        "rollout.n=4",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=8",
        "algorithm.overlong_buffer.enable=true",
        "algorithm.overlong_buffer.len=4",
        "actor.clip_ratio_high=0.28",
    )
    with PPOTrainer(cfg, reward_fn=odd_length_reward) as trainer:
        trainer.fit()
    row = _metrics(tmp_path)[-1]
    assert row["actor/kept_groups"] == 4  # data.train_batch_size groups survive, after enough rollout batches
    # Every rollout batch brings 4 groups: reaching 4 informative ones took as many batches as the drops cost.
    assert row["actor/gen_batches"] >= 1 + row["actor/filtered_groups"] // 4
    # An untrained model's responses run past max_response_length - overlong_buffer.len: they are penalised.
    assert row["reward/overlong_penalty_mean"] < 0


def test_remax_gets_greedy_baselines(tmp_path):
    """Each prompt's baseline is the reward of its greedy response under the current policy: checked, when the
    trainer adds them, against a greedy decode by hand (transformers' generate on the actor's module)."""
    import torch

    checked = []

    class CheckedPPOTrainer(PPOTrainer):
        def add_greedy_baselines(self, prompts, batch):
            super().add_greedy_baselines(prompts, batch)
            model = self.workers.actor_rollout.executor.worker.actor.model
            ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=False,
                    max_new_tokens=self.plan.response_length,
                    eos_token_id=self.tokenizer.eos_token_id,
                    pad_token_id=self.tokenizer.pad_token_id,
                )
            greedy = self.tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
            by_hand = torch.tensor([odd_length_reward("", text, "", {}) for text in greedy])
            checked.append((batch.batch["reward_baselines"], by_hand.repeat_interleave(self.cfg.rollout.n), greedy))

    cfg = tiny_config(
        "grpo_tiny", str(tmp_path), "trainer.controller=local", "algorithm.adv_estimator=remax", "rollout.n=2"
    )
    with CheckedPPOTrainer(cfg, reward_fn=odd_length_reward) as trainer:
        summary = trainer.fit()
    assert summary["steps"] == 2 and len(checked) == 2
    for baselines, by_hand, greedy in checked:
        assert baselines.tolist() == by_hand.tolist(), greedy
    # Not all alike (else the check would hold for a constant): the greedy responses' lengths differ in parity.
    assert len({b for baselines, _, _ in checked for b in baselines.tolist()}) == 2


def test_an_on_policy_update_takes_its_old_log_probs_from_its_own_forward(tmp_path):
    """1 epoch of 1 mini-batch: the log-prob pass before the update is skipped (one worker call fewer a step),
    and the update matches the run that makes the pass."""
    from safetensors.torch import load_file
    from torch.testing import assert_close

    common = (
        "trainer.controller=local",
        "rollout.n=4",
        "actor.ppo_mini_batch_size=4",  # = data.train_batch_size: one optimizer step per training step
        "checkpoint.save_hf=true",
        "reward.fn={_target_: tests.support.run_configs.odd_length_reward}",  # spread: the update moves weights
    )
    runs = {}
    for mode in ("auto", "always"):
        out = tmp_path / mode
        cfg = tiny_config("grpo_tiny", str(out), *common, f"actor.recompute_old_log_probs={mode}", steps=1)
        with PPOTrainer(cfg) as trainer:
            assert trainer.plan.old_log_probs == ("update" if mode == "auto" else "recompute")
            trainer.fit()
        runs[mode] = (_metrics(out)[-1], load_file(str(out / "hf" / "model.safetensors")))
    (skip, skip_weights), (full, full_weights) = runs["auto"], runs["always"]
    assert skip["perf/worker_calls"] == full["perf/worker_calls"] - 1
    assert skip["actor/pg_loss"] == pytest.approx(full["actor/pg_loss"], abs=1e-6)
    assert skip["rollout/logprob_diff_mean"] == pytest.approx(full["rollout/logprob_diff_mean"], abs=1e-5)
    assert skip["rollout/logprob_diff_mean"] < 1e-4  # measured by the update, on the same tokens
    for name, weight in full_weights.items():
        assert_close(skip_weights[name], weight, rtol=1e-4, atol=1e-6)


def test_entropy_at_an_interval_and_a_finished_run_is_said_and_kept(tmp_path, capsys):
    """entropy_coeff 0: entropy is a metric, measured on the first, the last and every entropy_every-th step.
    A rerun into the finished run's folder trains nothing and says so; one with another learning rate is
    refused before anything starts."""
    from verl.config.errors import ConfigError

    common = ("trainer.controller=local", "rollout.n=2", "actor.entropy_every=3")
    _run(tiny_config("grpo_tiny", str(tmp_path), *common, steps=4))
    assert [("actor/entropy" in r) for r in _metrics(tmp_path)] == [True, False, True, True]
    capsys.readouterr()
    again = _run(tiny_config("grpo_tiny", str(tmp_path), *common, steps=4))
    assert "that run is finished (trainer.total_steps=4): nothing to train" in capsys.readouterr().out
    assert again["steps"] == 4 and len(_metrics(tmp_path)) == 4
    with pytest.raises(ConfigError) as e:
        PPOTrainer(tiny_config("grpo_tiny", str(tmp_path), *common, "actor.optim.lr=3e-4", steps=4))
    assert "trainer.resume" in str(e.value) and "actor.optim.lr was" in str(e.value)


def test_lora_actor_and_critic_with_the_reference_from_the_actor(tmp_path):
    """actor.lora / critic.lora through the trainer: the reference is the actor with its adapters off (no model
    of its own), so the first step's KL is exactly 0 (the adapters start as the base) and later ones are not."""
    cfg = tiny_config(
        "ppo_tiny",
        str(tmp_path),
        "trainer.controller=local",
        "actor.ppo_micro_batch_size_per_device=2",
        "critic.ppo_micro_batch_size_per_device=2",
        "actor.lora.rank=4",
        "actor.optim.lr=1e-2",
        "critic.lora.rank=4",
    )
    with PPOTrainer(cfg) as trainer:
        assert trainer.plan.ref_from_actor
        trainer.fit()
    rows = _metrics(tmp_path)
    assert abs(rows[0]["actor/reward_kl"]) < 1e-6
    assert abs(rows[-1]["actor/reward_kl"]) > 0
    assert (tmp_path / "checkpoints" / "step_2" / "actor").is_dir()


def test_held_out_pass_at_k_mean_and_majority_recomputed_from_the_scored_samples(tmp_path, monkeypatch, capsys):
    """rollout.val_n=4: every held-out sample's response is logged as it is scored; pass@k (by counting every
    k-draw), mean@4 and maj@4 recomputed from that log equal the logged metrics, overall and per data source."""
    from itertools import combinations

    import pandas as pd

    from verl.embedded.arithmetic import make_arithmetic_rows

    rows = make_arithmetic_rows(12, seed=0, split="val")
    for i, row in enumerate(rows):
        row["data_source"] = "sums_a" if i % 3 else "sums_b"
    val = tmp_path / "val.parquet"
    pd.DataFrame(rows).to_parquet(val)
    log = tmp_path / "samples.jsonl"
    monkeypatch.setenv("VERL_TEST_SAMPLE_LOG", str(log))
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path / "run"),
        "trainer.controller=local",
        f"data.val_files=[{val}]",
        "rollout.val_n=4",
        "reward.fn={_target_: tests.support.run_configs.logged_odd_length_reward}",
        steps=1,
    )
    summary = _run(cfg)
    m = _metrics(tmp_path / "run")[-1]
    scored = [json.loads(line) for line in open(log)]
    greedy, sampled = scored[-5 * 12 : -4 * 12], scored[-4 * 12 :]  # the last validation: 12 greedy, then 12 x 4
    assert m["val/accuracy"] == sum(len(r) % 2 for _, r in greedy) / 12 and m["val/n"] == 12
    groups = [sampled[i : i + 4] for i in range(0, 48, 4)]
    assert all(len({s for s, _ in g}) == 1 for g in groups)  # a prompt's 4 samples are adjacent
    for source, prefix in ((None, "val"), ("sums_a", "val/sums_a"), ("sums_b", "val/sums_b")):
        mine = [g for g in groups if source is None or g[0][0] == source]
        right = [[len(r) % 2 == 1 for _, r in g] for g in mine]
        for k in (1, 2, 4):
            draws = list(combinations(range(4), k))
            expected = sum(sum(any(rr[i] for i in d) for d in draws) / len(draws) for rr in right) / len(mine)
            assert m[f"{prefix}/pass@{k}"] == pytest.approx(expected, abs=1e-12), (prefix, k)
        assert m[f"{prefix}/mean@4"] == pytest.approx(sum(map(sum, right)) / (4 * len(mine)))
        votes = [max(dict.fromkeys(r for _, r in g), key=[r for _, r in g].count) for g in mine]
        assert m[f"{prefix}/maj@4"] == pytest.approx(sum(len(v) % 2 for v in votes) / len(mine))
    assert 0 < m["val/pass@4"] and m["val/pass@1"] < 1  # (samples both right and wrong: the check can fail)
    assert summary["val_sampled_after"]["pass@4"] == m["val/pass@4"]
    from verl.trainer.summary import format_summary

    assert f"pass@4 {100 * m['val/pass@4']:.1f}%" in format_summary("x", summary)
