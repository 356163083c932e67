"""Wall-clock timing of the stages of a step, reported as timing/<stage>_s."""

from __future__ import annotations

import contextlib
import time
from typing import Dict, Iterator


class StageTimer:
    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def metrics(self) -> Dict[str, float]:
        return {f"timing/{k}_s": v for k, v in self.seconds.items()}
