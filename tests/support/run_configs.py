"""Small end-to-end configs for trainer tests: the tiny recipes, shrunk to seconds."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from verl.config.loader import load_config

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def tiny_overrides(out_dir: str, steps: int = 2) -> tuple[str, ...]:
    """A random (un-warm-started) model, 4 prompts a step, no validation, metrics to jsonl only."""
    return (
        f"trainer.total_steps={steps}",
        f"trainer.output_dir={out_dir}",
        "data.val_files=[]",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "model.warm_start=null",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=2",
        "actor.ppo_micro_batch_size_per_device=4",
        "tracking.loggers=[jsonl]",
    )


def tiny_config(recipe: str, out_dir: str, *overrides: str, steps: int = 2) -> DictConfig:
    """recipes/<recipe>.yaml shrunk by `tiny_overrides`, then `overrides`."""
    return load_config(RECIPES / f"{recipe}.yaml", [*tiny_overrides(out_dir, steps), *overrides])


def fit(cfg: DictConfig) -> tuple[dict, list[dict]]:
    """Train with `cfg` in this process's driver; returns the summary and the per-step metrics (jsonl rows)."""
    import json
    import os

    from verl.trainer.registry import RLTrainer

    with RLTrainer(cfg) as trainer:  # the trainer algorithm.name picks
        summary = trainer.fit()
    with open(os.path.join(cfg.trainer.output_dir, "logs", "metrics.jsonl")) as f:
        return summary, [json.loads(line) for line in f]


def odd_length_reward(prompt: str, response: str, ground_truth: str, extra: dict) -> float:
    """A reward with spread on an untrained model (whose answers are never right): 1 for odd-length responses.
    Without spread every GRPO advantage is 0 and a step changes nothing."""
    return float(len(response) % 2)


# For `verl train` in a child process: the same reward as a recipe override.
ODD_LENGTH_REWARD = "reward.fn={_target_: tests.support.run_configs.odd_length_reward}"


def raising_reward(prompt: str, response: str, ground_truth: str, extra: dict) -> float:
    """A reward function with a bug: what a run must report by sample, not as a traceback."""
    return 1.0 / 0


def string_reward(prompt: str, response: str, ground_truth: str, extra: dict) -> str:
    """A reward function returning the wrong type."""
    return "correct"


def recording_reward(prompt: str, response: str, ground_truth: str, extra: dict) -> float:
    """odd_length_reward, also appending each scored prompt to the file $VERL_TEST_PROMPT_LOG (what a run trained
    on, in order of scoring)."""
    import os

    with open(os.environ["VERL_TEST_PROMPT_LOG"], "a") as f:
        f.write(prompt.replace("\n", " ") + "\n")
    return float(len(response) % 2)


RECORDING_REWARD = "reward.fn={_target_: tests.support.run_configs.recording_reward}"


def logged_odd_length_reward(prompt: str, response: str, ground_truth: str, extra: dict) -> float:
    """odd_length_reward, also appending each sample's data source and response to $VERL_TEST_SAMPLE_LOG (JSON
    lines, in order of scoring): what a test recomputes held-out metrics from."""
    import json
    import os

    with open(os.environ["VERL_TEST_SAMPLE_LOG"], "a") as f:
        f.write(json.dumps([extra["data_source"], response]) + "\n")
    return float(len(response) % 2)
