"""HF <-> megatron tensor layouts: each sharding kind by hand, round trips by property, and the placement plan."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_megatron.convert import Dims, PipelineSplit, Rule, plan
from verl_megatron.hf_config import check_supported, gpt_model_kwargs, padded_vocab_size, rope


def _dims(heads=4, kv=2, hd=1, vocab=5, tp=2) -> Dims:
    return Dims(heads, kv, hd, vocab, padded_vocab_size(vocab, tp))


def _rule(kind: str, n: int) -> Rule:
    return Rule("x", tuple(f"h{i}" for i in range(n)), kind)


def test_qkv_interleaves_query_groups_and_splits_them_over_tp():
    # 4 query heads, 2 kv groups, head_dim 1: q rows 0..3, k rows 10, 11, v rows 20, 21.
    # Megatron's fused layout per group g: [q heads of g; k_g; v_g] = [q0 q1 k0 v0 | q2 q3 k1 v1].
    q, k, v = torch.tensor([[0.0], [1], [2], [3]]), torch.tensor([[10.0], [11]]), torch.tensor([[20.0], [21]])
    d = _dims()
    rule = _rule("qkv", 3)
    assert rule.to_mcore([q, k, v], 0, 1, d).flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    # tp=2: group 0 on rank 0, group 1 on rank 1.
    assert rule.to_mcore([q, k, v], 0, 2, d).flatten().tolist() == [0, 1, 10, 20]
    assert rule.to_mcore([q, k, v], 1, 2, d).flatten().tolist() == [2, 3, 11, 21]
    shards = [rule.to_mcore([q, k, v], r, 2, d) for r in range(2)]
    back = rule.to_hf(shards, 0, 2, d)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v)))
    # One rank's shard alone is its heads of each projection (a generation shard at tp_gen = 2).
    assert [t.flatten().tolist() for t in rule.to_hf(shards[1:], 1, 2, d)] == [[2, 3], [11], [21]]


def test_qkv_bias_is_interleaved_like_the_weight():
    d = _dims()
    rule = _rule("qkv", 3)
    q, k, v = torch.arange(4.0), torch.tensor([10.0, 11]), torch.tensor([20.0, 21])
    assert rule.to_mcore([q, k, v], 1, 2, d).tolist() == [2, 3, 11, 21]


def test_glu_puts_each_ranks_gate_and_up_rows_together():
    gate, up = torch.arange(4.0)[:, None], 10 + torch.arange(4.0)[:, None]
    rule = _rule("glu", 2)
    d = _dims()
    assert rule.to_mcore([gate, up], 0, 2, d).flatten().tolist() == [0, 1, 10, 11]
    assert rule.to_mcore([gate, up], 1, 2, d).flatten().tolist() == [2, 3, 12, 13]
    # TP=1 is [gate; up] whole, which is not the concatenation of the TP=2 shards.
    assert rule.to_mcore([gate, up], 0, 1, d).flatten().tolist() == [0, 1, 2, 3, 10, 11, 12, 13]


def test_vocab_rows_are_padded_with_zeros_and_dropped_on_the_way_back():
    emb = torch.arange(10.0).reshape(5, 2)  # vocab 5, tp 2 -> padded to 6, 3 rows per rank
    rule, d = _rule("vocab", 1), _dims(vocab=5, tp=2)
    s0, s1 = (rule.to_mcore([emb], r, 2, d) for r in range(2))
    assert s0.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert s1.tolist() == [[6, 7], [8, 9], [0, 0]]
    assert torch.equal(rule.to_hf([s0, s1], 0, 2, d)[0], emb)


def test_row_parallel_splits_columns():
    w = torch.arange(8.0).reshape(2, 4)
    rule = _rule("row", 1)
    assert rule.to_mcore([w], 1, 2, _dims()).tolist() == [[2, 3], [6, 7]]


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["qkv", "glu", "vocab", "row", "replicate"]),
    tp=st.sampled_from([1, 2, 4]),
    kv=st.sampled_from([4, 8]),
    group=st.integers(1, 3),
    hd=st.integers(1, 3),
    vocab=st.integers(1, 40),
    hidden=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_every_kind_round_trips_exactly(kind, tp, kv, group, hd, vocab, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    d = Dims(kv * group, kv, hd, vocab, padded_vocab_size(vocab, tp))
    shapes = {
        "qkv": [(kv * group * hd, hidden), (kv * hd, hidden), (kv * hd, hidden)],
        "glu": [(4 * tp, hidden), (4 * tp, hidden)],
        "vocab": [(vocab, hidden)],
        "row": [(hidden, 4 * tp)],
        "replicate": [(hidden,)],
    }[kind]
    hf = [torch.randn(*s, generator=g) for s in shapes]
    rule = _rule(kind, len(hf))
    ranks = 1 if kind == "replicate" else tp
    shards = [rule.to_mcore(hf, r, tp, d) for r in range(ranks)]
    assert len({s.shape for s in shards}) == 1  # every rank holds the same shape
    back = rule.to_hf(shards, 0, tp, d)
    assert len(back) == len(hf) and all(torch.equal(a, b) for a, b in zip(back, hf))


def test_pipeline_split_interleaves_chunks_as_megatron_does():
    # megatron's docs: 16 layers, pp=4, vpp=2 -> GPU 0 holds layers [1, 2] and [9, 10] (1-based).
    split = PipelineSplit(16, 4, 2)
    assert [split.where(layer) for layer in (0, 1, 8, 9)] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert split.where(15) == (3, 1, 1)
    with pytest.raises(ValueError, match="does not split evenly over pp\\*vpp"):
        PipelineSplit(6, 4, 1)


def _cfg(model_type="llama", tie=False, **kw):
    base = dict(
        model_type=model_type,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=8,
        intermediate_size=16,
        vocab_size=11,
        rms_norm_eps=1e-6,
        max_position_embeddings=32,
        tie_word_embeddings=tie,
        hidden_act="silu",
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
    )
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_plan_lists_every_tensor_once_in_hf_order():
    placements = plan(_cfg(), PipelineSplit(2, 2, 1))
    names = [n for p in placements for n in p.hf_names]
    assert names[0] == "model.embed_tokens.weight" and names[-2:] == ["model.norm.weight", "lm_head.weight"]
    # embed + 2 layers x 9 (q k v o gate up down and the two norms) + final norm + lm_head
    assert len(names) == len(set(names)) == 1 + 2 * 9 + 2
    first, last = placements[0], placements[-1]
    assert (first.pp_rank, first.local_name) == (0, "embedding.word_embeddings.weight")
    assert (last.pp_rank, last.local_name) == (1, "output_layer.weight")
    layer1 = [p for p in placements if p.layer == 1]
    assert {p.pp_rank for p in layer1} == {1} and all(".layers.0." in p.local_name for p in layer1)


def test_plan_follows_the_architecture():
    qwen2 = {n for p in plan(_cfg("qwen2", tie=True), PipelineSplit(2, 1, 1)) for n in p.hf_names}
    assert "model.layers.0.self_attn.q_proj.bias" in qwen2 and "lm_head.weight" not in qwen2
    qwen3 = {n for p in plan(_cfg("qwen3", head_dim=3), PipelineSplit(2, 1, 1)) for n in p.hf_names}
    assert "model.layers.1.self_attn.k_norm.weight" in qwen3 and "model.layers.0.self_attn.q_proj.bias" not in qwen3
    # Tied embeddings over two stages: the last stage's output layer is loaded from the embedding, never exported.
    mirror = [p for p in plan(_cfg(tie=True), PipelineSplit(2, 2, 1)) if p.mirror]
    assert [(p.local_name, p.hf_names, p.pp_rank) for p in mirror] == [
        ("output_layer.weight", ("model.embed_tokens.weight",), 1)
    ]
    value = [n for p in plan(_cfg(), PipelineSplit(2, 1, 1), kind="value") for n in p.hf_names]
    assert value[-2:] == ["score.weight", "score.bias"] and "lm_head.weight" not in value
    te = {p.local_name for p in plan(_cfg(), PipelineSplit(2, 1, 1), te=True)}
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in te


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2'"),
        ({"mlp_bias": True}, "mlp_bias=true"),
        ({"attention_bias": True}, "attention_bias=true"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"num_local_experts": 8}, "mixture-of-experts"),
    ],
)
def test_unsupported_configs_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        check_supported(_cfg(**change))


def test_rope_settings():
    assert rope(_cfg()) == {"rotary_base": 10000, "rope_scaling": False}
    llama31 = {
        "rope_theta": 500000.0,
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert rope(_cfg(rope_parameters=llama31)) == {
        "rotary_base": 500000,
        "rope_scaling": True,
        "rope_scaling_factor": 8.0,
    }
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        rope(_cfg(rope_parameters={**llama31, "original_max_position_embeddings": 4096}))
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        rope(_cfg(rope_parameters={"rope_theta": 1.0, "rope_type": "yarn"}))


def test_vocab_is_padded_to_a_multiple_of_tp():
    assert gpt_model_kwargs(_cfg(vocab_size=83), tp=2)["vocab_size"] == 84
    assert padded_vocab_size(83, tp=4, divisible_by=8) == 96
