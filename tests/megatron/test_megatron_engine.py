"""MegatronEngine in one process (world of one, gloo), what only megatron has: packing, context/sequence
parallel splits, the fresh value head, activation recompute, the VPP micro-batch split. The train engine contract
(outputs against HF, training, skip policy, LR schedule, checkpoints, export) is in tests/engines/."""

from __future__ import annotations

import dataclasses
import os
import types

import pytest
import torch
import torch.distributed as dist

from tests.support.engines import free_port, grouped_batch, make_llama_dir, random_batch
from verl.config.schema import OptimConfig
from verl.engine_protocol import EngineConfig
from verl_megatron.context_parallel import chunk_positions, local_index
from verl_megatron.parallel import sequence_parallel
from verl_megatron.sequences import pack

LAYOUT = types.SimpleNamespace(tp=1, pp=1, vpp=None, cp=1, ep=1, dp=None)


@pytest.fixture(scope="module")
def world_one():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    from verl_megatron.parallel import destroy_model_parallel

    destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return make_llama_dir(str(tmp_path_factory.mktemp("llama")))


def _engine(path: str, *, optim: bool = True, kind: str = "causal_lm", eps: float = 1e-8, **kw):
    from verl_megatron.engine import MegatronEngine

    opt = OptimConfig(lr=1e-2, weight_decay=0.0, eps=eps) if optim else None
    return MegatronEngine(EngineConfig(model_path=path, kind=kind, optim=opt, total_steps=10, parallel=LAYOUT, **kw))


def _nll(out, mb):
    loss = -(out["log_probs"] * mb.batch["response_mask"]).sum() / mb.batch["response_mask"].sum()
    return loss, {"nll": float(loss)}


def test_pack_rotates_rows_so_real_tokens_start_at_zero():
    # Row 0: two padding tokens, prompt [5, 6], response [7, 8]; row 1: no padding.
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 7, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    p = pack(ids, mask, ids[:, 4:])
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 0, 0], [1, 2, 3, 4, 7, 9]]
    # responses[:, t] sits at 4 + t; predicted one position earlier, shifted left by the padding (2 and 0).
    assert p.predict_index.tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="padding between real tokens"):
        pack(ids, torch.tensor([[1, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]), ids[:, 4:])
    # Sequence/context parallelism pad the length to a multiple: after every real token, positions unchanged.
    padded = pack(ids, mask, ids[:, 4:], multiple=4)
    assert padded.input_ids.tolist() == [[5, 6, 7, 8, 0, 0, 0, 0], [1, 2, 3, 4, 7, 9, 0, 0]]
    assert padded.position_ids[0].tolist() == list(range(8)) and torch.equal(padded.predict_index, p.predict_index)


def test_context_parallel_split_is_megatrons_load_balanced_one():
    # 16 positions in 2*cp = 8 chunks of 2: rank r holds chunks r and 7 - r.
    assert chunk_positions(16, 4, 0).tolist() == [0, 1, 14, 15]
    assert chunk_positions(16, 4, 3).tolist() == [6, 7, 8, 9]
    every = torch.cat([chunk_positions(16, 4, r) for r in range(4)])
    assert sorted(every.tolist()) == list(range(16))
    # Where a rank finds a global position in its part, or -1 where another rank holds it.
    assert local_index(torch.tensor([[0, 6, 15]]), 16, 4, 0).tolist() == [[0, -1, 3]]
    assert local_index(torch.tensor([[0, 6, 15]]), 16, 4, 3).tolist() == [[-1, 0, -1]]
    with pytest.raises(ValueError, match="not a multiple of 2\\*cp = 8"):
        chunk_positions(12, 4, 0)


def test_sequence_parallel_defaults_on_with_tensor_parallelism():
    settings = types.SimpleNamespace
    assert sequence_parallel(settings(sequence_parallel=None), tp=2) is True
    assert sequence_parallel(settings(sequence_parallel=None), tp=1) is False
    assert sequence_parallel(settings(sequence_parallel=False), tp=4) is False
    with pytest.raises(ValueError, match="sequence_parallel=true .* needs tp > 1"):
        sequence_parallel(settings(sequence_parallel=True), tp=1)


def test_value_head_starts_fresh_and_its_checkpoint_round_trips(world_one, llama, tmp_path):
    """A critic's value head is not in the HF folder: it starts fresh and is saved and restored with the chunks.
    (Values against the exported HF token classifier: the train engine contract, tests/engines/.)"""
    critic = _engine(llama, kind="value")
    assert critic.fresh == ["score.weight", "score.bias"]
    batch = random_batch(3, 6, 4, left_pad=2)

    def value_loss(out, mb):
        loss = ((out["values"] - 1.0) ** 2).mean()
        return loss, {"vf_loss": float(loss)}

    critic.train_step(batch, value_loss, micro_batch_size=2)
    critic.save_checkpoint(str(tmp_path / "critic-ckpt"))
    trained = {k: v.clone() for k, v in critic.weights()}
    assert trained.keys() >= {"score.weight", "score.bias"}
    critic.train_step(batch, value_loss, micro_batch_size=2)
    critic.load_checkpoint(str(tmp_path / "critic-ckpt"))
    assert all(torch.equal(v, trained[k]) for k, v in critic.weights())


def test_bad_layouts_and_micro_batch_sizes_are_refused_by_name(world_one, llama):
    from transformers import AutoConfig

    from verl_megatron.model import transformer_config
    from verl_megatron.parallel import Layout

    ep2 = Layout(tp=1, pp=1, vpp=None, cp=1, ep=2, dp=2, tp_rank=0, pp_rank=0, cp_rank=0, dp_rank=0)
    with pytest.raises(ValueError, match="parallel.ep=2: .* this llama model has none"):
        transformer_config(AutoConfig.from_pretrained(llama), ep2, dtype=torch.float32, device="cpu")
    engine = _engine(llama, optim=False)
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
        engine.infer(random_batch(2, 4, 2), micro_batch_size=0)


def test_activation_recompute_gives_the_same_step(world_one, llama):
    """model.gradient_checkpointing maps to megatron's full-layer recompute: same loss and weights, bit for bit."""
    batch = random_batch(4, 6, 5, left_pad=2)
    results = []
    for recompute in (False, True):
        engine = _engine(llama, gradient_checkpointing=recompute)
        assert engine.config.recompute_granularity == ("full" if recompute else None)
        metrics = engine.train_step(batch, _nll, micro_batch_size=2)
        results.append((metrics, {k: v.clone() for k, v in engine.weights()}))
    (m1, w1), (m2, w2) = results
    assert m1 == m2
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_vpp_micro_batches_come_in_multiples_of_pp(world_one, llama):
    engine = _engine(llama, optim=False)
    engine.layout = dataclasses.replace(engine.layout, pp=2, vpp=2)  # only the split is asked of it here
    assert [len(m) for m in engine._micro_batches(random_batch(5, 4, 2), 2)] == [2, 1, 1, 1]  # 3 -> 4 pieces
    assert [len(m) for m in engine._micro_batches(random_batch(4, 4, 2), 1)] == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="multiple of pp=2"):
        engine._micro_batches(random_batch(1, 4, 2), 1)


