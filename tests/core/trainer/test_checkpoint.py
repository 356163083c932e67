"""CheckpointManager: complete-or-absent folders, keep-last pruning, crash safety."""

from __future__ import annotations

import os

import pytest

from tests.support.engines import gloo_world_one  # noqa: F401 (load_extra names this rank's file)
from verl.trainer.checkpoint import COMPLETE, CheckpointManager


def _writer(content: str):
    def write(path: str) -> None:
        with open(os.path.join(path, "weights.txt"), "w") as f:
            f.write(content)

    return write


def _read(path: str) -> str:
    with open(os.path.join(path, "weights.txt")) as f:
        return f.read()


def test_save_latest_and_state(tmp_path):
    m = CheckpointManager(str(tmp_path), keep_last=2)
    assert m.latest() is None
    m.save(3, _writer("three"), {"step": 3})
    path = m.latest()
    assert path == str(tmp_path / "step_3")
    assert _read(path) == "three"
    assert m.load_state(path) == {"step": 3}


def test_keep_last_prunes_oldest(tmp_path):
    m = CheckpointManager(str(tmp_path), keep_last=2)
    for step in (1, 2, 3, 4):
        m.save(step, _writer(str(step)), {"step": step})
    assert m.steps() == [3, 4]
    assert sorted(os.listdir(tmp_path)) == ["step_3", "step_4"]


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path):
    m = CheckpointManager(str(tmp_path), keep_last=2)
    m.save(1, _writer("one"), {"step": 1})

    def crash(path: str) -> None:
        with open(os.path.join(path, "weights.txt"), "w") as f:
            f.write("half")
        raise KeyboardInterrupt("killed mid-save")

    with pytest.raises(KeyboardInterrupt):
        m.save(2, crash, {"step": 2})
    # The half-written step 2 is invisible; step 1 is still the latest and intact.
    assert m.steps() == [1]
    assert _read(m.latest()) == "one"
    # The next save removes the stale temporary folder.
    m.save(3, _writer("three"), {"step": 3})
    assert sorted(os.listdir(tmp_path)) == ["step_1", "step_3"]


def test_folder_without_marker_is_not_a_checkpoint(tmp_path):
    m = CheckpointManager(str(tmp_path), keep_last=2)
    m.save(1, _writer("one"), {"step": 1})
    os.makedirs(tmp_path / "step_9")  # e.g. copied by hand, incomplete
    assert m.steps() == [1]
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        m.load_state(str(tmp_path / "step_9"))
    assert os.path.exists(tmp_path / "step_1" / COMPLETE)


def test_what_a_crash_leaves_is_removed(tmp_path):
    m = CheckpointManager(str(tmp_path), keep_last=2)
    m.save(1, _writer("one"), {"step": 1})
    os.makedirs(tmp_path / "step_2")  # a step folder without its marker (an interrupted copy, a half delete)
    os.makedirs(tmp_path / ".step_3.tmp-0123abcd")  # an unfinished save
    os.makedirs(tmp_path / "step_0.old-89abcdef")  # a folder set aside to be deleted
    (tmp_path / "notes.txt").write_text("mine")  # not a checkpoint's name: left alone
    assert m.remove_incomplete() == [".step_3.tmp-0123abcd", "step_0.old-89abcdef", "step_2"]
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "step_1"] and _read(m.latest()) == "one"
    assert m.remove_incomplete() == []
    assert CheckpointManager(str(tmp_path / "absent")).remove_incomplete() == []


def test_pruning_sets_a_checkpoint_aside_before_deleting_it(tmp_path, monkeypatch):
    """A crash mid-delete must not leave a half-deleted step_N that still looks complete."""
    import shutil

    m = CheckpointManager(str(tmp_path), keep_last=1)
    m.save(1, _writer("one"), {"step": 1})
    deleted = []
    monkeypatch.setattr(shutil, "rmtree", lambda path, ignore_errors=False: deleted.append(os.path.basename(path)))
    m.save(2, _writer("two"), {"step": 2})  # prunes step 1; the "crash" leaves it undeleted
    left = [name for name in deleted if os.path.exists(tmp_path / name)]
    assert len(left) == 1 and left[0].startswith("step_1.old-")
    assert m.steps() == [2]  # what is left is no longer a checkpoint's name
    monkeypatch.undo()
    assert m.remove_incomplete() == left


def test_resaving_a_step_replaces_it(tmp_path):
    m = CheckpointManager(str(tmp_path), keep_last=3)
    m.save(2, _writer("old"), {"step": 2})
    m.save(2, _writer("new"), {"step": 2})
    assert m.steps() == [2]
    assert _read(m.latest()) == "new"


def test_keep_last_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(str(tmp_path), keep_last=0)


class _RunsCode:
    """Unpickling this calls os.system: what a crafted checkpoint file would do on resume."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_checkpoint_cannot_run_code_on_resume(tmp_path, gloo_world_one):  # noqa: F811 (fixture)
    import torch

    from verl.engine_skeleton import TrainState, load_extra
    from verl.trainer.checkpoint import STATE_FILE

    m = CheckpointManager(str(tmp_path / "ckpt"), keep_last=2)
    path = m.save(3, _writer("three"), {"step": 3})
    marker = tmp_path / "code_ran"
    torch.save({"step": 3, "payload": _RunsCode(str(marker))}, os.path.join(path, STATE_FILE))
    with pytest.raises(ValueError, match=STATE_FILE):
        m.load_state(path)
    torch.save({"steps": 1, "rng": _RunsCode(str(marker))}, os.path.join(path, "extra_rank0.pt"))
    with pytest.raises(ValueError, match="extra_rank0.pt"):
        load_extra(path, TrainState())
    assert not marker.exists()


def test_trainer_state_with_rng_round_trips_through_the_safe_loader(tmp_path):
    import random

    import numpy as np
    import torch

    from verl.utils.rng import get_rng_state, set_rng_state

    m = CheckpointManager(str(tmp_path), keep_last=2)
    state = {"step": 3, "data": {"epoch": 0, "position": 8}, "kl_coef": None, "rng": get_rng_state()}
    path = m.save(3, _writer("three"), state)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    set_rng_state(m.load_state(path)["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected
