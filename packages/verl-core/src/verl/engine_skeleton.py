"""The parts every train engine shares, written once (the engine skeleton); a backend keeps its forward/backward,
its model state and its checkpoint format, and calls these around them.

One optimizer step of an engine reads:

    require_optimizer(self.optimizer)
    acc = Accumulator.for_batch(batch, loss_fn)
    for mb in micro_batches: backward(acc(outputs_of(mb), mb))     # the backend's loop (or pipeline schedule)
    step = optimizer_step(self.state, self.optimizer, self.cfg, grad_norm=..., update=...)
    return {**acc.totals, **step}

and its checkpoint `backend state + save_extra(path, self.state)`, restored by `load_extra`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist

from verl.engine_protocol import EngineConfig, LossFn, Metrics
from verl.protocol import DataProto
from verl.utils.lr_schedule import lr_multiplier
from verl.utils.rng import get_rng_state, safe_load, set_rng_state


def micro_batches(
    batch: DataProto, micro_batch_size: int, max_tokens: Optional[int] = None, *, multiple: int = 1
) -> List[DataProto]:
    """`batch` cut into micro-batches: of `micro_batch_size` rows, or, with `max_tokens`, of consecutive rows
    holding at most that many tokens (attention-mask ones; a row over the budget alone). Consecutive, and cut
    between prompt groups (adjacent rows with one prompt) where a group fits, so shared-prefix packing computes
    each prompt once and outputs come back in order.

    Under a budget: as few micro-batches as it allows, rounded up to a multiple of `multiple` (an interleaved
    pipeline schedule runs them in groups), with tokens balanced over them (the smallest cap that needs no more
    of them): pipeline stages run every micro-batch at the largest one's shape."""
    if max_tokens is None:
        return batch.split(micro_batch_size)
    lengths = batch.batch["attention_mask"].sum(-1).tolist()
    groups = _prompt_groups(batch)
    want = -(-len(_token_pieces(lengths, groups, max_tokens)) // multiple) * multiple
    if multiple > 1 and want > len(lengths):
        raise ValueError(
            f"{len(lengths)} rows cannot make {want} micro-batches (a multiple of {multiple}, which the interleaved "
            "pipeline schedule needs); use more rows or parallel.vpp=null"
        )
    lo, hi = 1, max_tokens  # the smallest cap that still needs no more pieces than the budget does
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(_token_pieces(lengths, groups, mid)) <= want else (mid + 1, hi)
    pieces = _token_pieces(lengths, groups, lo)
    while len(pieces) < want:  # (rounded up to the multiple) halve the piece of most tokens that has rows to part
        i = max((j for j, (a, b) in enumerate(pieces) if b - a > 1), key=lambda j: sum(lengths[slice(*pieces[j])]))
        a, b = pieces[i]
        pieces[i : i + 1] = [(a, (a + b) // 2), ((a + b) // 2, b)]
    return [batch[a:b] for a, b in pieces]


def _prompt_groups(batch: DataProto) -> List[tuple]:
    """(start, end) of runs of adjacent rows with the same prompt (a GRPO group); each row alone without a
    `responses` column to tell the prompt from the response."""
    b = batch.batch
    rows = len(batch)
    if "responses" not in b.keys() or rows == 0:
        return [(i, i + 1) for i in range(rows)]
    p = b["input_ids"].shape[1] - b["responses"].shape[1]
    prompt = b["input_ids"][:, :p] * b["attention_mask"][:, :p]
    same = (prompt[1:] == prompt[:-1]).all(-1) & (b["attention_mask"][1:, :p] == b["attention_mask"][:-1, :p]).all(-1)
    starts = [0] + [i + 1 for i, s in enumerate(same.tolist()) if not s]
    return list(zip(starts, starts[1:] + [rows]))


def _token_pieces(lengths: List[int], groups: List[tuple], cap: int) -> List[tuple]:
    """(start, end) of consecutive rows, each piece filled with whole groups up to `cap` tokens; a group over
    `cap` gets pieces of its own, cut by rows (a row over `cap` alone)."""
    pieces, start, used = [], 0, 0
    for a, b in groups:
        n = sum(lengths[a:b])
        # A group over the cap is cut by rows in pieces of its own: its rows never join a neighbour's piece, so a
        # lower cap tried while balancing cannot part a group that fits the budget.
        if n > cap:
            if a > start:
                pieces.append((start, a))
            start, used = a, 0
            for i in range(a, b):
                if i > start and used + lengths[i] > cap:
                    pieces.append((start, i))
                    start, used = i, 0
                used += lengths[i]
            pieces.append((start, b))
            start, used = b, 0
            continue
        if a > start and used + n > cap:
            pieces.append((start, a))
            start, used = a, 0
        used += n
    if start < len(lengths) or not pieces:
        pieces.append((start, len(lengths)))
    return pieces


def layout_metrics(micro_batches: int, real: int, padded: int, computed: int) -> Metrics:
    """What one step's layout cost: its micro-batches, the padded rows' padding, and the tokens the model ran over
    (packed rows' count) against the padded rows' and per micro-batch."""
    return {
        "micro_batches": float(micro_batches),
        "padding_fraction": 1.0 - real / max(padded, 1),
        "computed_tokens_ratio": computed / max(padded, 1),
        "tokens_per_micro_batch": computed / max(micro_batches, 1),
    }


def require_optimizer(optimizer: Optional[object]) -> None:
    if optimizer is None:
        raise RuntimeError("this engine was built without an optimizer (inference only)")


@dataclass
class Accumulator:
    """Runs the caller's loss on each micro-batch and weights it by the micro-batch's share of the batch, so that
    gradients summed over micro-batches are the gradient of the whole batch however its rows are split; metrics
    are averaged the same way. The share is of the rows, or, for a loss that averages over tokens (its loss_fn
    has `weight_by = "tokens"`: token-mean aggregation), of the response tokens: a micro-batch of long responses
    weighs what its tokens weigh in the whole batch's token mean. `tokens` counts them over the whole batch (over
    every data-parallel rank, per rank: the backends average gradients over ranks), as `for_batch` sets it.

    Tensor metrics stay on their device until `totals` reads them all back in one transfer: a float() per
    metric per micro-batch would stall the device that many times."""

    rows: int  # rows of the whole batch
    loss_fn: LossFn
    tokens: Optional[float] = None  # response tokens per data-parallel rank; None: weigh by rows
    sums: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_batch(cls, batch: DataProto, loss_fn: LossFn, group: Any = None) -> "Accumulator":
        """The accumulator of `batch` (this rank's rows); a token-weighted loss counts the tokens of every rank
        of the data-parallel `group` (None: the default group when torch.distributed runs, else this rank)."""
        if getattr(loss_fn, "weight_by", "rows") != "tokens":
            return cls(len(batch), loss_fn)
        tokens = batch.batch["response_mask"].sum().double().reshape(1)
        ranks = dist.get_world_size(group) if dist.is_initialized() else 1
        if ranks > 1:
            if dist.get_backend(group) == "nccl":  # NCCL reduces device tensors only (the batch is on the host)
                tokens = tokens.to(torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(tokens, group=group)
        return cls(len(batch), loss_fn, tokens=float(tokens) / ranks)

    def share(self, mb: DataProto) -> float:
        """This micro-batch's weight in the whole batch's loss."""
        if self.tokens is None:
            return len(mb) / self.rows
        return float(mb.batch["response_mask"].sum()) / max(self.tokens, 1.0)

    def __call__(self, outputs: Dict[str, torch.Tensor], mb: DataProto) -> torch.Tensor:
        """The weighted loss of one micro-batch (what the backend differentiates)."""
        loss, metrics = self.loss_fn(outputs, mb)
        share = self.share(mb)
        for k, v in metrics.items():
            v = v.detach().float().reshape(()) if isinstance(v, torch.Tensor) else float(v)
            self.sums[k] = self.sums.get(k, 0.0) + v * share
        return loss * share

    @property
    def totals(self) -> Metrics:
        """The weighted means, as floats."""
        names = [k for k, v in self.sums.items() if isinstance(v, torch.Tensor)]
        out = {k: float(v) for k, v in self.sums.items() if k not in names}
        if names:
            device = self.sums[names[0]].device
            values = torch.stack([self.sums[k].to(device) for k in names]).tolist()
            out.update(zip(names, values))
        return out


def adamw(params: Iterable[torch.nn.Parameter], optim: Any) -> torch.optim.AdamW:
    """torch's AdamW from an `optim` config, with its fused kernel where torch has one for the parameters'
    device (CPU and CUDA: one kernel per step instead of several per parameter group), else the foreach one."""
    params = list(params)
    kw = dict(lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps, weight_decay=optim.weight_decay)
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.AdamW(params, **kw)


@dataclass
class TrainState:
    """What an engine counts besides its model and optimizer state; saved with every checkpoint (extra state)."""

    steps: int = 0  # optimizer steps taken, skipped ones included: the LR schedule's position


def set_lr(optimizer: torch.optim.Optimizer, cfg: EngineConfig, step: int) -> float:
    """Set every param group's lr for optimizer step `step` (0-based): cfg.optim's warmup/decay over
    cfg.total_steps. The one LR schedule path of every engine; returns the lr."""
    o = cfg.optim
    lr = o.lr * lr_multiplier(
        step,
        warmup_steps=o.warmup_steps,
        total_steps=cfg.total_steps,
        scheduler=o.scheduler,
        min_lr_ratio=o.min_lr_ratio,
    )
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def optimizer_step(
    state: TrainState,
    optimizer: torch.optim.Optimizer,
    cfg: EngineConfig,
    *,
    grad_norm: Callable[[], float],
    update: Callable[[float], None],
) -> Metrics:
    """One step after the gradients are in: set this step's lr, take the global gradient norm (`grad_norm`, which
    may clip as it measures), then `update(norm)` the weights unless the norm is non-finite: such a gradient would
    poison the weights, so the step is skipped and reported as `skipped_steps` (the schedule still advances)."""
    lr = set_lr(optimizer, cfg, state.steps)
    norm = float(grad_norm())
    finite = math.isfinite(norm)
    if finite:
        update(norm)
    state.steps += 1
    return {"grad_norm": norm, "lr": lr, **({} if finite else {"skipped_steps": 1.0})}


def meta_file(path: str, backend: str) -> str:
    """`verl_<backend>.json` in a role's checkpoint folder: what the engine that wrote it needs to read it back
    (its kind, dtype, base model, ...); `verl export` finds the backend by this name."""
    return os.path.join(path, f"verl_{backend}.json")


def read_meta(checkpoint: str, backend: str) -> Dict[str, Any]:
    """The meta_file of a `backend` engine's checkpoint, or a FileNotFoundError saying what to pass instead."""
    path = meta_file(checkpoint, backend)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{checkpoint} is not a checkpoint of the {backend} engine (no {os.path.basename(path)}); pass the "
            "role's folder, e.g. <checkpoint dir>/step_100/actor"
        )
    with open(path) as f:
        return json.load(f)


def _extra_file(path: str) -> str:
    return os.path.join(path, f"extra_rank{dist.get_rank()}.pt")


def save_extra(path: str, state: TrainState) -> None:
    """This rank's RNG state and step count beside the backend's checkpoint in `path` (`extra_rank{r}.pt`)."""
    torch.save({"rng": get_rng_state(), "steps": state.steps}, _extra_file(path))


def load_extra(path: str, state: TrainState) -> None:
    """Restore what save_extra wrote: the step count into `state`, the RNG streams of this process."""
    extra = safe_load(_extra_file(path))
    # (FSDP checkpoints written before the step count was saved hold the LR scheduler's state instead.)
    state.steps = extra["steps"] if "steps" in extra else (extra.get("scheduler") or {}).get("last_epoch", 0)
    set_rng_state(extra["rng"])


def export_then_barrier(write: Callable[[], None], others: Callable[[], None] = lambda: None) -> None:
    """Rank 0 writes (`write`), every other rank runs `others` (its part of the collectives that feed the
    writer), then all wait for the folder to be complete."""
    (write if dist.get_rank() == 0 else others)()
    dist.barrier()
