"""A picture of a run: reward, held-out accuracy and throughput against the step, drawn from its metrics.jsonl.

Written as curves.png beside the metrics file when the jsonl logger closes (`tracking.curves`), and whenever
`write_curves` is called on a metrics file. Needs matplotlib (pip install 'verl-core[plot]'); without it the
run says so once and writes nothing.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

FILENAME = "curves.png"
# (metric key, panel title): one panel each, for those the run logged
PANELS = (
    ("reward/score/mean", "reward (mean score)"),
    ("val/accuracy", "held-out accuracy"),
    ("perf/tokens_per_s", "throughput (tokens/s)"),
)


def _series(path: str) -> List[Tuple[str, List[Tuple[int, float]]]]:
    points: Dict[str, List[Tuple[int, float]]] = {key: [] for key, _ in PANELS}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:  # a line cut short by a kill
                continue
            for key in points:
                if isinstance(row.get(key), (int, float)) and "step" in row:
                    points[key].append((int(row["step"]), float(row[key])))
    return [(title, points[key]) for key, title in PANELS if points[key]]


def write_curves(metrics_path: str, out: Optional[str] = None) -> Optional[str]:
    """Draw the run's curves from `metrics_path` into `out` (default: curves.png beside it); returns the path
    written, or None (no matplotlib, or nothing to draw)."""
    try:
        import matplotlib  # pants: no-infer-dep (the `plot` extra)

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt  # pants: no-infer-dep
    except ImportError:
        logger.info("no curves.png: matplotlib is not installed (pip install 'verl-core[plot]')")
        return None
    series = _series(metrics_path)
    if not series:
        return None
    out = out or os.path.join(os.path.dirname(metrics_path), FILENAME)
    fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 3.2), squeeze=False)
    for ax, (title, points) in zip(axes[0], series):
        steps, values = zip(*sorted(points))
        ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out)  # a reader never sees half a picture
    return out
