"""Weights between Hugging Face and megatron-core layouts, for any tensor/pipeline (and virtual pipeline) split.

Every megatron tensor is described by a `Rule`: its name in a model chunk, the HF tensors it is made of, and a
sharding kind saying how a tensor-parallel rank's shard is cut from them (`to_mcore`) and how a run of shards
is put back (`to_hf`):

  replicate  norms, the value head                        every rank holds the whole tensor
  row        o_proj, down_proj                            columns split over tp
  vocab      embed_tokens, lm_head                        rows padded to the padded vocabulary, then split over tp
  qkv        q/k/v_proj (GQA)                             per query group [its q heads; k; v]; groups split over tp
  glu        gate/up_proj                                 each rank holds [gate shard; up shard]

A mixture-of-experts layer (`verl_megatron.moe`) has a replicated router and, per expert, a `glu` fc1 and a `row`
fc2 that are split over the expert tensor-parallel group (`axis="etp"`) and live on one expert-parallel rank:
global expert e sits on EP rank e // (experts / ep) as its local expert e % (experts / ep).

`plan()` lists where every tensor of a model lives (pipeline rank, virtual stage, name in the chunk) in HF order;
the engine loads, exports and streams weights through it. Round trips are exact: only slicing, concatenation
and zero padding happen, never arithmetic.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from verl_megatron import moe
from verl_megatron.hf_config import architecture, head_dim, padded_vocab_size

Tensor = torch.Tensor


@dataclass(frozen=True)
class Dims:
    """The sizes the sharding kinds need."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the tokenizer's (HF) vocabulary
    padded_vocab: int  # megatron's, a multiple of tp


def dims_of(hf_config: Any, tp: int) -> Dims:
    return Dims(
        num_heads=hf_config.num_attention_heads,
        num_kv_heads=hf_config.num_key_value_heads,
        head_dim=head_dim(hf_config),
        vocab_size=hf_config.vocab_size,
        padded_vocab=padded_vocab_size(hf_config.vocab_size, tp),
    )


# ---- sharding kinds: to_mcore(hf tensors, rank, tp, dims) -> shard; to_hf(shards of ranks first.., first, tp, dims)


def _replicate_to_mcore(hf: List[Tensor], rank: int, tp: int, d: Dims) -> Tensor:
    return hf[0]


def _replicate_to_hf(shards: List[Tensor], first: int, tp: int, d: Dims) -> List[Tensor]:
    return [shards[0]]


def _split(dim: int) -> Tuple[Callable, Callable]:
    def to_mcore(hf: List[Tensor], rank: int, tp: int, d: Dims) -> Tensor:
        if hf[0].shape[dim] % tp:
            raise ValueError(f"dimension {dim} of size {hf[0].shape[dim]} does not split over tp={tp}")
        return hf[0].chunk(tp, dim)[rank]

    def to_hf(shards: List[Tensor], first: int, tp: int, d: Dims) -> List[Tensor]:
        return [torch.cat(shards, dim)]

    return to_mcore, to_hf


def _vocab_to_mcore(hf: List[Tensor], rank: int, tp: int, d: Dims) -> Tensor:
    rows = d.padded_vocab // tp
    start, stop = rank * rows, (rank + 1) * rows
    shard = hf[0][start : min(stop, d.vocab_size)]
    pad = rows - shard.shape[0]
    if pad:  # rows past the tokenizer's vocabulary: zero, never a label, dropped again on export
        shard = torch.cat([shard, shard.new_zeros(pad, *shard.shape[1:])])
    return shard


def _vocab_to_hf(shards: List[Tensor], first: int, tp: int, d: Dims) -> List[Tensor]:
    rows = d.padded_vocab // tp
    start = first * rows
    full = torch.cat(shards)
    return [full[: max(0, d.vocab_size - start)]]


def _qkv_to_mcore(hf: List[Tensor], rank: int, tp: int, d: Dims) -> Tensor:
    q, k, v = hf
    groups, per_group = d.num_kv_heads, d.num_heads // d.num_kv_heads
    if groups % tp:
        raise ValueError(f"num_key_value_heads={groups} does not split over tp={tp} (megatron splits query groups)")
    tail = q.shape[1:]
    q = q.reshape(groups, per_group * d.head_dim, *tail)
    k = k.reshape(groups, d.head_dim, *tail)
    v = v.reshape(groups, d.head_dim, *tail)
    fused = torch.cat([q, k, v], dim=1)  # [groups, (per_group + 2) * head_dim, ...]
    return fused.chunk(tp, 0)[rank].reshape(-1, *tail)