def test_packed_rows_give_the_padded_rows_outputs_and_step(world_one, llama):
    """model.shared_prefix on megatron: each prompt once, its samples after it, the pack's mask as the attention
    mask. Log-probs, entropy and values within 1e-5 of the padded rows', one step's weights within 1e-6."""
    batch = grouped_batch(prompts=3, n=4)
    mask = batch.batch["response_mask"].bool()
    runs = {}
    for packed in (False, True):
        engine = _engine(llama, shared_prefix=packed, eps=1.0)  # Adam's first step ~ lr * g: weights compare grads
        out = engine.infer(batch, micro_batch_size=6, entropy=True).batch
        metrics = engine.train_step(batch, _nll, micro_batch_size=6)
        critic = _engine(llama, kind="value", optim=False, shared_prefix=packed)
        values = critic.infer(batch, micro_batch_size=6).batch["values"]
        runs[packed] = (out, metrics, {k: v.clone() for k, v in engine.weights()}, values)
    (out0, m0, w0, v0), (out1, m1, w1, v1) = runs[False], runs[True]
    for key in ("log_probs", "entropy"):
        assert torch.allclose(out1[key][mask], out0[key][mask], atol=1e-5), key
        assert torch.all(out1[key][~mask] == 0)  # packed rows hold nothing past a response
    assert torch.allclose(v1[mask], v0[mask], atol=1e-5)
    assert m0["computed_tokens_ratio"] == 1.0 and m1["computed_tokens_ratio"] < 0.8
    assert abs(m1["nll"] - m0["nll"]) < 1e-5
    assert max((w1[k] - w0[k]).abs().max().item() for k in w0) < 1e-6


def test_thd_rows_give_the_padded_rows_outputs_and_step(world_one, llama):
    """The packed THD layout TransformerEngine's attention takes on GPU (every row's real tokens in one stream, the
    rows' boundaries as cu_seqlens, RoPE restarting per sequence in megatron's own THD path), run here by
    megatron's local attention with a block-diagonal mask: log-probs, entropy and values within 1e-5 of the padded
    rows', one step's weights within 1e-6, only real tokens computed."""
    from verl_megatron.sequences import thd_rows

    batch = grouped_batch(prompts=3, n=4)
    mask = batch.batch["response_mask"].bool()
    b = batch.batch
    rows = thd_rows(b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"], multiple=4)
    real = int(b["attention_mask"].sum())
    assert rows.input_ids.shape == (1, -(-real // 4) * 4)  # rounded up by a padding sequence of its own
    assert rows.cu_seqlens.tolist()[-1] == rows.input_ids.shape[1] and rows.cu_seqlens.tolist()[-2] in (real,)
    runs = {}
    for thd in (False, True):
        engine = _engine(llama, shared_prefix=thd, eps=1.0)
        critic = _engine(llama, kind="value", optim=False, shared_prefix=thd)
        engine.thd = critic.thd = thd  # (chosen with TransformerEngine; forced here)
        out = engine.infer(batch, micro_batch_size=6, entropy=True).batch
        metrics = engine.train_step(batch, _nll, micro_batch_size=6)
        values = critic.infer(batch, micro_batch_size=6).batch["values"]
        runs[thd] = (out, metrics, {k: v.clone() for k, v in engine.weights()}, values)
    (out0, m0, w0, v0), (out1, m1, w1, v1) = runs[False], runs[True]
    for key in ("log_probs", "entropy"):
        assert torch.allclose(out1[key][mask], out0[key][mask], atol=1e-5), key
        assert torch.all(out1[key][~mask] == 0)
    assert torch.allclose(v1[mask], v0[mask], atol=1e-5)
    assert m1["computed_tokens_ratio"] == pytest.approx(real / b["input_ids"].numel())
    assert abs(m1["nll"] - m0["nll"]) < 1e-5
    assert max((w1[k] - w0[k]).abs().max().item() for k in w0) < 1e-6
