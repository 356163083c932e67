"""`verl plan RECIPE --suggest`: the layouts a run can take on its devices, those whose estimated peak memory fits
(verl.memory_plan) with validate's margin, ranked by the throughput model (verl.throughput_model), each as the overrides that give it.

Searched: the pools (the recipe's; a rollout sharing the actor's devices also given a quarter or half of them for
its own, steps staying synchronous), the megatron actor's tensor, pipeline, context (sequences of 8k tokens and
more) and expert (a mixture of experts: the recipe's, half and twice it) parallel sizes, the reference following
the actor's where it sets its own, the vLLM/SGLang rollout's tensor parallel size; and per layout the least costly
way to fit: as the recipe has it, then with activation recompute, then half the update's micro-batch too, then the
optimizer in host memory too. An overlapped trainer.mode is not searched: it changes what the algorithm trains on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

from verl.decoder_dims import Dims
from verl.memory_model import compute_dtype, size_text
from verl.memory_plan import WARN_SHARE, cfg_value, device_memory, replan, value_text
from verl.throughput_model import Speeds, StepTime, speeds, step_time

Override = Tuple[str, Any]  # (key, value)


@dataclass(frozen=True)
class Candidate:
    overrides: Tuple[Override, ...]
    peak: int  # bytes: the largest phase on the busiest rank
    peak_phase: str
    time: StepTime
    samples: int

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.time.total


def _divisors(n: int, options: Tuple[int, ...]) -> List[int]:
    return [k for k in options if n % k == 0]


def _pool_variants(plan: Any) -> Iterator[Tuple[Tuple[Override, ...], int, int]]:
    """(overrides, training devices, rollout devices): the recipe's pools, and where the rollout shares the actor's
    pool, that pool split with a quarter or half of its devices for the rollout (synchronous steps: generation on
    its devices, then training on the others)."""
    pool = next(p for p in plan.pools if "actor" in p.roles)
    rollout_pool = next((p for p in plan.pools if "rollout" in p.roles), None)
    yield (), pool.size, rollout_pool.size if rollout_pool else 0
    if rollout_pool is None or rollout_pool is not pool or pool.size < 4:
        return
    trained = [r for r in pool.roles if r != "rollout"]
    for share in (4, 2):
        gen = pool.size // share
        pools = [
            {"name": "train", "roles": trained, "devices": pool.size - gen},
            {"name": "rollout", "roles": ["rollout"], "devices": gen},
        ]
        yield (("placement.pools", pools),), pool.size - gen, gen


def layouts(cfg: Any, plan: Any, d: Dims) -> Iterator[Tuple[Override, ...]]:
    """Overrides of every layout in the search space (the recipe's own first)."""
    heads, kv_heads, experts = d.heads, d.kv_heads, d.experts
    node = plan.devices_per_node
    actor = plan.layout("actor")
    follow = plan.has("ref") and not plan.ref_from_actor and cfg.ref.get("parallel") is not None
    long = plan.prompt_length + plan.response_length >= 8192
    for pools, train_devices, gen_devices in _pool_variants(plan):
        trains: List[Tuple[Override, ...]] = [()]
        if actor.backend == "megatron":
            trains = []
            for tp in _divisors(math.gcd(heads, kv_heads), (1, 2, 4, 8)):
                for pp in _divisors(d.layers, (1, 2, 4)):
                    for cp in (1, 2) if long else (actor.cp,):
                        for ep in _expert_sizes(actor.ep, experts):
                            split = tp * pp * cp
                            if tp > node or train_devices % split or (train_devices // (pp)) % (ep * tp):
                                continue
                            sizes = {"tp": tp, "pp": pp, "cp": cp, "ep": ep}
                            keys = [(f"actor.parallel.{k}", v) for k, v in sizes.items()]
                            if follow:
                                keys += [(f"ref.parallel.{k}", v) for k, v in sizes.items()]
                            trains.append(tuple(keys))
        rollouts: List[Tuple[Override, ...]] = [()]
        if plan.has("rollout") and plan.role("rollout").backend in ("vllm", "sglang"):
            rollouts = [
                (("rollout.parallel.tp", tp),)
                for tp in _divisors(heads, (1, 2, 4, 8))
                if tp <= node and gen_devices % tp == 0
            ]
        for train in trains:
            for rollout in rollouts:
                yield pools + train + rollout


def _expert_sizes(ep: int, experts: int) -> List[int]:
    """Expert-parallel sizes to try: the recipe's, half and twice it (a mixture of experts; a dense model: 1)."""
    if not experts:
        return [1]
    return [e for e in dict.fromkeys((ep, max(1, ep // 2), ep * 2)) if experts % e == 0]


def _fits(cfg: Any) -> Iterator[Tuple[Override, ...]]:
    """The ways to fit a layout, least costly first."""
    recompute: Override = ("model.gradient_checkpointing", True)
    actor = cfg.actor
    tokens = actor.get("ppo_max_tokens_per_device")
    half: Override = (
        ("actor.ppo_max_tokens_per_device", max(1, int(tokens) // 2))
        if tokens
        else ("actor.ppo_micro_batch_size_per_device", max(1, int(actor.ppo_micro_batch_size_per_device) // 2))
    )
    yield ()
    yield (recompute,)
    yield (recompute, half)
    yield (recompute, half, ("actor.optimizer_offload", True))


def _evaluate(cfg: Any, overrides: Tuple[Override, ...], device_bytes: int, s: Speeds, d: Dims) -> Optional[Candidate]:
    planned = replan(cfg, overrides)
    if planned is None:
        return None
    changed, plan, table = planned
    top = max(table, key=lambda p: p.peak)
    if top.peak > WARN_SHARE * device_bytes:  # (what validate would warn of is no suggestion)
        return None
    kv = None
    if plan.has("rollout") and plan.role("rollout").backend in ("vllm", "sglang"):
        # what a replica's share of its devices leaves for the cache once it holds every expert's weights
        rollout = plan.role("rollout").layout
        weights = d.parameters() * compute_dtype(changed, plan).itemsize / rollout.tp
        kv = rollout.tp * max(1.0, float(changed.rollout.gpu_memory_utilization) * device_bytes - weights)
    time = step_time(changed, plan, d, s, kv_capacity=kv)
    return Candidate(overrides, top.peak, top.name, time, plan.batch.samples)


def suggest(
    cfg: Any, plan: Any, hf_config: Any, limit: int = 5
) -> Tuple[List[Candidate], Optional[Candidate], Speeds, int]:
    """The fitting layouts, fastest first by the model, at most `limit`, and the recipe's own (None: it does not
    fit); raises ValueError when the device memory or the throughput model's assumptions are not known."""
    device_bytes, _ = device_memory(cfg)
    s = speeds(cfg)
    if device_bytes is None or s is None:
        raise ValueError(
            "the search needs the device: placement.accelerator (one of the known ones), or "
            "placement.device_memory_gb and every planner.* speed"
        )
    d = Dims.of(hf_config)
    found: List[Candidate] = []
    for layout in layouts(cfg, plan, d):
        for extra in _fits(cfg):
            changes = tuple(o for o in dict(layout + extra).items() if cfg_value(cfg, o[0]) != o[1])
            candidate = _evaluate(cfg, changes, device_bytes, s, d)
            if candidate is not None:
                found.append(candidate)
                break
    found.sort(key=lambda c: c.time.total)
    # the recipe's own layout, when the search met it, else on its own
    own = next((c for c in found if not c.overrides), None) or _evaluate(cfg, (), device_bytes, s, d)
    return found[:limit], own, s, device_bytes


def _line(c: Candidate) -> str:
    t = c.time
    return (
        f"~{c.samples_per_s:.1f} samples/s (step ~{t.total:.0f} s: generate {t.generate:.0f}, train {t.train:.0f}, "
        f"communicate {t.communicate:.0f}); peak {size_text(c.peak)} in {c.peak_phase}"
    )


def format_suggestions(found: List[Candidate], own: Optional[Candidate], s: Speeds, device_bytes: int) -> List[str]:
    lines = [f"throughput model: {s.text()}; {size_text(device_bytes)} per device"]
    lines.append("the recipe as it is: " + (_line(own) if own else f"does not fit (over {WARN_SHARE:.0%} of a device)"))
    if not found:
        return lines + ["no layout in the search fits (more devices, a shorter response length or a smaller batch)"]
    for i, c in enumerate(found, 1):
        lines.append(f"{i}. {_line(c)}")
        written = " ".join(f"{k}={value_text(v)}" for k, v in c.overrides)
        lines.append("   " + (written or "(the recipe as it is)"))
    return lines
