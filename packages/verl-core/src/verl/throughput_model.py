"""A stated, simple model of one training step's time on a layout, to rank the layouts `verl plan --suggest` finds.

Not a prediction of seconds: a way to compare layouts of one run on one kind of machine. Its assumptions are the
`planner.*` keys (defaults per `placement.accelerator`), printed with every ranking:

- generation is bound by memory bandwidth: every decoding step of a rollout replica reads its share of the
  weights and the KV cache of its batch (batches as large as the KV cache the replica has left allow, in waves);
  the prompts' prefill is compute at `planner.mfu`;
- training is compute: 6 x active parameters x tokens per update pass (8 with activation recompute), 2 x per
  log-prob pass, at `planner.mfu` of `planner.peak_tflops` on every training device, stretched by the pipeline's
  bubble ((pp - 1) / micro-batches);
- communication adds, unoverlapped: tensor parallelism's all-reduces of activations over the node's links (four a
  layer for each training token, two for each log-prob token), the data-parallel gradient reduce-scatter and weight
  all-gather per optimizer step over the node's links or the network when data-parallel ranks span nodes, and a
  rollout on a pool of its own receiving the weights after every update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional

from verl.decoder_dims import Dims
from verl.memory_model import compute_dtype

# planner.* defaults per accelerator: dense bf16 TFLOP/s (the SXM parts' figures benchmarks/machine.py measures MFU
# against), HBM GB/s, GB/s per GPU over the node's links and over the network (one direction)
ACCELERATOR_SPEEDS: Dict[str, Dict[str, float]] = {
    "h100": {"peak_tflops": 989.4, "hbm_gbps": 3350.0, "node_link_gbps": 450.0, "network_gbps": 50.0},
    "h200": {"peak_tflops": 989.4, "hbm_gbps": 4800.0, "node_link_gbps": 450.0, "network_gbps": 50.0},
    "b200": {"peak_tflops": 2250.0, "hbm_gbps": 8000.0, "node_link_gbps": 900.0, "network_gbps": 50.0},
    "a100-80gb": {"peak_tflops": 312.0, "hbm_gbps": 2039.0, "node_link_gbps": 300.0, "network_gbps": 25.0},
    "a100-40gb": {"peak_tflops": 312.0, "hbm_gbps": 1555.0, "node_link_gbps": 300.0, "network_gbps": 25.0},
    "l40s": {"peak_tflops": 362.1, "hbm_gbps": 864.0, "node_link_gbps": 32.0, "network_gbps": 25.0},
}
DEFAULT_MFU = 0.4


@dataclass(frozen=True)
class Speeds:
    peak_tflops: float
    hbm_gbps: float
    node_link_gbps: float
    network_gbps: float
    mfu: float = DEFAULT_MFU

    def text(self) -> str:
        return (
            f"{self.peak_tflops:g} TFLOP/s at {self.mfu:.0%} MFU, HBM {self.hbm_gbps:g} GB/s, node links "
            f"{self.node_link_gbps:g} GB/s, network {self.network_gbps:g} GB/s per device"
        )


def speeds(cfg: Any) -> Optional[Speeds]:
    """The planner.* keys, each defaulting to the accelerator's; None when neither says."""
    accelerator = cfg.placement.get("accelerator")
    base = dict(ACCELERATOR_SPEEDS.get(str(accelerator), {}))
    planner = cfg.get("planner") or {}
    for key in ("peak_tflops", "hbm_gbps", "node_link_gbps", "network_gbps", "mfu"):
        if planner.get(key) is not None:
            base[key] = float(planner[key])
    if not {"peak_tflops", "hbm_gbps", "node_link_gbps", "network_gbps"} <= base.keys():
        return None
    return Speeds(**base)


@dataclass(frozen=True)
class StepTime:
    generate: float
    train: float
    communicate: float

    @property
    def total(self) -> float:
        return self.generate + self.train + self.communicate


def step_time(cfg: Any, plan: Any, d: Dims, s: Speeds, kv_capacity: Optional[float] = None) -> StepTime:
    """Seconds of one step of the planned run by the model above (`kv_capacity`: bytes a rollout replica has for
    its KV cache; None: every sample of a replica at once)."""
    e = compute_dtype(cfg, plan).itemsize
    params = d.parameters(active=True)
    h, layers = d.hidden, d.layers
    samples = plan.batch.samples
    prompt, response = plan.prompt_length, plan.response_length
    flops = s.peak_tflops * 1e12 * s.mfu
    # generation: each replica decodes its samples
    rollout = plan.role("rollout").layout
    per_replica = math.ceil(samples / rollout.dp)
    kv_token = d.kv_cache_bytes_per_token(e)
    kv_all = per_replica * (prompt + response) * kv_token
    waves = max(1, math.ceil(kv_all / kv_capacity)) if kv_capacity else 1
    batch = math.ceil(per_replica / waves)
    decode_step = (params * e / rollout.tp + batch * (prompt + response / 2) * kv_token / rollout.tp) / (
        s.hbm_gbps * 1e9
    )
    prefill = 2 * params * per_replica * prompt / (rollout.tp * flops)
    generate = waves * response * decode_step + prefill
    # training: every role's passes over all tokens, on its devices
    tokens = samples * (prompt + response)
    train = communicate = 0.0
    for rp in plan.role_plans:
        if rp.name == "rollout" or rp.name == "reward":
            continue
        layout = rp.layout
        passes = 2.0 if rp.micro_batch and not (rp.name == "actor" and plan.old_log_probs == "update") else 0.0
        tp_allreduces = 2.0 if passes else 0.0
        if rp.train is not None:
            passes += (8.0 if cfg.model.gradient_checkpointing else 6.0) * rp.train.epochs
            tp_allreduces += 4.0 * rp.train.epochs
        micro = (rp.train.micro_batches or 1) if rp.train is not None else 1
        bubble = 1 + (layout.pp - 1) / max(1, micro)
        train += passes * params * tokens * bubble / (layout.world * flops)
        if layout.tp > 1:  # ring all-reduce of [tokens, h] per layer, within the node
            per_rank_tokens = tokens / (layout.dp * layout.cp)
            volume = tp_allreduces * layers * per_rank_tokens * h * e * 2 * (layout.tp - 1) / layout.tp
            communicate += volume / (s.node_link_gbps * 1e9)
        if rp.train is not None and layout.dp > 1:  # reduce-scatter fp32 grads, all-gather weights
            link = s.network_gbps if layout.world > plan.devices_per_node else s.node_link_gbps
            shard = params / (layout.tp * layout.pp)
            volume = rp.train.optimizer_steps_per_step * shard * (4 + e) * (layout.dp - 1) / layout.dp
            communicate += volume / (link * 1e9)
    actor_pool = next(p for p in plan.pools if "actor" in p.roles)
    if "rollout" not in actor_pool.roles:  # the weights cross to the rollout's pool after every update
        link = s.network_gbps if plan.nnodes > 1 else s.node_link_gbps
        communicate += params * e / (link * 1e9)
    return StepTime(generate=generate, train=train, communicate=communicate)
