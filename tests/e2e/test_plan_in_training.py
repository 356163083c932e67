"""The run's plan in training (local mode): each role's optimizer steps, critic.model_path, model.tokenizer_path,
rollout.val_temperature, and the Python API (`from verl import PPOTrainer`) that validates like the CLI."""

from __future__ import annotations

import shutil

import pytest
import torch

import verl
from tests.support.run_configs import RECIPES, odd_length_reward, tiny_config, tiny_overrides
from verl.embedded.models import materialize_embedded_model
from verl.utils.hf_files import TOKENIZER_GLOBS, copy_tokenizer_files
from verl.utils.lr_schedule import lr_multiplier

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


@pytest.fixture(autouse=True)
def _cache(embedded_cache, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VERL_CACHE", embedded_cache)


@pytest.fixture
def tiny_llama(embedded_cache):
    return materialize_embedded_model("tiny-llama", embedded_cache)


def _fit(trainer) -> tuple[dict, list[dict]]:
    import json
    import os

    with trainer:
        summary = trainer.fit()
    with open(os.path.join(trainer.cfg.trainer.output_dir, "logs", "metrics.jsonl")) as f:
        return summary, [json.loads(line) for line in f]


def test_the_critic_lr_schedule_spans_the_critics_own_optimizer_steps(tmp_path):
    cfg = tiny_config(
        "ppo_tiny",
        str(tmp_path),
        "trainer.controller=local",
        "actor.ppo_micro_batch_size_per_device=2",
        "critic.ppo_micro_batch_size_per_device=2",
        "critic.ppo_epochs=3",  # the actor keeps 1 epoch: the critic takes 3x its optimizer steps
        "critic.optim.scheduler=cosine",
        "critic.optim.lr=1e-3",
        "critic.optim.min_lr_ratio=0.0",
    )
    trainer = verl.PPOTrainer(cfg)
    # 4 prompts / mini-batches of 2 = 2 mini-batches per step; x 1 epoch (actor) or 3 (critic); x 2 steps.
    assert trainer.plan.optimizer_steps("actor") == 4 and trainer.plan.optimizer_steps("critic") == 12
    _, rows = _fit(trainer)
    # critic/lr is the mean over the step's 6 optimizer steps of the LR each one used (0-based step index).
    for step, row in enumerate(rows):
        expected = (
            1e-3
            * sum(
                lr_multiplier(i, warmup_steps=0, total_steps=12, scheduler="cosine", min_lr_ratio=0.0)
                for i in range(6 * step, 6 * step + 6)
            )
            / 6
        )
        assert row["critic/lr"] == pytest.approx(expected, rel=1e-6), step
    # Over the actor's 4 steps instead, the second training step would run at the schedule's floor (0).
    assert rows[1]["critic/lr"] > 1e-5


def _other_model(tiny_llama: str, tmp_path) -> str:
    """tiny-llama with every weight scaled: a different model with the same architecture and tokenizer."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    path = tmp_path / "other"
    model.save_pretrained(path)
    copy_tokenizer_files(tiny_llama, str(path))
    return str(path)


def _embedding(weights: dict) -> torch.Tensor:
    return next(v for k, v in weights.items() if k.endswith("embed_tokens.weight"))


def test_critic_model_path_loads_a_different_model(tmp_path, tiny_llama):
    other = _other_model(tiny_llama, tmp_path)
    cfg = tiny_config(
        "ppo_tiny",
        str(tmp_path / "run"),
        "trainer.controller=local",
        "actor.ppo_micro_batch_size_per_device=2",
        "critic.ppo_micro_batch_size_per_device=2",
        f"model.path={tiny_llama}",
        f"critic.model_path={other}",
    )
    with verl.PPOTrainer(cfg) as trainer:
        critic = trainer.workers.critic.call("engine_state")[0]["weights"]
        actor = trainer.workers.actor_rollout.call("actor_state")[0]
    from transformers import AutoModelForCausalLM

    want = AutoModelForCausalLM.from_pretrained(other).model.embed_tokens.weight.detach()
    assert torch.equal(_embedding(critic), want)
    assert torch.equal(_embedding(actor), 2 * want)  # the actor still starts from model.path


def test_tokenizer_path_is_where_the_tokenizer_comes_from(tmp_path, tiny_llama):
    """A model folder without tokenizer files trains when model.tokenizer_path points at them."""
    weights_only, tokenizer = tmp_path / "weights", tmp_path / "tokenizer"
    shutil.copytree(tiny_llama, weights_only)
    for pattern in TOKENIZER_GLOBS:
        for f in weights_only.glob(pattern):
            if f.name != "generation_config.json":
                f.unlink()
    tokenizer.mkdir()
    copy_tokenizer_files(tiny_llama, str(tokenizer))
    cfg = tiny_config(
        "grpo_tiny",
        str(tmp_path / "run"),
        "trainer.controller=local",
        f"model.path={weights_only}",
        f"model.tokenizer_path={tokenizer}",
        "checkpoint.save_hf=true",
        steps=1,
    )
    summary, rows = _fit(verl.PPOTrainer(cfg, reward_fn=odd_length_reward))
    assert summary["steps"] == 1 and "actor/pg_loss" in rows[-1]
    exported = {f.name for f in (tmp_path / "run" / "hf").glob("tokenizer*")}  # the export carries the tokenizer
    assert exported and exported == {f.name for f in tokenizer.glob("tokenizer*")}


def test_validation_samples_at_val_temperature(tmp_path):
    def scores_of_two_validations(temperature: float) -> tuple[float, float]:
        cfg = tiny_config(
            "grpo_tiny",
            str(tmp_path / str(temperature)),
            "trainer.controller=local",
            "data.val_files=[embedded:arithmetic-val]",
            f"rollout.val_temperature={temperature}",
        )
        # odd_length_reward scores the parity of each response's length
        with verl.PPOTrainer(cfg, reward_fn=odd_length_reward) as trainer:
            return trainer.validate()["val/score/mean"], trainer.validate()["val/score/mean"]

    first, second = scores_of_two_validations(0.0)
    assert first == second  # greedy: the same responses both times
    first, second = scores_of_two_validations(3.0)
    assert first != second  # sampled: ~200 held-out prompts answered differently


def test_the_python_api_takes_a_path_or_a_dict_and_validates_like_the_cli(tmp_path):
    assert isinstance(verl.__version__, str) and verl.__version__
    assert verl.load_config is verl.config.loader.load_config
    overrides = [*tiny_overrides(str(tmp_path), steps=1), "trainer.controller=local"]
    summary, _ = _fit(verl.PPOTrainer(RECIPES / "grpo_tiny.yaml", odd_length_reward, overrides=overrides))
    assert summary["steps"] == 1
    bad = {"data": {"train_batch_size": 6}, "actor": {"ppo_mini_batch_size": 4}, "trainer": {"controller": "rey"}}
    with pytest.raises(verl.ConfigError) as info:
        verl.PPOTrainer({"model": {"path": "embedded:tiny-llama"}, **bad}, overrides=["data.train_files=[x]"])
    keys = {p.key for p in info.value.problems}
    assert {"actor.ppo_mini_batch_size", "trainer.controller"} <= keys  # every problem at once, before anything starts


def test_the_documented_entry_points_run_as_documented(tmp_path):
    """get_config_from_yaml, PPOTrainer(config, reward_fn=...) with a reward on whole token rows, and .train()."""
    import json
    import os

    from verl import PPOTrainer
    from verl.utils.config import get_config_from_yaml

    overrides = [*tiny_overrides(str(tmp_path), steps=2), "trainer.controller=local"]
    config = get_config_from_yaml(str(RECIPES / "grpo_tiny.yaml"), overrides)

    calls = []

    def odd_tokens(input_ids, attention_mask):  # detected by its signature: whole rows in, a score per row out
        calls.append(tuple(input_ids.shape))
        return (attention_mask.sum(-1) % 2).float()

    with PPOTrainer(config, reward_fn=odd_tokens) as trainer:
        summary = trainer.train()
    assert summary["steps"] == 2 and len(calls) == 2
    with open(os.path.join(str(tmp_path), "logs", "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert all(0.0 <= r["reward/score/mean"] <= 1.0 for r in rows) and any(r["reward/score/mean"] > 0 for r in rows)


def test_rl_trainer_picks_the_trainer_and_profile_writes_a_trace_of_its_steps(tmp_path):
    """verl.RLTrainer as documented: the class algorithm.name selects; .train() runs it; trainer.profile traces
    the steps of its range (the driver's stages, Chrome trace format)."""
    import json

    from verl import DPOTrainer, PPOTrainer, RLTrainer, SFTTrainer

    sft = tiny_config(
        "sft_tiny", str(tmp_path / "sft"), "actor.ppo_mini_batch_size=4", "trainer.profile={steps: [2, 3]}", steps=3
    )
    with RLTrainer(sft) as trainer:
        assert type(trainer) is SFTTrainer
        assert trainer.train()["steps"] == 3
    trace = json.load(open(tmp_path / "sft" / "profile" / "stages.json"))["traceEvents"]
    spans = [(e["name"], e["args"]["step"]) for e in trace if e["ph"] == "X"]
    assert spans == [("step 2", 2), ("update", 2), ("step 3", 3), ("update", 3)]
    assert all(e["dur"] > 0 for e in trace if e["ph"] == "X")
    for recipe, cls in (("dpo_tiny", DPOTrainer), ("grpo_tiny", PPOTrainer)):
        with RLTrainer(tiny_config(recipe, str(tmp_path / recipe), "trainer.controller=local")) as trainer:
            assert type(trainer) is cls
