"""Weights from the trainer's pool into a rollout pool of its own, over a collective group spanning both.

The actor's rank 0 (the sender) and every rank of the rollout pool (the receivers) join one process group of
their own, apart from each pool's default one: gloo on CPU, NCCL on GPU. A sync streams the actor's full
tensors (as `TrainEngine.weights()` yields them: FSDP shards gathered, megatron TP/PP pieces assembled, in
Hugging Face names) in buckets of at most `bucket_bytes`: a small header naming each tensor's name, dtype,
shape and byte range, then one flat byte buffer, both broadcast from the sender. Receivers rebuild each tensor
from its bytes (bitwise the sender's) and hand them, one at a time, to their rollout engine's own loader
(which slices its tensor-parallel shard, as it does for a colocated actor). Memory held in flight: the sender's
bucket of tensors and its flat copy, and a receiver's flat buffer (its tensors are views into it).
"""

from __future__ import annotations

import datetime
import pickle
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from verl.controller.rendezvous import is_loopback, pin_gloo_to_loopback, tcp_store

DEFAULT_BUCKET_BYTES = 256 << 20  # 256 MiB: a handful of buckets for a 7B model's layers, one for a tiny model
ALIGN = 16  # each tensor starts at a multiple of this in a bucket, so its bytes can be viewed as any dtype
SENDER = 0  # the sender's rank in the transfer group: the actor's rank 0


@dataclass
class TransferGroup:
    """One member of a transfer group: the process group and the rendezvous store it was made with (rank 0
    serves the store, which must outlive the group)."""

    group: Any
    store: Any
    rank: int
    world: int

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        self.group.broadcast([tensor], dist.BroadcastOptions()).wait()  # root rank 0: the sender
        return tensor


def join_transfer_group(
    host: str, port: int, rank: int, world: int, backend: str = "gloo", timeout_s: float = 600.0
) -> TransferGroup:
    """This process's member of the transfer group (rank 0 hosts its rendezvous store at host:port).

    A group of its own, not the pool's default one: the actor's and the rollout's ranks belong to different
    default worlds. Every member must call this at about the same time (the constructor rendezvouses)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if is_loopback(host):  # one machine: listen on loopback only (controller/rendezvous.py)
        pin_gloo_to_loopback()
    store = tcp_store(host, port, world, rank == SENDER, timeout)
    prefixed = dist.PrefixStore("verl-weight-transfer", store)
    group: Any
    if backend == "nccl":
        group = dist.ProcessGroupNCCL(prefixed, rank, world, dist.ProcessGroupNCCL.Options())
    elif backend == "gloo":
        group = dist.ProcessGroupGloo(prefixed, rank, world, timeout)
    else:
        raise ValueError(f"weight transfer backend must be gloo or nccl, got {backend!r}")
    return TransferGroup(group, store, rank, world)


def _send_object(group: TransferGroup, obj: Any, device: torch.device) -> None:
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    group.broadcast(torch.tensor([data.numel()], dtype=torch.int64, device=device))
    group.broadcast(data)


def _receive_object(group: TransferGroup, device: torch.device) -> Any:
    size = group.broadcast(torch.zeros(1, dtype=torch.int64, device=device))
    data = group.broadcast(torch.empty(int(size.item()), dtype=torch.uint8, device=device))
    # The header comes from the actor's rank 0 of this same run (a process the run started), not from a file.
    return pickle.loads(data.cpu().numpy().tobytes())


@dataclass
class TransferStats:
    """One sync as one rank saw it."""

    bytes: int = 0  # tensor bytes moved (headers and alignment padding excluded)
    buckets: int = 0
    seconds: float = 0.0
    version: int = -1  # the policy version the weights belong to (the sender's count of updates)

    def metrics(self) -> dict:
        gbps = self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0
        return {
            "perf/weight_sync_bytes": float(self.bytes),
            "perf/weight_sync_buckets": float(self.buckets),
            "timing/weight_sync_s": self.seconds,
            "perf/weight_sync_gbps": gbps,
        }


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(-1).view(torch.uint8)


def send_weights(
    group: Optional[TransferGroup],
    weights: Iterable[Tuple[str, torch.Tensor]],
    *,
    version: int,
    device: torch.device,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> TransferStats:
    """Broadcast `weights` to the receivers in buckets; `group` None on actor ranks that only help assemble
    the tensors (the iterator is collective over the actor's ranks, so every one of them must consume it).
    The seconds (and GB/s) cover the whole pass: assembling each tensor (FSDP gathers, megatron's TP/PP
    pieces) and sending it."""
    stats, start = TransferStats(), time.perf_counter()
    bucket: List[Tuple[str, torch.Tensor]] = []
    held = 0

    def flush(last: bool) -> None:
        nonlocal bucket, held
        if group is not None:
            entries, offset = [], 0
            for name, t in bucket:
                nbytes = t.numel() * t.element_size()
                entries.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
                offset += -(-nbytes // ALIGN) * ALIGN
            _send_object(group, {"version": version, "entries": entries, "last": last}, device)
            if bucket:
                flat = torch.zeros(offset, dtype=torch.uint8, device=device)
                for (_, t), (_, _, _, at, nbytes) in zip(bucket, entries):
                    flat[at : at + nbytes] = _as_bytes(t.to(device))
                group.broadcast(flat)
            stats.buckets += 1
            stats.bytes += held
        bucket, held = [], 0

    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and held + nbytes > bucket_bytes:
            flush(last=False)
        bucket.append((name, tensor))
        held += nbytes
    flush(last=True)
    stats.seconds = time.perf_counter() - start
    return stats


def receive_weights(
    group: TransferGroup, device: torch.device, stats: TransferStats
) -> Iterator[Tuple[str, torch.Tensor]]:
    """The sender's tensors one at a time, as they arrive (feed them to `RolloutEngine.update_weights`).
    `stats` is filled in as the buckets come; its `version` attribute is set from the headers."""
    start = time.perf_counter()
    while True:
        header = _receive_object(group, device)
        stats.version = header["version"]
        entries = header["entries"]
        if entries:
            last = entries[-1][3] + entries[-1][4]
            flat = group.broadcast(torch.empty(-(-last // ALIGN) * ALIGN, dtype=torch.uint8, device=device))
            for name, dtype, shape, offset, nbytes in entries:
                tensor = flat[offset : offset + nbytes].view(getattr(torch, dtype)).view(shape)
                stats.bytes += nbytes
                yield name, tensor
        stats.buckets += 1
        if header["last"]:
            break
    stats.seconds = time.perf_counter() - start
