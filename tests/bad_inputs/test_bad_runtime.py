"""Bad input that only shows once `verl train` is running (a reward function's bug, data no prompt of which
fits): exit code 2, a message naming the culprit and how to go on, no traceback. Real runs (the local
controller: the same workers in this process), one step each."""

from __future__ import annotations

import pytest

from tests.support.fixtures import embedded_cache  # noqa: F401
from tests.support.run_configs import RECIPES, tiny_overrides
from verl import cli

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

REWARDS = "tests.support.run_configs"

# (id, overrides, texts the message must hold)
CASES = [
    (
        "reward_raises",
        [f"reward.fn={{_target_: {REWARDS}.raising_reward}}"],
        [f"reward function {REWARDS}.raising_reward raised ZeroDivisionError", "on batch row 0", "prompt: "],
    ),
    (
        "reward_returns_a_string",
        [f"reward.fn={{_target_: {REWARDS}.string_reward}}"],
        [f"reward function {REWARDS}.string_reward raised", "str", "on batch row 0"],
    ),
    ("no_prompt_fits", ["data.max_prompt_length=2"], ["all are longer than max_prompt_length=2"]),
]


@pytest.mark.parametrize("overrides, texts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_found_while_running_is_a_message(overrides, texts, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("VERL_DEBUG", raising=False)
    argv = [*tiny_overrides(str(tmp_path / "run"), steps=1), "trainer.controller=local", *overrides]
    code = cli.main(["train", str(RECIPES / "grpo_tiny.yaml"), *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code == 2, err
    for text in texts:
        assert text in err, err
    assert "the run stopped before its first checkpoint" in err and "--debug" in err


def test_an_undecodable_image_row_is_named(tmp_path, capsys, monkeypatch, embedded_cache):  # noqa: F811
    """Image prompts for the embedded vision-language model, one row's image bytes not an image: exit 2 naming the
    file, the row and the image."""
    import pandas as pd

    from verl.embedded.shapes import make_shapes_rows

    monkeypatch.delenv("VERL_DEBUG", raising=False)
    monkeypatch.setenv("VERL_CACHE", embedded_cache)
    rows = make_shapes_rows(3, split="train")
    rows[1]["images"] = [{"bytes": b"\x89PNG but not one"}]
    data = str(tmp_path / "images.parquet")
    pd.DataFrame(rows).to_parquet(data)
    overrides = ["model.path=embedded:tiny-qwen2.5-vl", f"data.train_files=[{data}]", "trainer.controller=local"]
    code = cli.main(["train", str(RECIPES / "grpo_tiny.yaml"), *tiny_overrides(str(tmp_path / "run"), 1), *overrides])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err, err
    assert f"{data}: row 1: image 0 of column 'images' cannot be decoded" in err, err


def test_a_weight_sync_that_changes_a_tensor_stops_the_run(tmp_path, capsys, monkeypatch):
    """A rollout with its own copy of the weights (a megatron actor's hf rollout) whose loader silently rounds one
    tensor through bf16: the check after the sync (rollout.verify_weights_every) names the parameter, rank and
    policy version, and the run stops with exit code 2 before generating with a policy nobody trains."""
    from verl_rollout.hf import HFRollout

    load = HFRollout.update_weights
    lost = "model.layers.1.mlp.down_proj.weight"

    def rounding(self, weights):
        return load(self, ((n, t.bfloat16().to(t.dtype) if n == lost else t) for n, t in weights))

    monkeypatch.setattr(HFRollout, "update_weights", rounding)
    monkeypatch.delenv("VERL_DEBUG", raising=False)
    argv = [*tiny_overrides(str(tmp_path / "run"), steps=2), "trainer.controller=local"]
    argv += ["actor.parallel.tp=1", "placement.devices_per_node=1"]
    code = cli.main(["train", str(RECIPES / "grpo_tiny_megatron.yaml"), *argv])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "after step 1's weight sync (policy version 1), the rollout does not hold what it was sent" in err, err
    assert f"{lost} on rank(s) 0: holds other values than it was sent" in err, err
    assert "Traceback" not in out + err