def _qkv_to_hf(shards: List[Tensor], first: int, tp: int, d: Dims) -> List[Tensor]:
    per_group = d.num_heads // d.num_kv_heads
    fused = torch.cat(shards)
    tail = fused.shape[1:]
    fused = fused.reshape(-1, (per_group + 2) * d.head_dim, *tail)
    q, k, v = fused.split([per_group * d.head_dim, d.head_dim, d.head_dim], dim=1)
    return [t.reshape(-1, *tail) for t in (q, k, v)]


def _glu_to_mcore(hf: List[Tensor], rank: int, tp: int, d: Dims) -> Tensor:
    gate, up = hf
    if gate.shape[0] % tp:
        raise ValueError(f"intermediate_size={gate.shape[0]} does not split over tp={tp}")
    return torch.cat([gate.chunk(tp, 0)[rank], up.chunk(tp, 0)[rank]])


def _glu_to_hf(shards: List[Tensor], first: int, tp: int, d: Dims) -> List[Tensor]:
    halves = [s.chunk(2, 0) for s in shards]
    return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]


SHARDING: Dict[str, Tuple[Callable, Callable]] = {
    "replicate": (_replicate_to_mcore, _replicate_to_hf),
    "row": _split(1),
    "vocab": (_vocab_to_mcore, _vocab_to_hf),
    "qkv": (_qkv_to_mcore, _qkv_to_hf),
    "glu": (_glu_to_mcore, _glu_to_hf),
}


@dataclass(frozen=True)
class Rule:
    mcore: str  # name inside a model chunk; "{layer}" is the chunk-local layer index
    hf: Tuple[str, ...]  # HF names; "{layer}" is the global layer index
    kind: str  # a SHARDING key
    when: str = "always"  # a CONDITIONS key: which models have this tensor
    axis: str = "tp"  # the tensor-parallel group that splits it: "tp", or "etp" for an expert's weights

    def to_mcore(self, hf: List[Tensor], rank: int, tp: int, d: Dims) -> Tensor:
        return SHARDING[self.kind][0](hf, rank, tp, d)

    def to_hf(self, shards: List[Tensor], first: int, tp: int, d: Dims) -> List[Tensor]:
        return SHARDING[self.kind][1](shards, first, tp, d)


CONDITIONS: Dict[str, Callable[[Any], bool]] = {
    "always": lambda c: True,
    "qkv_bias": lambda c: architecture(c).qkv_bias(c),
    "qk_norm": lambda c: architecture(c).qk_norm,
}

LAYER_RULES: Tuple[Rule, ...] = (
    Rule(
        "decoder.layers.{layer}.input_layernorm.weight", ("model.layers.{layer}.input_layernorm.weight",), "replicate"
    ),
    Rule(
        "decoder.layers.{layer}.self_attention.linear_qkv.weight",
        tuple(f"model.layers.{{layer}}.self_attn.{p}_proj.weight" for p in "qkv"),
        "qkv",
    ),
    Rule(
        "decoder.layers.{layer}.self_attention.linear_qkv.bias",
        tuple(f"model.layers.{{layer}}.self_attn.{p}_proj.bias" for p in "qkv"),
        "qkv",
        when="qkv_bias",
    ),
    Rule(
        "decoder.layers.{layer}.self_attention.q_layernorm.weight",
        ("model.layers.{layer}.self_attn.q_norm.weight",),
        "replicate",
        when="qk_norm",
    ),
    Rule(
        "decoder.layers.{layer}.self_attention.k_layernorm.weight",
        ("model.layers.{layer}.self_attn.k_norm.weight",),
        "replicate",
        when="qk_norm",
    ),
    Rule(
        "decoder.layers.{layer}.self_attention.linear_proj.weight",
        ("model.layers.{layer}.self_attn.o_proj.weight",),
        "row",
    ),
    Rule(
        "decoder.layers.{layer}.pre_mlp_layernorm.weight",
        ("model.layers.{layer}.post_attention_layernorm.weight",),
        "replicate",
    ),
    Rule(
        "decoder.layers.{layer}.mlp.linear_fc1.weight",
        ("model.layers.{layer}.mlp.gate_proj.weight", "model.layers.{layer}.mlp.up_proj.weight"),
        "glu",
    ),
    Rule("decoder.layers.{layer}.mlp.linear_fc2.weight", ("model.layers.{layer}.mlp.down_proj.weight",), "row"),
)
EMBEDDING = Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")
FINAL_NORM = Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "replicate")
LM_HEAD = Rule("output_layer.weight", ("lm_head.weight",), "vocab")
TIED_LM_HEAD = Rule("output_layer.weight", ("model.embed_tokens.weight",), "vocab")  # last stage's copy, pp > 1
VALUE_HEAD = (
    Rule("value_head.weight", ("score.weight",), "replicate"),
    Rule("value_head.bias", ("score.bias",), "replicate"),
)

