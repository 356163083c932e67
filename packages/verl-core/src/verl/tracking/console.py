"""The console logger: one compact line per step, the keys worth watching first."""

from __future__ import annotations

import math
from typing import Optional

from rich.console import Console
from rich.text import Text

from verl.config.schema import TrackingConfig

__all__ = ["ConsoleLogger", "format_line", "format_value"]

# (label, keys in preference order): the first key present fills the slot.
HEADLINE = (
    ("reward", ("reward/score/mean",)),
    ("kl", ("actor/kl", "actor/ppo_kl")),
    ("pg_loss", ("actor/pg_loss",)),
    ("dpo_loss", ("actor/dpo_loss",)),
    ("margin", ("actor/dpo/reward_margins",)),
    ("nll", ("actor/dpo/nll_loss",)),  # DPO with algorithm.dpo.nll_weight (RPO)
    ("loss", ("actor/loss",)),  # SFT
    ("tok/s", ("perf/tokens_per_s",)),
    ("step_s", ("timing/step_s",)),
)


def format_value(value: float) -> str:
    """Integers as integers, everything else to 4 significant digits (0.001234, 1.235e+04)."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.4g}"


def format_line(metrics: dict[str, float], step: int) -> str:
    """`step 3 | reward 0.75 | kl 0.0012 | ... | val/... | +N more`: headline keys, then every val/* key."""
    parts, shown = [f"step {step}"], set()
    for label, keys in HEADLINE:
        key = next((k for k in keys if k in metrics), None)
        if key is not None:
            parts.append(f"{label} {format_value(metrics[key])}")
            shown.add(key)
    for key in sorted(k for k in metrics if k.startswith("val/")):  # validation steps are rare: show them all
        parts.append(f"{key} {format_value(metrics[key])}")
        shown.add(key)
    if len(metrics) > len(shown):
        parts.append(f"+{len(metrics) - len(shown)} more")
    return " | ".join(parts)


class ConsoleLogger:
    """Prints each step's compact line to stdout (rich)."""

    def __init__(
        self,
        cfg: Optional[TrackingConfig] = None,
        *,
        run_config: dict | None = None,
        log_dir: str | None = None,
        console: Console | None = None,
    ):
        self.console = console or Console(highlight=False)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.console.print(Text(format_line(metrics, step)), soft_wrap=True)

    def close(self) -> None:
        pass
