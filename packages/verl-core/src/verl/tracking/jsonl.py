"""The jsonl logger: one JSON object per step appended to <log_dir>/metrics.jsonl, flushed at once."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Optional

from verl.config.schema import TrackingConfig
from verl.tracking.curves import write_curves

__all__ = ["JsonlLogger"]

FILENAME = "metrics.jsonl"
logger = logging.getLogger(__name__)


class JsonlLogger:
    """`{"step": 3, "time": <unix seconds>, "<metric>": value, ...}` per line; a resumed run appends after
    `resume_at` has dropped the steps logged past its checkpoint (a killed run logged them; they rerun)."""

    def __init__(self, cfg: Optional[TrackingConfig] = None, *, run_config: dict | None = None, log_dir: str):
        self.curves = bool(getattr(cfg, "curves", True))  # tracking.curves: curves.png beside the file at close
        os.makedirs(log_dir, exist_ok=True)
        self.path = os.path.join(log_dir, FILENAME)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held open for the run, closed by close()

    def log(self, metrics: dict[str, float], step: int) -> None:
        record: dict[str, Any] = {"step": step, "time": time.time()}
        record.update((k, v) for k, v in metrics.items() if k not in record)  # a metric cannot overwrite "step"
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()  # a crashed run keeps every step it logged

    def resume_at(self, step: int) -> None:
        """Keep the records of steps <= `step` (and no half-written line), rewriting the file atomically; -1: none
        (a run that starts over from step 0 under `resume: auto`)."""
        self._file.close()
        with open(self.path, encoding="utf-8") as f:
            kept = [line for line in f if (logged := _step_of(line)) is not None and logged <= step]
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        self._file.close()
        if self.curves:
            try:
                write_curves(self.path)
            except Exception as e:  # a picture must never fail a run that trained
                logger.warning("curves.png was not written: %s: %s", type(e).__name__, e)


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):  # a line cut short by a kill
        return None
