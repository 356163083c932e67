"""Weights from the trainer's pool into a rollout pool of its own, over a collective group spanning both.

The actor's sending ranks and every rank of the rollout pool (the receivers) join one process group of their
own, apart from each pool's default one: gloo on CPU, NCCL on GPU. Two ways to send, in Hugging Face names:

- one sender (`send_weights`): the actor's rank 0 streams full tensors as `TrainEngine.weights()` yields them (the
  actor's ranks assemble each one together first);
- every rank its own block (`send_weight_shards`): FSDP's dim-0 rows, megatron's tensor-parallel pieces of its
  pipeline stage (column blocks of the row-parallel projections); nothing is gathered on the trainer's side.

A sync goes in buckets of at most `bucket_bytes`: a small header (from member 0) naming each tensor's name, dtype,
shape, each sender's bytes and the dimension the blocks join along, then each sender's flat byte buffer.
Receivers rebuild each whole tensor from the blocks (bitwise the trainer's) and hand them, one at a time, to their
rollout engine's own loader (which slices its tensor-parallel shard, as it does for a colocated actor). Memory held
in flight: a sender's bucket of blocks and its flat copy, and a receiver's flat buffers.
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
from verl.engine_protocol import Shard

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

    def broadcast(self, tensor: torch.Tensor, root: int = SENDER) -> torch.Tensor:
        options = dist.BroadcastOptions()
        options.rootRank = root
        self.group.broadcast([tensor], options).wait()
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


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


# One tensor of a bucket as the header names it: name, dtype, full shape, the bytes each sender holds of it, and the
# dimension the senders' blocks are consecutive along (joined in sender order).
Entry = Tuple[str, str, Tuple[int, ...], List[int], int]


class _Buckets:
    """Cuts a stream of tensors into buckets of at most `bucket_bytes` (by full size, the same cut on every sender)
    and sends each: the header from sender 0, then each sender's flat buffer of its parts."""

    def __init__(self, group: Optional[TransferGroup], member: int, senders: int, version: int, device, bucket_bytes):
        self.group, self.member, self.senders, self.version = group, member, senders, version
        self.device, self.bucket_bytes = device, bucket_bytes
        self.entries: List[Entry] = []
        self.mine: List[torch.Tensor] = []  # this sender's part of each entry
        self.held = 0
        self.stats = TransferStats()

    def add(self, name: str, part: torch.Tensor, shape: Tuple[int, ...], parts: List[int], dim: int = 0) -> None:
        full = sum(parts)
        if self.entries and self.held + full > self.bucket_bytes:
            self.flush(last=False)
        self.entries.append((name, str(part.dtype).removeprefix("torch."), tuple(shape), parts, dim))
        self.mine.append(part)
        self.held += full

    def flush(self, last: bool) -> None:
        if self.group is not None:
            if self.member == SENDER:
                _send_object(self.group, {"version": self.version, "entries": self.entries, "last": last}, self.device)
            else:  # every sender takes part in every broadcast of the group, the header's too
                _receive_object(self.group, self.device)
            for sender in range(self.senders):
                size = sum(_aligned(e[3][sender]) for e in self.entries)
                if size == 0:
                    continue
                if sender == self.member:
                    flat, offset = torch.zeros(size, dtype=torch.uint8, device=self.device), 0
                    for entry, part in zip(self.entries, self.mine):
                        nbytes = entry[3][sender]
                        flat[offset : offset + nbytes] = _as_bytes(part.to(self.device))
                        offset += _aligned(nbytes)
                    self.stats.bytes += sum(e[3][sender] for e in self.entries)
                else:
                    flat = torch.empty(size, dtype=torch.uint8, device=self.device)
                self.group.broadcast(flat, root=sender)
            self.stats.buckets += 1
        self.entries, self.mine, self.held = [], [], 0


