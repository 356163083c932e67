"""Worker: the base of every worker class (actor, rollout, reference, critic): rank, world and dispatch layout.

A worker group constructs a worker inside a Ray actor (or in this process, in local mode) after setting
the torchrun-style environment variables RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; the properties below read them, so a subclass need not call `super().__init__()`.
Without a group (a worker built by hand in a test) they default to rank 0 of a world of 1 on 127.0.0.1.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

import torch
import torch.distributed as dist

from verl.controller.rendezvous import is_loopback, pin_gloo_to_loopback, tcp_store

DEVICE_ENV = "VERL_DEVICE"  # "cpu" or "cuda": the pool's device type, set by the group


def free_port(host: str = "") -> int:
    """A TCP port free on this machine right now (the OS picks it; it may be taken again before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class Worker:
    """Base class for worker classes; methods the driver calls are marked with `@register`."""

    @property
    def rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    @property
    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def local_rank(self) -> int:
        """This rank's position among the group's ranks on its node (torchrun's LOCAL_RANK).

        Not a CUDA device index under Ray: Ray shows each actor only its own GPU, so use `self.device`.
        """
        return int(os.environ.get("LOCAL_RANK", "0"))

    @property
    def master_addr(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def master_port(self) -> int:
        """Rank 0's rendezvous port; without a group, a free port chosen once per process (and put in the env)."""
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(free_port())
        return int(os.environ["MASTER_PORT"])

    @property
    def device(self) -> torch.device:
        """The device this worker computes on: cpu, or the one GPU Ray gave its actor (cuda:0 inside the actor)."""
        kind = os.environ.get(DEVICE_ENV, "cpu")
        if kind == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(kind)

    @property
    def collective_backend(self) -> str:
        """The torch.distributed backend for this worker's device: nccl on CUDA, gloo on CPU."""
        return "nccl" if os.environ.get(DEVICE_ENV, "cpu") == "cuda" else "gloo"

    def init_distributed(self, backend: str = "gloo", timeout_s: int = 300) -> None:
        """Join the group's default torch.distributed process group (env://); a second call is a no-op.

        The rendezvous variables are written to the environment when absent (local mode, or a worker
        built by hand), so libraries that read them (Megatron, vLLM) see the same values.
        """
        if dist.is_available() and dist.is_initialized():
            current = (dist.get_backend(), dist.get_rank(), dist.get_world_size())
            if backend not in current[0] or current[1:] != (self.rank, self.world_size):
                raise RuntimeError(
                    f"torch.distributed is already initialized in this process as backend={current[0]} "
                    f"rank={current[1]} world_size={current[2]}, but this worker asks for backend={backend} "
                    f"rank={self.rank} world_size={self.world_size}; colocated workers in one process must "
                    "use the same backend (call init_distributed once with it)"
                )
            return
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.setdefault(key, str(getattr(self, key.lower())))  # each has a property of that name
        timeout = datetime.timedelta(seconds=timeout_s)
        if not is_loopback(self.master_addr):  # ranks on several machines: env:// listens on every interface
            dist.init_process_group(
                backend=backend, init_method="env://", rank=self.rank, world_size=self.world_size, timeout=timeout
            )
            return
        # One machine: the store and gloo's pairs listen on loopback only (controller/rendezvous.py).
        pin_gloo_to_loopback()
        store = tcp_store(self.master_addr, self.master_port, self.world_size, self.rank == 0, timeout)
        dist.init_process_group(
            backend=backend, store=store, rank=self.rank, world_size=self.world_size, timeout=timeout
        )

    def dispatch_info(self, mesh: str = "train") -> dict[str, Any]:
        """This rank's place in the data-parallel layout `mesh`, read by the group for DP_COMPUTE methods.

        Default: every rank is its own dp rank and is collected. A worker whose engine splits ranks into
        model-parallel groups calls `set_dispatch_info` once it knows its layout (before the first
        DP_COMPUTE call: the group reads this once per mesh and keeps it; see `refresh_dispatch_info`).
        A mesh never set is the "train" one.
        """
        infos = getattr(self, "_verl_dispatch_info", {})
        info = infos.get(mesh, infos.get("train"))
        if info is not None:
            return dict(info)
        return {"dp_rank": self.rank, "dp_size": self.world_size, "collect": True}

    def set_dispatch_info(self, dp_rank: int, dp_size: int, collect: bool, mesh: str = "train") -> None:
        """Set what `dispatch_info(mesh)` returns, e.g. dp rank from the engine's mesh, collect on tp rank 0."""
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"set_dispatch_info: dp_rank={dp_rank} must be in 0..dp_size-1 (dp_size={dp_size})")
        if not hasattr(self, "_verl_dispatch_info"):
            self._verl_dispatch_info: dict[str, dict[str, Any]] = {}
        self._verl_dispatch_info[mesh] = {"dp_rank": int(dp_rank), "dp_size": int(dp_size), "collect": bool(collect)}
