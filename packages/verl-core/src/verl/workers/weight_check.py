"""Did a weight sync land? Fingerprints of the tensors fed to a rollout engine's loader against its parameters.

A fingerprint is two sums over a tensor's elements read as integers of their own width (a bf16 value's 16 bits,
an fp32 value's 32): the sum of the values and the sum of their squares, both modulo 2**64. Integer sums wrap
exactly and in any order, so the fingerprint of a tensor equals the sum of its shards' fingerprints however the
engine splits it (tensor-parallel shards, q/k/v fused into one parameter, experts fused into one), and rows of
zeros (vocabulary padding) add nothing. Any changed bit of one element changes the first sum. What it cannot see
is a permutation of a tensor's elements (a transposed or misordered shard); the trainer/rollout log-prob mismatch
(`rollout/logprob_diff_*`) measures those.

The expected side is taken from the tensors as they enter the engine's loader, cast to the dtype of the parameter
each lands in (so a bf16 engine fed fp32 tensors is compared with the bf16 values it holds); the actual side is
each rank's parameters after the load. The driver compares them per rollout replica (`compare`).
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch

Fingerprint = Tuple[int, int]  # (sum, sum of squares) of the elements' bit patterns, modulo 2**64
ABSENT = (-1, -1)  # (a rank that holds no part of a parameter)


class Target(NamedTuple):
    """Where an engine's loader puts a checkpoint tensor: the parameter (`key`), its dtype, and the factor the
    engine's loader multiplies it by first (a LoRA B matrix carries its adapter's scaling)."""

    key: str
    dtype: torch.dtype
    scale: float = 1.0


KeyOf = Callable[[str], Optional[Target]]  # checkpoint name -> where it lands; None: held nowhere (a tied head)
MOD = 1 << 64
_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# Elements widened to int64 at a time: on CPU a piece that stays in cache (512 KiB; 4x faster here than 32 MiB
# pieces), on a GPU large pieces (fewer kernel launches).
_CHUNK = {"cpu": 1 << 16, "cuda": 1 << 24}


def fingerprint(tensor: torch.Tensor) -> Fingerprint:
    """The tensor's fingerprint, computed on its device (on a GPU by verl-kernels' Triton kernel when installed:
    one read of the tensor instead of several passes)."""
    if tensor.is_cuda:
        kernel = _gpu_kernel()
        if kernel is not None:
            return kernel(tensor)
    return torch_fingerprint(tensor)


def torch_fingerprint(tensor: torch.Tensor) -> Fingerprint:
    """`fingerprint` in torch operations: the tensor widened to int64 piece by piece."""
    bits = tensor.detach().reshape(-1).view(_INT[tensor.element_size()])
    total = torch.zeros(2, dtype=torch.int64, device=bits.device)
    for chunk in bits.split(_CHUNK.get(bits.device.type, 1 << 20)):
        wide = chunk.to(torch.int64)
        total[0] += wide.sum()  # int64 arithmetic wraps: the sums are exact modulo 2**64
        total[1] += (wide * wide).sum()
    s, q = total.tolist()
    return s % MOD, q % MOD


@functools.lru_cache(maxsize=None)
def _gpu_kernel() -> Optional[Callable[[torch.Tensor], Fingerprint]]:
    try:
        from verl_kernels.fingerprint import fingerprint as kernel  # pants: no-infer-dep (an optional package)
    except ImportError:  # verl-kernels or Triton not installed: the torch path
        return None
    return kernel


def add(a: Fingerprint, b: Fingerprint) -> Fingerprint:
    return (a[0] + b[0]) % MOD, (a[1] + b[1]) % MOD


@dataclass
class Report:
    """One rollout rank's view of one sync: what its loader was fed and what its parameters hold afterwards."""

    version: int
    expected: Dict[str, Fingerprint]  # per parameter, from the tensors fed to the loader
    actual: Dict[str, Optional[Fingerprint]]  # per parameter, this rank's shard of it; None: not readable
    seconds: float = 0.0  # spent fingerprinting on this rank (both sides)


def scaled_like_the_loader(tensor: torch.Tensor, scale: float) -> torch.Tensor:
    """`tensor` times `scale`, in its own dtype: the one way both an engine's loader and the check scale a tensor,
    so both get the same bits."""
    return tensor * scale


