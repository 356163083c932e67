"""What every worker process does first: quiet libraries, pin threads, join the process group."""

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
