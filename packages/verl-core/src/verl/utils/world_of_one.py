"""A torch.distributed world of this one process (gloo), for tools that run an engine outside a job (export)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch.distributed as dist


@contextlib.contextmanager
def world_of_one() -> Iterator[None]:
    """Initialise a single-rank gloo group for the block (reusing one that is already a world of one)."""
    from verl.controller.rendezvous import pin_gloo_to_loopback

    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError("this runs as a single process; call it outside a distributed job")
        yield
        return
    pin_gloo_to_loopback()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # (in memory: no socket)
    try:
        yield
    finally:
        dist.destroy_process_group()
