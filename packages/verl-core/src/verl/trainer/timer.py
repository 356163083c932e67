"""Wall-clock timing of the stages of a step, reported as timing/<stage>_s; and, while a `trace` is open, each
stage's span (trainer.profile writes them as a trace)."""

from __future__ import annotations

import contextlib
import time
from typing import Dict, Iterator, List, Optional, Tuple

Span = Tuple[str, float, float]  # (stage, start, end) in time.perf_counter() seconds

_spans: Optional[List[Span]] = None  # where the stages go while a trace is open


class StageTimer:
    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.seconds[stage] = self.seconds.get(stage, 0.0) + end - start
            if _spans is not None:
                _spans.append((stage, start, end))

    def metrics(self) -> Dict[str, float]:
        return {f"timing/{k}_s": v for k, v in self.seconds.items()}


@contextlib.contextmanager
def trace() -> Iterator[List[Span]]:
    """Every StageTimer's stage spans while the block runs, in the list this yields."""
    global _spans
    spans: List[Span] = []
    saved, _spans = _spans, spans
    try:
        yield spans
    finally:
        _spans = saved