DENSE_MLP = ("decoder.layers.{layer}.mlp.linear_fc1.weight", "decoder.layers.{layer}.mlp.linear_fc2.weight")


def moe_rules(hf_config: Any, te: bool) -> Tuple[Rule, ...]:
    """A routed layer's MLP: the router, then one expert's fc1 and fc2 ("{expert}": local index in mcore names,
    global in HF names). TransformerEngine's grouped GEMM keeps a layer's experts as weight0, weight1, ..."""
    gate, up, down = moe.expert_hf_names(hf_config, 0, 0)
    hf = lambda name: name.replace("layers.0.", "layers.{layer}.").replace("experts.0.", "experts.{expert}.")
    fc = "decoder.layers.{layer}.mlp.experts." + ("{fc}.weight{expert}" if te else "local_experts.{expert}.{fc}.weight")
    return (
        Rule("decoder.layers.{layer}.mlp.router.weight", (hf(moe.router_hf_name(hf_config, 0)),), "replicate"),
        Rule(fc.replace("{fc}", "linear_fc1"), (hf(gate), hf(up)), "glu", axis="etp"),
        Rule(fc.replace("{fc}", "linear_fc2"), (hf(down),), "row", axis="etp"),
    )


# TransformerEngine's layer spec fuses the pre-attention and pre-MLP norms into the following linear layer
# (not the pre-MLP norm of a routed layer: its router and experts each read the normed input).
TE_NAMES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}


@dataclass(frozen=True)
class Placement:
    """One megatron tensor of the whole model: its rule, where it lives, and its names."""

    rule: Rule
    layer: Optional[int]  # global layer index (None outside the decoder layers)
    pp_rank: int
    vp_stage: int
    local_name: str  # the parameter's name inside its model chunk
    mirror: bool = False  # a copy kept in sync by megatron (tied output layer on the last stage): load, never export
    expert: Optional[int] = None  # global expert index (an expert's weight)
    ep_rank: Optional[int] = None  # the expert-parallel rank holding it (None: every one)

    @property
    def hf_names(self) -> Tuple[str, ...]:
        return tuple(n.format(layer=self.layer, expert=self.expert) for n in self.rule.hf)


@dataclass(frozen=True)
class PipelineSplit:
    """How decoder layers fall on pipeline ranks and virtual stages (megatron's standard interleaving)."""

    num_layers: int
    pp: int
    vpp: int  # virtual stages per pipeline rank (1: no interleaving)

    def __post_init__(self) -> None:
        chunks = self.pp * self.vpp
        if self.num_layers % chunks:
            raise ValueError(
                f"num_hidden_layers={self.num_layers} does not split evenly over pp*vpp = {self.pp}*{self.vpp} = "
                f"{chunks} model chunks; choose parallel.pp / parallel.vpp dividing {self.num_layers}"
            )

    @property
    def layers_per_chunk(self) -> int:
        return self.num_layers // (self.pp * self.vpp)

    def where(self, layer: int) -> Tuple[int, int, int]:
        """(pp_rank, vp_stage, chunk-local index) of global layer `layer`."""
        chunk, local = divmod(layer, self.layers_per_chunk)
        vp_stage, pp_rank = divmod(chunk, self.pp)
        return pp_rank, vp_stage, local

    def first(self) -> Tuple[int, int]:
        return 0, 0

    def last(self) -> Tuple[int, int]:
        return self.pp - 1, self.vpp - 1


