"""The experts a mixture of experts routed every token to while generating: routing replay R3's `routed_experts`
column in the rollout batch's layout, [B, P + R, layers, k] (int16), -1 where no forward ran.

The hf rollout records them by forward hooks on the routers (transformers' `*TopKRouter` modules return logits,
weights and the chosen experts); vLLM returns them per sample (`place_routes` lays them out).

Each forward of the model calls every router once, in layer order, on its tokens flattened row-major; a generation
is the prompt's forward (or the shared prefill of all but its last token, then that token) and one forward per
token fed back, so the k-th forward's tokens sit at the positions after the ones before it. No forward runs the
last generated token (it predicts nothing, so it is never fed) or the response's padding beyond what was generated.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional

import torch


def routers_of(module: torch.nn.Module) -> List[torch.nn.Module]:
    """The top-k routers of a transformers mixture of experts, in layer order (none: a dense model)."""
    return [m for m in module.modules() if type(m).__name__.endswith("TopKRouter")]


class RouteRecorder:
    """Every router call of the forwards run inside `recording()`, put back into the batch layout by `routes`."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.routers = routers_of(module)
        if not self.routers:
            raise ValueError(
                "actor.routing_replay=r3 records a mixture of experts' routes in the rollout, and this model has no "
                "router (transformers' *TopKRouter modules)"
            )
        self.calls: List[torch.Tensor] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator["RouteRecorder"]:
        self.calls = []
        hooks = [r.register_forward_hook(self._keep) for r in self.routers]
        try:
            yield self
        finally:
            for h in hooks:
                h.remove()

    def _keep(self, module: torch.nn.Module, inputs, output) -> None:
        # [tokens, k], kept where it was computed: one copy to the host at the end, not a sync per router call
        self.calls.append(output[2].detach().to(torch.int16))

    def routes(self, rows: int, width: int, prefill_rows: Optional[int] = None, n: int = 1) -> torch.Tensor:
        """[rows, width, layers, k]: the recorded forwards placed one after another along each row. prefill_rows:
        the first forward ran each of that many prompts once, for its n adjacent samples (a shared prefill)."""
        layers = len(self.routers)
        if len(self.calls) % layers:
            raise RuntimeError(f"{len(self.calls)} router calls is not whole forwards of {layers} routed layers")
        calls = torch.cat(self.calls).cpu().split([c.shape[0] for c in self.calls]) if self.calls else []
        forwards = [torch.stack(calls[i : i + layers], dim=1) for i in range(0, len(calls), layers)]
        k = forwards[0].shape[-1] if forwards else 0
        out = torch.full((rows, width, layers, k), -1, dtype=torch.int16)
        at = 0
        for i, f in enumerate(forwards):
            shared = i == 0 and prefill_rows is not None
            f = (
                f.view(prefill_rows, -1, layers, k).repeat_interleave(n, dim=0)
                if shared
                else f.view(rows, -1, layers, k)
            )
            take = min(f.shape[1], width - at)
            out[:, at : at + take] = f[:, :take]
            at += take
        return out


def place_routes(
    per_sample: List[Optional[Any]], prompt_lengths: List[int], prompt_width: int, width: int
) -> torch.Tensor:
    """[rows, prompt_width + width, layers, k] from each sample's routes over its own tokens ([tokens, layers, k]:
    its unpadded prompt, then what it generated), placed where the batch holds those tokens (prompts left-padded to
    `prompt_width`); -1 elsewhere. A sample's routes are any array torch takes (vLLM gives numpy)."""
    missing = sum(r is None for r in per_sample)
    if missing:
        raise RuntimeError(
            f"{missing} of {len(per_sample)} samples came back without their routed experts (the engine was not "
            "started to return them)"
        )
    layers, k = per_sample[0].shape[1:] if per_sample and per_sample[0] is not None else (0, 0)
    out = torch.full((len(per_sample), prompt_width + width, layers, k), -1, dtype=torch.int16)
    for row, (routes, plen) in enumerate(zip(per_sample, prompt_lengths)):
        start = prompt_width - plen
        take = min(routes.shape[0], out.shape[1] - start)
        out[row, start : start + take] = torch.as_tensor(routes[:take]).to(torch.int16)
    return out
