"""A progress bar for long runs: step/total, reward, KL, tokens/s and ETA, redrawn in place.

Only on a terminal: when stdout is a file or a pipe (a cluster job's log) it is off, and the console
logger's one line per step is the progress record.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Dict

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

from verl.tracking.console import HEADLINE, format_value
from verl.tracking.values import to_float

__all__ = ["Progress", "format_eta"]

# The console line's reward, KL and tokens/s slots: (label, metric keys in preference order).
FIELDS = tuple((label, keys) for label, keys in HEADLINE if label in ("reward", "kl", "tok/s"))


def format_eta(seconds: float | None) -> str:
    """H:MM:SS, or "?" while there is nothing to estimate from."""
    return "?" if seconds is None else str(timedelta(seconds=round(max(seconds, 0.0))))


class Progress:
    """`with Progress(total_steps) as p: ... p.update(step, metrics)`; a no-op when stdout is not a terminal.

    ETA = steps left x the mean time per step since the first update (so a resumed run's earlier steps,
    and the time before the first step, do not skew it).
    """

    def __init__(
        self,
        total_steps: int | None,
        *,
        enabled: bool | None = None,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total_steps = total_steps
        self.enabled = sys.stdout.isatty() if enabled is None else enabled
        self._clock = clock
        self._first: tuple[int, float] | None = None  # (step, time) of the first update
        self._bar = None
        if self.enabled:
            self._bar = RichProgress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                *(TextColumn(f"{label} {{task.fields[{label}]}}") for label, _ in FIELDS),
                TextColumn("ETA {task.fields[eta]}"),
                TimeElapsedColumn(),
                console=console,
            )
            blank: Dict[str, Any] = {label: "-" for label, _ in FIELDS}
            self._task = self._bar.add_task("train", total=total_steps, eta="?", **blank)
            self._bar.start()

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Show `step` as done, with the latest reward, KL and tokens/s from `metrics`."""
        if not self.enabled:
            return
        now = self._clock()
        if self._first is None:
            self._first = (step, now)
        fields = {}
        for label, keys in FIELDS:
            key = next((k for k in keys if k in (metrics or {})), None)
            if key is not None:
                value = to_float(metrics[key])
                fields[label] = "-" if value is None else format_value(value)
        shown: Dict[str, Any] = dict(fields)
        self._bar.update(self._task, completed=step, eta=format_eta(self.eta(step, now)), **shown)

    def eta(self, step: int, now: float) -> float | None:
        """Seconds left at `step`, from the mean step time since the first update; None before that."""
        if self._first is None or self.total_steps is None or step <= self._first[0]:
            return None
        per_step = (now - self._first[1]) / (step - self._first[0])
        return per_step * (self.total_steps - step)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