def _te_name(name: str, te: bool, routed: bool = False) -> str:
    if not te:
        return name
    for local, fused in TE_NAMES.items():
        if name.endswith("." + local) and not (routed and local.startswith("pre_mlp")):
            return name[: -len(local)] + fused
    return name


def plan(
    hf_config: Any, split: PipelineSplit, *, kind: str = "causal_lm", te: bool = False, ep: int = 1
) -> List[Placement]:
    """Every megatron tensor of the model in HF order (embedding, layers, final norm, head); a routed layer's
    experts are listed for all `ep` expert-parallel ranks, each placement naming the one that holds it."""
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    routed = moe.moe_layers(hf_config) if moe.is_moe(hf_config) else [False] * split.num_layers
    experts = moe.num_experts(hf_config) if moe.is_moe(hf_config) else 0
    if experts % ep:
        raise ValueError(f"{experts} experts do not split over parallel.ep={ep}; choose an ep dividing {experts}")
    out: List[Placement] = [Placement(EMBEDDING, None, *split.first(), EMBEDDING.mcore)]
    for layer in range(split.num_layers):
        pp_rank, vp_stage, local = split.where(layer)
        for rule in LAYER_RULES:
            if CONDITIONS[rule.when](hf_config) and not (routed[layer] and rule.mcore in DENSE_MLP):
                name = _te_name(rule.mcore.format(layer=local), te, routed[layer])
                out.append(Placement(rule, layer, pp_rank, vp_stage, name))
        if routed[layer]:
            router, *expert_rules = moe_rules(hf_config, te)
            out.append(Placement(router, layer, pp_rank, vp_stage, router.mcore.format(layer=local)))
            per_rank = experts // ep
            for e in range(experts):
                for rule in expert_rules:
                    name = rule.mcore.format(layer=local, expert=e % per_rank)
                    out.append(Placement(rule, layer, pp_rank, vp_stage, name, expert=e, ep_rank=e // per_rank))
    out.append(Placement(FINAL_NORM, None, *split.last(), FINAL_NORM.mcore))
    if kind == "value":
        out += [Placement(rule, None, *split.last(), rule.mcore) for rule in VALUE_HEAD]
    elif not tied:
        out.append(Placement(LM_HEAD, None, *split.last(), LM_HEAD.mcore))
    elif split.pp > 1:  # the last stage keeps its own copy of the tied embedding for the output layer
        out.append(Placement(TIED_LM_HEAD, None, *split.last(), TIED_LM_HEAD.mcore, mirror=True))
    return out


def local_placements(
    placements: Sequence[Placement], pp_rank: int, vp_stage: int, ep_rank: int = 0
) -> Dict[str, Placement]:
    """The placements of one model chunk (on expert-parallel rank `ep_rank`), by parameter name."""
    return {
        p.local_name: p
        for p in placements
        if p.pp_rank == pp_rank and p.vp_stage == vp_stage and p.ep_rank in (None, ep_rank)
    }


# ---- reading Hugging Face safetensors --------------------------------------------------------------------------


class SafetensorsFolder:
    """Tensors of an HF folder by name, opened lazily (one safetensors file or a sharded index)."""

    def __init__(self, path: str):
        from safetensors import safe_open

        self.path = path
        index = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        if os.path.exists(index):
            with open(index) as f:
                self.files = {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
        elif os.path.exists(single):
            with safe_open(single, "pt") as f:
                self.files = {k: single for k in f.keys()}
        else:
            raise FileNotFoundError(
                f"{path} has no model.safetensors or model.safetensors.index.json; the megatron backend loads "
                "safetensors checkpoints (re-save the model with save_pretrained(safe_serialization=True))"
            )
        self._open: Dict[str, Any] = {}
        self._safe_open = safe_open

    def get(self, name: str) -> Tensor:
        if name not in self.files:
            raise KeyError(f"{self.path} has no tensor '{name}'")
        file = self.files[name]
        if file not in self._open:
            self._open[file] = self._safe_open(file, "pt")
        return self._open[file].get_tensor(name)


def mcore_to_hf(p: Placement, shards: List[Tensor], first: int, tp: int, dims: Dims) -> List[Tuple[str, Tensor]]:
    """HF (name, tensor) pairs from the shards of tensor-parallel ranks first, first+1, ... of `p`."""
    return list(zip(p.hf_names, p.rule.to_hf(shards, first, tp, dims)))
