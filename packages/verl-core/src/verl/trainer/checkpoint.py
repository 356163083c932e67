"""Checkpoint folders that are either complete or absent: a crash mid-save never corrupts the last good one.

A checkpoint is written into a hidden temporary folder beside the others, marked complete, then renamed
into place (`os.replace` is atomic on one filesystem). `latest()` only ever sees complete folders. What a crash
can leave (a save's temporary, a `step_N` without its marker) is removed at the run's start and by each save;
an old checkpoint is renamed aside before it is deleted, so a crash mid-delete never leaves a half `step_N`.
The last `keep_last` are kept.

Layout: <root>/step_<N>/{actor/, critic/, trainer_state.pt, run.json, COMPLETE}
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import torch

from verl.config.schema import VerlConfig
from verl.utils.rng import safe_load

_STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.pt"
RUN_FILE = "run.json"  # the run's fingerprint (verl.trainer.fingerprint)


def checkpoint_root(cfg: VerlConfig) -> str:
    """Where a run's checkpoints go: checkpoint.dir, else <trainer.output_dir>/checkpoints."""
    return cfg.checkpoint.dir or os.path.join(cfg.trainer.output_dir, "checkpoints")


class CheckpointManager:
    def __init__(self, root: str, keep_last: int = 2):
        if keep_last < 1:
            raise ValueError(f"checkpoint.keep_last must be >= 1, got {keep_last}")
        self.root = root
        self.keep_last = keep_last

    def steps(self) -> List[int]:
        """Steps with a complete checkpoint, oldest first."""
        if not os.path.isdir(self.root):
            return []
        found = []
        for name in os.listdir(self.root):
            m = _STEP_DIR.match(name)
            if m and os.path.exists(os.path.join(self.root, name, COMPLETE)):
                found.append(int(m.group(1)))
        return sorted(found)

    def path(self, step: int) -> str:
        return os.path.join(self.root, f"step_{step}")

    def latest(self) -> Optional[str]:
        steps = self.steps()
        return self.path(steps[-1]) if steps else None

    def save(
        self, step: int, write: Callable[[str], None], state: Dict[str, Any], run: Optional[Dict[str, Any]] = None
    ) -> str:
        """`write(tmp_dir)` has the workers write their shards; `state` is the driver's (data position, ...);
        `run` the run's fingerprint (verl.trainer.fingerprint), which a later `resume: auto` compares."""
        os.makedirs(self.root, exist_ok=True)
        self.remove_incomplete()
        tmp = os.path.join(self.root, f".step_{step}.tmp-{uuid.uuid4().hex[:8]}")
        os.makedirs(tmp)
        write(tmp)
        torch.save(state, os.path.join(tmp, STATE_FILE))
        if run is not None:
            with open(os.path.join(tmp, RUN_FILE), "w") as f:
                json.dump(run, f, indent=1, sort_keys=True)
        with open(os.path.join(tmp, COMPLETE), "w") as f:
            json.dump({"step": step, "time": time.time()}, f)
            f.flush()
            os.fsync(f.fileno())
        final = self.path(step)
        old = f"{final}.old-{uuid.uuid4().hex[:8]}"
        if os.path.exists(final):  # re-saving a step (e.g. after resuming from it): move the old one aside first
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)  # (absent unless the step was saved before)
        self._fsync_dir(self.root)
        self._prune()
        return final

    def load_state(self, path: str) -> Dict[str, Any]:
        if not os.path.exists(os.path.join(path, COMPLETE)):
            raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE} marker); pick another")
        return safe_load(os.path.join(path, STATE_FILE))

    @staticmethod
    def load_run(path: str) -> Optional[Dict[str, Any]]:
        """The fingerprint a checkpoint was saved with; None for one saved before checkpoints carried it."""
        run = os.path.join(path, RUN_FILE)
        if not os.path.isfile(run):
            return None
        with open(run) as f:
            return json.load(f)

    def remove_incomplete(self) -> List[str]:
        """Delete the leftovers of a crash: unfinished saves, folders set aside, `step_N` without COMPLETE."""
        if not os.path.isdir(self.root):
            return []
        removed = []
        for name in sorted(os.listdir(self.root)):
            path = os.path.join(self.root, name)
            leftover = (name.startswith(".step_") and ".tmp-" in name) or ".old-" in name
            if leftover or (_STEP_DIR.match(name) and not os.path.exists(os.path.join(path, COMPLETE))):
                self._discard(path)
                removed.append(name)
        return removed

    def _prune(self) -> None:
        for step in self.steps()[: -self.keep_last]:
            self._discard(self.path(step))

    @staticmethod
    def _discard(path: str) -> None:
        if ".old-" not in os.path.basename(path):  # out of the checkpoints' names first (atomic), then deleted
            aside = f"{path}.old-{uuid.uuid4().hex[:8]}"
            os.replace(path, aside)
            path = aside
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)

    @staticmethod
    def _fsync_dir(path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
