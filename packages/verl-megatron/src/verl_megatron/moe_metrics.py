"""Router metrics of a mixture of experts on the megatron engine: how evenly each routed layer's tokens reach its
experts during a training step, and megatron's load-balancing term when that loss is on.

Counts come from forward hooks on megatron's routers (the routing map they return), kept on the device where
routing ran, and are summed over every rank only when the step's metrics are read. Loads are ratios to a layer's
mean, so tokens that several ranks route alike (tensor-parallel peers without sequence parallelism, a recomputed
forward) scale every expert of the layer alike and leave them unchanged.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist


def attach(chunks: Sequence[torch.nn.Module], config: Any) -> Optional["RouterLoad"]:
    """A RouterLoad on a mixture of experts' chunks (megatron's TransformerConfig says); None for a dense model."""
    if not config.num_moe_experts:
        return None
    balance = config.moe_router_load_balancing_type == "aux_loss" and config.moe_aux_loss_coeff > 0
    return RouterLoad(chunks, config.num_layers, config.num_moe_experts, balance=balance)


class RouterLoad:
    """Tokens routed to each expert of every routed layer in training forwards since the last `take()`."""

    def __init__(self, chunks: Sequence[torch.nn.Module], num_layers: int, num_experts: int, balance: bool = False):
        from megatron.core.transformer.moe.router import Router

        self.num_layers, self.num_experts = num_layers, num_experts
        self.balance = balance  # megatron's load-balancing loss is on (its tracker is process-wide: read it only then)
        self.counts: Optional[torch.Tensor] = None  # [layers, experts], on the routers' device once they ran
        self.layers: List[int] = []  # this rank's routed layers, 0-based over the whole model
        for chunk in chunks:
            for module in chunk.modules():
                if isinstance(module, Router):
                    layer = int(module.layer_number) - 1  # (megatron numbers layers from 1, over all stages)
                    self.layers.append(layer)
                    module.register_forward_hook(self._hook(layer))

    def _hook(self, layer: int):
        def count(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if not module.training:  # (log-prob passes run in eval mode)
                return
            routing_map = output[1]  # [tokens, experts], True where a token goes
            if self.counts is None:
                self.counts = torch.zeros(
                    self.num_layers, self.num_experts, dtype=torch.float64, device=routing_map.device
                )
            self.counts[layer] += routing_map.detach().sum(0)

        return count

    def take(self, device: torch.device, micro_batches: int, replayed: bool = False) -> Dict[str, float]:
        """moe/load_max and moe/load_min: the most and least tokens an expert received, as a multiple of its layer's
        mean (1 and 1: balanced; load_min 0: an expert no token reached), over every routed layer of the model;
        moe/balance_loss: megatron's load-balancing term before its coefficient (1: balanced), averaged over
        layers, ranks and micro-batches, when that loss is on; moe/routes_replayed: 1 when the step's tokens went to
        given experts (routing replay), else 0. Counting starts over. Collective: every rank calls it."""
        from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker, get_moe_layer_wise_logging_tracker

        counts = self.counts if self.counts is not None else torch.zeros(self.num_layers, self.num_experts)
        counts = counts.to(device=device, dtype=torch.float64)
        holders = torch.zeros(self.num_layers, dtype=torch.float64, device=device)  # ranks that route each layer
        holders[self.layers] = 1.0
        tracked = get_moe_layer_wise_logging_tracker().get("load_balancing_loss") if self.balance else None
        balance = torch.zeros(self.num_layers, dtype=torch.float64, device=device)
        if tracked is not None:
            balance += tracked["values"].detach().to(device=device, dtype=torch.float64)[: self.num_layers]
        summed = torch.cat([counts.flatten(), holders, balance])
        if self.counts is not None:
            self.counts.zero_()
        if tracked is not None:
            clear_aux_losses_tracker()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(summed)
        counts = summed[: counts.numel()].view(self.num_layers, self.num_experts)
        holders = summed[counts.numel() : counts.numel() + self.num_layers]
        balance = summed[counts.numel() + self.num_layers :]
        routed = (holders > 0) & (counts.sum(1) > 0)
        if not bool(routed.any()):
            return {}
        load = counts[routed] / counts[routed].mean(dim=1, keepdim=True)
        out = {"moe/load_max": float(load.max()), "moe/load_min": float(load.min()), "moe/routes_replayed": float(replayed)}
        if tracked is not None:
            out["moe/balance_loss"] = float((balance[routed] / holders[routed]).mean() / max(micro_batches, 1))
        return out
