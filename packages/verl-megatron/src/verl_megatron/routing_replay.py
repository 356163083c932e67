"""Routing replay for a mixture of experts on the megatron engine: the experts each router chose for every token
of a pass, returned as a batch column, and forced on a later pass over the same rows.

RL needs it because the router is a discrete choice: the old-log-prob pass and the update (or the rollout and the
trainer) can route the same token to different experts (numerics, or weights moved by an earlier mini-batch), and
then the importance ratio compares two different networks. Replaying the recorded routes (R2: the old-log-prob pass
records, the update replays) keeps the network the ratio is taken over fixed; the router's weights still learn, as
the replayed experts' probabilities are recomputed from its logits (megatron's RouterReplay: `gather` of the scores
at the given indices).

The column is `routed_experts` [B, S, layers, k] (int16): for every position of a row (prompt and response, in the
batch layout, padding included), the k experts of each routed layer in layer order. Routes are taken in the padded
layout (rows rotated so real tokens start at 0: `sequences.rotation`, a permutation of each row's positions), so
a row's routes do not depend on which micro-batch or pack it ran in. Recording and replay run this rank's whole
sequences: tensor parallelism (with its sequence parallelism), context parallelism and pipeline stages split them
and are refused here; expert and data parallelism are not.
"""

from __future__ import annotations

from typing import Sequence

import torch

from verl_megatron.sequences import rotation

ROUTES = "routed_experts"


class Replay:
    """The routers of one model's chunks, in layer order, recorded from and replayed into as batch columns."""

    def __init__(self, chunks: Sequence[torch.nn.Module], layout) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        if layout.tp > 1 or layout.cp > 1 or layout.pp > 1:
            raise ValueError(
                f"routing replay with tp={layout.tp}, cp={layout.cp}, pp={layout.pp} is not built (a rank must hold "
                "whole sequences and every layer): use tp=cp=pp=1 with ep/dp for the experts"
            )
        routers = [m for chunk in chunks for m in chunk.modules() if isinstance(m, TopKRouter)]
        routers.sort(key=lambda r: r.layer_number)
        if not routers or any(r.router_replay is None for r in routers):
            raise ValueError("routing replay needs a mixture of experts built with moe_enable_routing_replay")
        self.replays = [r.router_replay for r in routers]
        self.topk = routers[0].topk
        self.recording = False

    def record(self) -> "Replay":
        """The next forwards record their routes (read each with `recorded`) until `off()`."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self.recording = True
        for r in self.replays:
            r.clear_indices()
            r.set_router_replay_action(RouterReplayAction.RECORD)
        return self

    def recorded(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The routes of the last forward, over padded rows of this micro-batch: [B, S, layers, k] in the batch
        layout (`attention_mask` [B, S] is the micro-batch's)."""
        b, s = attention_mask.shape
        # megatron's tokens are sequence-major ([s, b] flattened); the padded rows are rotated by `rotation`
        per_layer = [r.get_recorded_indices().view(s, b, self.topk).transpose(0, 1) for r in self.replays]
        rotated = torch.stack(per_layer, dim=2).to(device="cpu", dtype=torch.int16)  # [B, S, layers, k]
        routes = torch.empty_like(rotated)
        idx = rotation(attention_mask.cpu())
        routes.scatter_(1, idx[:, :, None, None].expand_as(rotated), rotated)
        return routes

    def replay(self, routes: torch.Tensor, attention_mask: torch.Tensor, device: torch.device) -> None:
        """The next forward routes every token of this micro-batch ([B, S] mask) to `routes` [B, S, layers, k]."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        b, s = attention_mask.shape
        if routes.shape[:3] != (b, s, len(self.replays)) or routes.shape[3] != self.topk:
            raise ValueError(
                f"{ROUTES} has shape {tuple(routes.shape)}; this micro-batch needs ({b}, {s}, {len(self.replays)}, "
                f"{self.topk}): rows x positions x routed layers x top-k"
            )
        idx = rotation(attention_mask.cpu())
        rotated = torch.gather(routes.cpu(), 1, idx[:, :, None, None].expand_as(routes))
        for layer, r in enumerate(self.replays):
            r.clear_indices()
            target = rotated[:, :, layer].transpose(0, 1).reshape(s * b, self.topk)
            r.set_target_indices(target.to(device=device, dtype=torch.long))
            r.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def off(self) -> None:
        """Route as the router chooses again; forget what was recorded or given."""
        self.recording = False
        for r in self.replays:
            r.clear_indices()
            r.clear_router_replay_action()