class Recorder:
    """Fingerprints a weight stream on its way into an engine (`observe`), then the engine itself (`finish`)."""

    def __init__(self, key_of: KeyOf):
        self.key_of = key_of
        self.expected: Dict[str, Fingerprint] = {}
        self.seconds = 0.0

    def observe(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Iterator[Tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            start = time.perf_counter()
            target = self.key_of(name)
            if target is not None:  # (None: held nowhere of its own, a head tied to the embedding)
                scaled = tensor if target.scale == 1.0 else scaled_like_the_loader(tensor, target.scale)
                fp = fingerprint(scaled.to(target.dtype))
                self.expected[target.key] = add(self.expected.get(target.key, (0, 0)), fp)
            self.seconds += time.perf_counter() - start
            yield name, tensor

    def finish(
        self, version: int, actual: Callable[[], Optional[Dict[str, Optional[Fingerprint]]]]
    ) -> Optional[Report]:
        """The report, with the engine's side read now (`actual`); None when the engine has nothing to check."""
        start = time.perf_counter()
        held = actual()
        if held is None:
            return None
        return Report(version, self.expected, held, self.seconds + time.perf_counter() - start)


@dataclass
class Watched:
    weights: Iterable[Tuple[str, torch.Tensor]]  # the stream to feed the engine
    report: Optional[Report] = None  # set after the load, when this sync was checked


@contextlib.contextmanager
def watch_sync(
    engine: Any, weights: Iterable[Tuple[str, torch.Tensor]], version: int, check: bool, lock: Any = None
) -> Iterator[Watched]:
    """Around one sync into `engine`: when `check` and the engine can be checked, the stream is fingerprinted on its
    way in and the engine's parameters after it (`Watched.report`, for policy `version`), under `lock` (the rollout
    service's engine lock: its thread generates between loads)."""
    if not check or not hasattr(engine, "weight_fingerprints"):
        yield Watched(weights)
        return
    recorder = Recorder(engine.fingerprint_key)
    watched = Watched(recorder.observe(weights))
    yield watched
    with lock or contextlib.nullcontext():
        watched.report = recorder.finish(version, engine.weight_fingerprints)


def due(number: int, every: int) -> bool:
    """Whether sync `number` (1, 2, ...) is checked under rollout.verify_weights_every=`every`."""
    return every > 0 and number > 0 and number % every == 0


class WeightSyncMismatch(RuntimeError):
    """The rollout engine does not hold the weights it was sent."""


@dataclass
class Comparison:
    problems: List[str]  # one line per parameter that is wrong, naming it and the rollout rank(s)
    checked: int  # parameters compared
    unchecked: List[str]  # parameters the engine holds in a form it cannot read back (vLLM CPU's packed GEMMs)


def compare(reports: Sequence[Report], replica_size: int, *, ranks: Optional[Sequence[int]] = None) -> Comparison:
    """One sync's verdict: every replica must hold what it was fed. `reports` are the rollout ranks' in order,
    `replica_size` consecutive ranks forming one engine (its tensor-parallel group); `ranks` their rank numbers
    (default 0, 1, ...)."""
    ranks = list(range(len(reports))) if ranks is None else list(ranks)
    result = Comparison([], 0, [])
    first = reports[0].expected if reports else {}
    for i, report in enumerate(reports):
        if report.expected != first:  # every rank is fed the same stream (the transfer is bitwise)
            differ = sorted(k for k in set(first) | set(report.expected) if first.get(k) != report.expected.get(k))
            result.problems.append(f"rank {ranks[i]} was sent other tensors than rank {ranks[0]}: {_names(differ)}")
    for start in range(0, len(reports), replica_size):
        group = reports[start : start + replica_size]
        where = f"on rank(s) {', '.join(str(r) for r in ranks[start : start + replica_size])}"
        expected = group[0].expected
        for key in sorted(set().union(*(r.actual for r in group)) - set(expected)):
            result.problems.append(f"{key} {where}: not sent, so it still holds older values")
        for key, want in sorted(expected.items()):
            shards = [r.actual.get(key, ABSENT) for r in group]
            if all(s is ABSENT for s in shards):
                if want == (0, 0):  # all zeros (a LoRA B before it trains): an engine that lists no zero slices
                    result.checked += 1
                    continue
                result.problems.append(f"{key} {where}: sent, but the engine holds no such parameter")
            elif any(s is None for s in shards):
                result.unchecked.append(key)
            else:
                held = [(0, 0) if s is ABSENT else s for s in shards]
                total = (0, 0)
                for s in held:
                    total = add(total, s)
                # a shard per rank sums to the tensor; a parameter every rank holds whole (a norm) equals it on each
                if total != want and any(s != want for s in held):
                    result.problems.append(f"{key} {where}: holds other values than it was sent")
                result.checked += 1
    return result


def _names(keys: Sequence[str], shown: int = 5) -> str:
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more
