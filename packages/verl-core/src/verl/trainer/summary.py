"""The one line a run ends with, from a trainer's `fit()` summary."""

from __future__ import annotations

from typing import Any, Dict


def format_summary(name: str, s: Dict[str, Any]) -> str:
    """The one line a run ends with."""
    before, after = s["val_accuracy_before"], s["val_accuracy_after"]
    acc = "no validation set"
    if s.get("val_loss_after") is not None:  # SFT: the held-out loss
        loss_before, loss_after = s.get("val_loss_before"), s["val_loss_after"]
        acc = f"validation loss {loss_after:.4f} at the end"
        if loss_before is not None:
            acc = f"validation loss {loss_before:.4f} -> {loss_after:.4f} ({loss_after - loss_before:+.4f})"
    elif before is not None and after is not None:
        acc = f"held-out greedy accuracy {100 * before:.1f}% -> {100 * after:.1f}% ({100 * (after - before):+.1f} pts)"
    elif after is not None:
        acc = f"held-out greedy accuracy {100 * after:.1f}% at the end"
    sampled = s.get("val_sampled_after") or {}
    if sampled:
        acc += "; " + ", ".join(f"{name} {100 * v:.1f}%" for name, v in sampled.items())
    first = s.get("first_step_s")
    first = f" (the first done {first:.1f} s after start)" if first is not None else ""
    steps = f"{s['steps']} steps in {s['seconds']:.0f} s{first}"
    return f"verl {name}: {acc}; {steps}; {s['tokens_per_s']:.0f} tokens/s"
