"""The trainers' shape: the loop reads like the algorithm, whatever kind of run it is.

The kind of run (sync, one step off, async, agent loops; a rollout on the actor's devices or on its own) is the
rollout source's business (`verl.trainer.rollout_source`); no trainer tests it. DPO and SFT extend the shared base,
not PPO; every trainer is a context manager."""

from __future__ import annotations

import ast
import pathlib

import pytest

import verl.trainer
from verl.trainer.base import Trainer
from verl.trainer.dpo import DPOTrainer, OnlineDPOTrainer
from verl.trainer.ppo import PPOTrainer
from verl.trainer.sft_trainer import SFTTrainer

TRAINER_DIR = pathlib.Path(verl.trainer.__file__).parent
TRAINER_FILES = ("base.py", "ppo.py", "dpo.py", "sft_trainer.py")
# What a branch on the kind of run reads: the schedule, the agent loops, where the rollout runs.
KIND_OF_RUN = ("mode", "async", "agent", "workers.rollout", "rollout_apart", "algorithm.name", "plan.trainer")


def _dotted(node: ast.AST) -> list[str]:
    """The dotted names (self.plan.mode, cfg.trainer.mode, ...) and string constants a condition reads."""
    names = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            parts, at = [sub.attr], sub.value
            while isinstance(at, ast.Attribute):
                parts.append(at.attr)
                at = at.value
            if isinstance(at, ast.Name):
                parts.append(at.id)
            names.append(".".join(reversed(parts)))
        elif isinstance(sub, ast.Name):
            names.append(sub.id)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            names.append(sub.value)
    return names


def _conditions(tree: ast.AST) -> list[tuple[int, ast.AST]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            out.append((node.lineno, node.test))
        elif isinstance(node, ast.comprehension):
            out += [(node.target.lineno, cond) for cond in node.ifs]
    return out


@pytest.mark.parametrize("name", TRAINER_FILES)
def test_no_trainer_branches_on_the_kind_of_run(name):
    path = TRAINER_DIR / name
    tree = ast.parse(path.read_text())
    found = [
        f"{name}:{line}: {word}"
        for line, test in _conditions(tree)
        for word in _dotted(test)
        if any(flag in word for flag in KIND_OF_RUN)
    ]
    assert not found, "a trainer branches on the kind of run (the rollout source's job): " + "; ".join(found)


def test_the_check_finds_a_branch_on_the_mode():
    tree = ast.parse("if self.plan.mode == 'async':\n    pass\nx = 1 if self.agents else 2\n")
    words = [w for _, test in _conditions(tree) for w in _dotted(test)]
    assert "self.plan.mode" in words and "self.agents" in words


def test_dpo_and_sft_extend_the_base_not_ppo():
    for cls in (DPOTrainer, OnlineDPOTrainer, SFTTrainer, PPOTrainer):
        assert issubclass(cls, Trainer)
    for cls in (DPOTrainer, OnlineDPOTrainer, SFTTrainer):
        assert not issubclass(cls, PPOTrainer)
    assert all(hasattr(Trainer, m) for m in ("__enter__", "__exit__"))


def test_ppo_holds_its_stages_only():
    lines = len((TRAINER_DIR / "ppo.py").read_text().splitlines())
    assert lines <= 350, f"trainer/ppo.py has {lines} lines: move what is not a PPO stage out of it"


def test_a_trainer_refuses_a_run_of_another_kind():
    from verl.config.errors import ConfigError
    from verl.trainer.base import check_trainer_class
    from verl.trainer.registry import trainer_class

    plans = {kind: type("P", (), {"trainer": kind})() for kind in ("ppo", "dpo", "online_dpo", "sft")}
    assert trainer_class(plans["online_dpo"]) is OnlineDPOTrainer
    check_trainer_class(OnlineDPOTrainer, plans["online_dpo"])
    check_trainer_class(type("Mine", (PPOTrainer,), {}), plans["ppo"])  # a user's subclass
    for cls, kind in ((DPOTrainer, "online_dpo"), (OnlineDPOTrainer, "dpo"), (PPOTrainer, "sft")):
        with pytest.raises(ConfigError, match=f"does not train algorithm.name={kind}"):
            check_trainer_class(cls, plans[kind])
