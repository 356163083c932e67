"""trainer.profile: a trace of the steps in a range, to open in Perfetto or chrome://tracing.

`<dir>/stages.json` holds each profiled step and its stages (gen, reward, log_probs, adv, update, ...) as the
driver timed them, in the Chrome trace format; under Ray, `<dir>/ray_timeline.json` is Ray's own timeline of
every worker's calls, dumped after the last profiled step (`ray.timeline`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Dict, Iterator, List, Optional

from verl.config.schema import ProfileConfig
from verl.trainer.timer import trace


class StepProfiler:
    def __init__(self, cfg: Optional[ProfileConfig], output_dir: str, controller: str):
        """cfg: the trainer.profile section (steps [first, last], dir), or None (off)."""
        steps = list(cfg.steps) if cfg is not None else []
        self.first: int = steps[0] if steps else 0
        self.last: int = steps[-1] if steps else -1
        self.dir = (cfg.dir if cfg is not None and cfg.dir else None) or os.path.join(output_dir, "profile")
        self.controller = controller
        self.events: List[Dict[str, Any]] = []
        self.origin = time.perf_counter()

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Trace step `step` (1-based: the step being trained) when it is in the range."""
        if not self.first <= step <= self.last:
            yield
            return
        start = time.perf_counter()
        with trace() as spans:
            yield
        self.events.append(self._event(f"step {step}", start, time.perf_counter(), tid=0, step=step))
        self.events += [self._event(name, s, e, tid=1, step=step) for name, s, e in spans]
        if step == self.last:
            self.write()

    def _event(self, name: str, start: float, end: float, *, tid: int, step: int) -> Dict[str, Any]:
        us = 1e6
        return {
            "name": name,
            "ph": "X",
            "ts": (start - self.origin) * us,
            "dur": (end - start) * us,
            "pid": 0,
            "tid": tid,
            "args": {"step": step},
        }

    def write(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        names = [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": n}}
            for t, n in ((0, "steps"), (1, "stages"))
        ]
        with open(os.path.join(self.dir, "stages.json"), "w") as f:
            json.dump({"traceEvents": names + self.events, "displayTimeUnit": "ms"}, f)
        if self.controller == "ray":
            import ray  # pants: no-infer-dep (the ray extra)

            ray.timeline(filename=os.path.join(self.dir, "ray_timeline.json"))
        print(f"verl: profile of steps {self.first}-{self.last} written to {self.dir}", flush=True)
