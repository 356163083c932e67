"""A checkpoint's run fingerprint: `resume: auto` continues only the same run; settings of how a run is carried
out may change; a checkpoint named by path is continued with the changes said."""

from __future__ import annotations

import json
import os

import pandas as pd

from verl.config.loader import load_config
from verl.config.run_checks import check_run
from verl.trainer.checkpoint import RUN_FILE, CheckpointManager
from verl.trainer.fingerprint import differences, fingerprint

RECIPE = "recipes/grpo_tiny.yaml"


def _cfg(out, *overrides):
    return load_config(RECIPE, [f"trainer.output_dir={out}", *overrides])


def _save(cfg, step=5):
    """A checkpoint as the trainer saves it: shards (here a file), state, and the run's fingerprint."""
    root = os.path.join(cfg.trainer.output_dir, "checkpoints")
    return CheckpointManager(root).save(step, lambda p: None, {"step": step}, run=fingerprint(cfg))


def _resume_problems(cfg):
    return [p for p in check_run(cfg, roles=[]) if p.key == "trainer.resume"]


def test_the_fingerprint_is_what_a_step_computes(tmp_path):
    base = fingerprint(_cfg(tmp_path))
    assert base["actor.optim.lr"] == 1.0e-4 and base["model.path"] == "embedded:tiny-llama"
    free = _cfg(
        tmp_path / "elsewhere",
        "trainer.total_steps=300",
        "trainer.val_every=7",
        "tracking.loggers=[console]",
        "checkpoint.save_every=5",
        "actor.ppo_micro_batch_size_per_device=8",
        "placement.threads_per_worker=1",
    )
    assert differences(base, fingerprint(free)) == []
    changed = fingerprint(_cfg(tmp_path, "actor.optim.lr=2e-4", "data.train_batch_size=16"))
    assert differences(base, changed) == [
        ("actor.optim.lr", 1.0e-4, 2.0e-4),
        ("data.train_batch_size", 32, 16),
    ]


def test_data_files_and_model_folders_are_known_by_content(tmp_path):
    data = tmp_path / "train.parquet"
    row = {"prompt": [{"role": "user", "content": "1+1="}], "data_source": "a", "reward_model": {"ground_truth": "2"}}
    pd.DataFrame([row] * 3).to_parquet(data)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 8}))
    cfg = _cfg(tmp_path, f"data.train_files=[{data}]", f"model.path={model}")
    before = fingerprint(cfg)
    assert before["data.train_files"] == [[str(data), 3]]
    pd.DataFrame([row] * 4).to_parquet(data)  # the same path, regenerated with another row
    (model / "config.json").write_text(json.dumps({"hidden_size": 16}))  # the same path, another model
    keys = [k for k, _, _ in differences(before, fingerprint(cfg))]
    assert keys == ["data.train_files", "model.config_json"]


def test_auto_resume_refuses_a_checkpoint_of_another_run(tmp_path):
    path = _save(_cfg(tmp_path))
    assert _resume_problems(_cfg(tmp_path)) == []  # the same run: continued
    assert _resume_problems(_cfg(tmp_path, "trainer.total_steps=500")) == []  # extended: continued
    (problem,) = _resume_problems(_cfg(tmp_path, "actor.optim.lr=3e-4"))
    assert problem.severity == "error"
    assert path in problem.message and "actor.optim.lr was 0.0001, now 0.0003" in problem.message
    assert "trainer.output_dir" in problem.fix and f"trainer.resume={path}" in problem.fix
    # Named by path, the same checkpoint is continued with the new settings, and the change is said.
    (warning,) = _resume_problems(_cfg(tmp_path, "actor.optim.lr=3e-4", f"trainer.resume={path}"))
    assert warning.severity == "warning" and "actor.optim.lr" in warning.message
    assert _resume_problems(_cfg(tmp_path, "actor.optim.lr=3e-4", "trainer.resume=disable")) == []


def test_checkpoints_without_a_fingerprint_are_continued(tmp_path):
    path = _save(_cfg(tmp_path))
    os.remove(os.path.join(path, RUN_FILE))  # as saved before checkpoints carried one
    assert _resume_problems(_cfg(tmp_path, "actor.optim.lr=3e-4")) == []


def test_every_change_is_named(tmp_path):
    _save(_cfg(tmp_path))
    changes = {
        "actor.optim.lr": "2e-4",
        "rollout.n": "4",
        "algorithm.gamma": "0.5",
        "algorithm.lam": "0.5",
        "actor.clip_ratio": "0.3",
        "rollout.temperature": "0.7",
    }
    (problem,) = _resume_problems(_cfg(tmp_path, *(f"{k}={v}" for k, v in changes.items())))
    assert all(k in problem.message for k in changes), problem.message  # four in full, the rest by name
    assert "(and 2 more:" in problem.message


def test_a_broken_config_beside_a_checkpoint_is_still_a_list_of_problems(tmp_path):
    """Nothing to compare then: the key that does not resolve, or the file that is not parquet, is named by the
    other checks, and the resume check stays out of the way (no traceback)."""
    _save(_cfg(tmp_path))
    broken = _cfg(tmp_path)
    broken.tracking.log_dir = "${trainer.nope}/logs"  # as `verl train` still holds it while collecting problems
    assert _resume_problems(broken) == []
    (tmp_path / "data.parquet").write_text("prompt,answer\n1+1=,2\n")
    cfg = _cfg(tmp_path, f"data.train_files=[{tmp_path / 'data.parquet'}]")
    problems = check_run(cfg, roles=[])
    assert [p.key for p in problems] == ["data.train_files[0]", "trainer.resume"]  # unreadable; another run's data
