"""Routing replay for a mixture of experts on the megatron engine: the experts each router chose for every token
of a pass, returned as a batch column, and forced on a later pass over the same rows.

RL needs it because the router is a discrete choice: the old-log-prob pass and the update (or the rollout and the
trainer) can route the same token to different experts (numerics, or weights moved by an earlier mini-batch), and
then the importance ratio compares two different networks. Replaying recorded routes keeps the network the ratio is
taken over fixed (R2: the old-log-prob pass records, the update replays; R3: the rollout records, every actor pass
replays); the router's weights still learn, as the replayed experts' probabilities are recomputed from its logits
(megatron's RouterReplay: `gather` of the scores at the given indices).

The column is `routed_experts` [B, S, layers, k] (int16): for every position of a row in the batch layout, the k
experts of each routed layer in layer order. Routes are keyed by batch position, not by how a pass lays tokens out,
so any layout reads and writes them: each micro-batch's `Rows.source` says where a batch position is computed
(padded rows rotated, shared-prefix packs computing a prompt once for its group, THD streams); context parallelism
gives a rank its chunks of every sequence, sequence parallelism (tensor parallelism) a contiguous slice of those,
pipeline stages their layers. Recorded pieces are put together over the tensor, context and pipeline groups, so
every rank returns the whole column. A position the pass did not compute (a pack's padding; a packed row's last
token, which predicts nothing) records -1; replaying -1 routes to experts 0..k-1, harmlessly, as nothing reads what
such a position outputs. Padded rows compute their padding too, and record and replay its routes: a replayed update
is then the recorded pass's own, bit for bit.

`agreement()` reads, for the replayed passes, how many of the given experts the router would have chosen itself:
under R3 the routing agreement between rollout and trainer.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from verl.engine_protocol import ROUTED_EXPERTS
from verl_megatron.context_parallel import chunk_positions
from verl_megatron.sequences import Rows

ROUTES = ROUTED_EXPERTS


class Replay:
    """The routers of one rank's model chunks, each at its place among the whole model's routed layers; recording
    from and replaying into batch columns over any layout (see the module docstring)."""

    def __init__(self, chunks: Sequence[torch.nn.Module], layout, recompute: bool = False) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        per_chunk = [[m for m in chunk.modules() if isinstance(m, TopKRouter)] for chunk in chunks]
        routers = [r for rs in per_chunk for r in rs]
        if any(r.router_replay is None for r in routers):
            raise ValueError("routing replay needs a mixture of experts built with moe_enable_routing_replay")
        every = sorted(_over_stages([(int(r.layer_number), int(r.topk)) for r in routers], layout))
        if not every:
            raise ValueError("routing replay replays a mixture of experts' routes, and this model has no router")
        place = {n: i for i, (n, _) in enumerate(every)}
        self.layers, self.topk, self.layout = len(every), every[0][1], layout
        self.device = next(p for chunk in chunks for p in chunk.parameters()).device
        # id(chunk) -> [(its place among routed layers, megatron's RouterReplay)]
        self.chunks: Dict[int, List[Tuple[int, Any]]] = {
            id(chunk): [(place[int(r.layer_number)], r.router_replay) for r in rs]
            for chunk, rs in zip(chunks, per_chunk)
        }
        for _, replay in (x for xs in self.chunks.values() for x in xs):
            _follow_recompute(replay, recompute)
        for router in routers:
            router.register_forward_hook(self._agreement)
        self.recompute, self.recording = recompute, False
        self._current = 0  # the micro-batch the routers are running
        # replayed passes: sum of agreement, tokens counted (on the device: no host sync per router call)
        self._agree = torch.zeros(2, dtype=torch.float64, device=self.device)
        # Per micro-batch, on the device: the flat index into its Rows of each token this rank routes (megatron's
        # order); replaying, those tokens' experts [tokens, layers, k] and 1.0 where a real token was given routes
        # (what the agreement counts); recording, [G*L, layers, k] with -1 where not this rank's.
        self._local: List[torch.Tensor] = []
        self._targets: List[torch.Tensor] = []
        self._counted: List[torch.Tensor] = []
        self._pieces: List[torch.Tensor] = []
        self._source: List[torch.Tensor] = []  # per micro-batch: Rows.source (on the host)

    # ---- a pass ----------------------------------------------------------------------------------------------
    def record(self) -> "Replay":
        """The next pass records its routes (read them with `collected`)."""
        self.recording = True
        return self

    def begin(self, micro: Sequence[Any], layouts: Sequence[Rows]) -> None:
        """A pass over the micro-batches `micro` (DataProto; replaying, each holds the routes column) laid out as
        `layouts`."""
        local = [self._tokens_here(rows) for rows in layouts]
        self._local = [idx.to(self.device) for idx in local]
        self._source = [_source(rows) for rows in layouts]
        if self.recording:
            shape = (self.layers, self.topk)
            self._pieces = [torch.full((r.input_ids.numel(), *shape), -1, device=self.device) for r in layouts]
            return
        self._targets, self._counted = [], []
        for mb, rows, source, here in zip(micro, layouts, self._source, local):
            routes = mb.batch[ROUTES].cpu()
            first = _first_positions(source, rows.input_ids.numel())  # (the batch position each token computes)
            self._targets.append(self._packed_targets(routes, source, first)[here].to(self.device))
            real = ((routes >= 0).all(-1).all(-1) & mb.batch["attention_mask"].bool().cpu()).flatten().double()
            self._counted.append(torch.where(first >= 0, real[first.clamp(min=0)], 0.0)[here].to(self.device))

    def before(self, chunk: torch.nn.Module, i: int) -> None:
        """Called just before `chunk` runs micro-batch i: its routers record, or are given their experts."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self._current = i
        for layer, replay in self.chunks[id(chunk)]:
            if self.recording:
                replay.set_router_replay_action(RouterReplayAction.RECORD)
                continue
            # (also queued for a recompute in backward)
            replay.set_target_indices(self._targets[i][:, layer].contiguous())
            replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def after(self, chunk: torch.nn.Module, i: int) -> None:
        """Called just after `chunk` ran micro-batch i: what its routers recorded is kept."""
        if not self.recording:
            return
        for layer, replay in self.chunks[id(chunk)]:
            self._pieces[i][self._local[i], layer] = replay.get_recorded_indices().to(torch.long)

    def collected(self) -> List[torch.Tensor]:
        """Each micro-batch's recorded column [B, S, layers, k] (int16), put together over the tensor, context and
        pipeline groups. Collective over those groups."""
        from megatron.core import parallel_state as mpu

        sizes = [p.shape[0] for p in self._pieces]
        whole = torch.cat(self._pieces)
        for group in (mpu.get_tensor_and_context_parallel_group(), mpu.get_pipeline_model_parallel_group()):
            if dist.get_world_size(group) > 1:  # (each token of each layer is recorded on exactly one rank)
                dist.all_reduce(whole, op=dist.ReduceOp.MAX, group=group)
        out = []
        for piece, source in zip(whole.cpu().split(sizes), self._source):
            routes = piece[source.clamp(min=0)]
            routes[source < 0] = -1  # (nothing computed there)
            out.append(routes.to(torch.int16))
        return out

    def agreement(self) -> Dict[str, float]:
        """moe/routing_agreement: over the real tokens of the replayed passes since the last call, the share of
        the given experts the router would have chosen itself (1: it routes as the recording pass did; under r3,
        the rollout). Collective over every rank."""
        total, self._agree = self._agree, torch.zeros_like(self._agree)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total)
        return {"moe/routing_agreement": float(total[0] / total[1])} if float(total[1]) > 0 else {}

    def _agreement(self, router: Any, inputs: Any, output: Any) -> None:
        """Forward hook on a router: under replay, how many of each token's given experts its own top-k holds."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        replaying = router.router_replay.router_replay_action == RouterReplayAction.REPLAY_FORWARD
        if not replaying or (self.recompute and torch.is_grad_enabled()) or not self._counted:
            return  # (a recomputed forward would count its tokens twice)
        with torch.no_grad():
            x = inputs[0].reshape(-1, inputs[0].shape[-1])
            own = torch.nn.functional.linear(x.float(), router.weight.float()).topk(router.topk, dim=-1).indices
            shared = output[1].gather(1, own).sum(1).double() / router.topk  # routing_map [tokens, experts]
            weight = self._counted[self._current]
            self._agree += torch.stack([(shared * weight).sum(), weight.sum()])

    def off(self) -> None:
        """Route as the routers choose again; forget what was recorded or given."""
        self.recording = False
        for _, replay in (x for xs in self.chunks.values() for x in xs):
            replay.clear_indices()
            replay.clear_router_replay_action()
        self._targets, self._local, self._counted = [], [], []  # (recorded pieces stay for `collected`)

    # ---- where tokens are -----------------------------------------------------------------------------------
    def _tokens_here(self, rows: Rows) -> torch.Tensor:
        """Flat indices into `rows` of the tokens this rank's routers see, in megatron's order: this context-parallel
        rank's chunks of each row, this tensor-parallel rank's slice of those (sequence parallelism), sequence-major."""
        g, length = rows.input_ids.shape
        grid = torch.arange(g * length).view(g, length)
        lay = self.layout
        if lay.cp > 1:
            grid = grid[:, chunk_positions(length, lay.cp, lay.cp_rank)]
        if lay.tp > 1:  # (a mixture of experts with tp > 1 runs sequence parallel: refused otherwise)
            n = grid.shape[1] // lay.tp
            grid = grid[:, lay.tp_rank * n : (lay.tp_rank + 1) * n]
        return grid.t().reshape(-1)

    def _packed_targets(self, routes: torch.Tensor, source: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """[G*L, layers, k] experts for every token of a micro-batch's rows (`first`: the batch position each one
        computes, `_first_positions`), from the batch column `routes` [B, S, layers, k]: a token several batch
        positions share (a packed prompt) takes the first one's; tokens computing no batch position (padding), or
        given -1, take experts 0..k-1."""
        k, layers = self.topk, self.layers
        want = (*source.shape, layers, k)
        if tuple(routes.shape) != want:
            raise ValueError(
                f"{ROUTES} has shape {tuple(routes.shape)}; this micro-batch needs {want}: rows x positions x "
                "routed layers x top-k"
            )
        targets = torch.full((len(first), layers, k), -1, dtype=torch.long)
        have = first >= 0
        targets[have] = routes.reshape(-1, layers, k)[first[have]].long()
        unknown = (targets < 0).any(-1, keepdim=True)
        return torch.where(unknown, torch.arange(k), targets)


def _first_positions(source: torch.Tensor, tokens: int) -> torch.Tensor:
    """[tokens]: for each token of the rows, the first batch position (flat) it computes; -1 for none."""
    flat = source.flatten()
    first = torch.full((tokens,), flat.numel(), dtype=torch.long)
    computed = flat >= 0
    first.scatter_reduce_(0, flat[computed], torch.arange(flat.numel())[computed], reduce="amin")
    return torch.where(first < flat.numel(), first, -1)


def _source(rows: Rows) -> torch.Tensor:
    if rows.source is None:
        raise ValueError("routing replay needs rows that say where each batch position is computed (Rows.source)")
    return rows.source.cpu()


def _over_stages(values: list, layout) -> list:
    """`values` of every pipeline stage of this rank's model, concatenated (each stage holds some layers)."""
    if layout.pp == 1:
        return values
    from megatron.core import parallel_state as mpu

    gathered: List[Optional[list]] = [None] * layout.pp
    dist.all_gather_object(gathered, values, group=mpu.get_pipeline_model_parallel_group())
    return [v for vs in gathered for v in (vs or [])]


def _follow_recompute(replay, recompute: bool) -> None:
    """With full activation recompute, a layer's forward runs again in backward; under pipeline stages other
    micro-batches' forwards have run in between, so the recomputed forward must take its own micro-batch's experts:
    megatron queues every target it is given (REPLAY_BACKWARD pops them in order), and a forward is a recompute
    when it runs with gradients on (the first forward of a checkpointed layer runs without)."""
    if not recompute or getattr(replay, "_verl_follows_recompute", False):
        return
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    plain = replay.get_replay_topk

    def topk(scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        action = replay.router_replay_action
        if action is not None and action != RouterReplayAction.RECORD and torch.is_grad_enabled():
            replay.router_replay_action = RouterReplayAction.REPLAY_BACKWARD
            try:
                return plain(scores, topk, num_groups, group_topk, default_compute_topk)
            finally:
                replay.router_replay_action = action
        return plain(scores, topk, num_groups, group_topk, default_compute_topk)

    replay.get_replay_topk = topk
    replay._verl_follows_recompute = True