def send_weights(
    group: Optional[TransferGroup],
    weights: Iterable[Tuple[str, torch.Tensor]],
    *,
    version: int,
    device: torch.device,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> TransferStats:
    """Broadcast `weights` to the receivers in buckets from the one sender (the actor's rank 0); `group` None on
    actor ranks that only help assemble the tensors (the iterator is collective over the actor's ranks, so every
    one of them must consume it). The seconds (and GB/s) cover the whole pass: assembling each tensor (FSDP
    gathers, megatron's TP/PP pieces) and sending it."""
    start = time.perf_counter()
    buckets = _Buckets(group, SENDER, 1, version, device, bucket_bytes)
    for name, tensor in weights:
        buckets.add(name, tensor, tuple(tensor.shape), [tensor.numel() * tensor.element_size()])
    buckets.flush(last=True)
    buckets.stats.seconds = time.perf_counter() - start
    return buckets.stats


def send_weight_shards(
    group: TransferGroup,
    shards: Iterable[Shard],
    *,
    senders: int,
    version: int,
    device: torch.device,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> TransferStats:
    """Every actor rank (transfer-group members 0 .. senders-1, each calling this) sends the block it holds of each
    tensor: `shards` yields a `Shard` for every tensor of the model (`TrainEngine.weight_shards`), in the same order on
    every sender, with an empty block where this rank holds none of it: FSDP's dim-0 rows, megatron's
    tensor-parallel pieces of its pipeline stage. No rank gathers a whole tensor; each sends its own bytes.
    `stats.bytes` counts this sender's."""
    start = time.perf_counter()
    buckets = _Buckets(group, group.rank, senders, version, device, bucket_bytes)
    for shard in shards:
        parts = block_bytes(shard, senders)
        if shard.part.numel() * shard.part.element_size() != parts[group.rank]:
            raise RuntimeError(
                f"{shard.name}: rank {group.rank} holds {tuple(shard.part.shape)} of {tuple(shard.shape)}, not the "
                f"block of dim {shard.dim} the senders' sizes {list(shard.sizes) or 'torch.chunk'} give it"
            )
        buckets.add(shard.name, shard.part, shard.shape, parts, shard.dim)
    buckets.flush(last=True)
    buckets.stats.seconds = time.perf_counter() - start
    return buckets.stats


def block_bytes(shard: Shard, senders: int) -> List[int]:
    """The bytes of each sender's block of `shard`'s tensor."""
    if not shard.sizes:
        return row_block_bytes(shard.shape, senders, shard.part.element_size())
    shape = tuple(shard.shape)
    if len(shard.sizes) != senders or sum(shard.sizes) != shape[shard.dim]:
        raise RuntimeError(
            f"{shard.name}: the senders' blocks {list(shard.sizes)} along dim {shard.dim} do not make up its shape "
            f"{shape} over {senders} senders"
        )
    per = shard.part.element_size() * int(torch.Size(shape[: shard.dim] + shape[shard.dim + 1 :]).numel())
    return [size * per for size in shard.sizes]


def row_block_bytes(shape: Tuple[int, ...], senders: int, element_size: int) -> List[int]:
    """The bytes of each sender's rows when torch.chunk splits dim 0 of `shape` into `senders` blocks (the last
    ranks may hold none); a 0-d tensor is sender 0's."""
    if not shape:
        return [element_size] + [0] * (senders - 1)
    rows, row_bytes = shape[0], element_size * int(torch.Size(shape[1:]).numel())
    per = -(-rows // senders) if rows else 0
    return [max(0, min(per, rows - r * per)) * row_bytes for r in range(senders)]


def receive_weights(
    group: TransferGroup, device: torch.device, stats: TransferStats, senders: int = 1
) -> Iterator[Tuple[str, torch.Tensor]]:
    """The senders' tensors one at a time, whole, as they arrive (feed them to `RolloutEngine.update_weights`).
    `senders`: how many actor ranks send (1: rank 0 sends whole tensors; more: each its blocks, joined here).
    `stats` is filled in as the buckets come; its `version` attribute is set from the headers."""
    start = time.perf_counter()
    while True:
        header = _receive_object(group, device)
        stats.version = header["version"]
        entries: List[Entry] = header["entries"]
        flats = []
        for sender in range(senders):
            size = sum(_aligned(e[3][sender]) for e in entries)
            flats.append(
                group.broadcast(torch.empty(size, dtype=torch.uint8, device=device), root=sender) if size else None
            )
        offsets = [0] * senders
        for name, dtype, shape, parts, dim in entries:
            pieces = []
            for sender, nbytes in enumerate(parts):
                if nbytes:
                    pieces.append(flats[sender][offsets[sender] : offsets[sender] + nbytes])
                    offsets[sender] += _aligned(nbytes)
            stats.bytes += sum(parts)
            yield name, _joined(pieces, getattr(torch, dtype), shape, dim)
        stats.buckets += 1
        if header["last"]:
            break
    stats.seconds = time.perf_counter() - start


def _joined(pieces: List[torch.Tensor], dtype: torch.dtype, shape: Tuple[int, ...], dim: int) -> torch.Tensor:
    """The tensor the senders' byte blocks make, joined along `dim` (dim 0, or one block: the bytes as they are)."""
    if dim == 0 or len(pieces) < 2:
        data = torch.cat(pieces) if len(pieces) > 1 else pieces[0] if pieces else torch.empty(0, dtype=torch.uint8)
        return data.view(dtype).view(shape)
    outer, inner = int(torch.Size(shape[:dim]).numel()), int(torch.Size(shape[dim + 1 :]).numel())
    blocks = [p.view(dtype).view(outer, -1, inner) for p in pieces]
    return torch.cat(blocks, dim=1).view(shape)
