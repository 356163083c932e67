"""Bad input that only shows once `verl train` is running (a reward function's bug, data no prompt of which
fits): exit code 2, a message naming the culprit and how to go on, no traceback. Real runs (the local
controller: the same workers in this process), one step each."""

from __future__ import annotations

import pytest

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
