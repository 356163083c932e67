"""What every worker process does first: quiet libraries, pin threads, import the run's plugins."""

from __future__ import annotations

import os

import torch


def quiet_libraries() -> None:
    """Keep worker logs to what the run reports (transformers' per-load progress bars add nothing)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def set_threads(num_threads: int | None) -> None:
    """CPU workers share the machine's cores: OMP_NUM_THREADS (set by the controller) wins over torch's default."""
    n = num_threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if n > 0:
        torch.set_num_threads(n)


def setup_worker(cfg) -> None:
    """Quiet libraries, pin threads, and import trainer.plugins: a Ray worker is a fresh process, and a loss or
    aggregation mode a plugin registered in the driver is looked up by name here too."""
    from verl.algos import load_plugins

    quiet_libraries()
    set_threads(None)
    load_plugins(list(cfg.trainer.plugins or []))
