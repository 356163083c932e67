"""Shared-prefix packing (model.shared_prefix): the samples of a prompt computed as one sequence give the padded
batch's log-probs, entropy, values and training step; the packing itself against a hand-worked layout."""

from __future__ import annotations

import pytest
import torch

from tests.support.engines import P, R, gloo_world_one, grouped_batch, llama_dir  # noqa: F401
from verl.config.schema import OptimConfig
from verl.engine_protocol import EngineConfig
from verl.utils.shared_prefix import pack_shared_prefixes
from verl_fsdp.engine import FSDPEngine


def test_packing_layout_by_hand():
    """Two rows of prompt [7, 8] (one left-padded), responses [5, 6, eos] and [9]: one sequence
    [7, 8, 5, 6] (the last response token predicts nothing), each response seeing the prompt and itself."""
    ids = torch.tensor([[0, 7, 8, 5, 6, 2], [0, 7, 8, 9, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    pack = pack_shared_prefixes(ids, mask, pos, response_length=3)
    assert pack is not None
    assert pack.input_ids.tolist() == [[7, 8, 5, 6]]
    assert pack.position_ids.tolist() == [[0, 1, 2, 3]]
    # responses[0] = 5, 6, 2 are predicted from packed positions 1 (prompt end), 2 (5), 3 (6); responses[1] = 9 from 1.
    assert pack.cols.tolist() == [[1, 2, 3], [1, 0, 0]]
    assert pack.valid.tolist() == [[True, True, True], [True, False, False]]
    allowed = pack.allowed[0, 0].int().tolist()
    assert allowed == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    additive = pack.attention_mask("eager", torch.float32)  # eager attention adds the mask to its scores
    assert additive.dtype == torch.float32 and additive.device == pack.allowed.device
    assert torch.equal(additive == 0, pack.allowed) and additive.min() == torch.finfo(torch.float32).min


def test_distinct_prompts_share_packed_rows_without_padding():
    """Rows of different prompts are never visible to each other; short ones share a packed row no longer
    than a padded one. Row 0: prompt [3, 4], response [5, eos]; row 1: prompt [6, 10], response [7, 8, eos]."""
    ids = torch.tensor([[0, 0, 3, 4, 5, 2, 0], [0, 0, 6, 10, 7, 8, 2]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    pack = pack_shared_prefixes(ids, mask, pos, response_length=3)
    assert pack is not None
    # Longest first: row 1's [6, 10, 7, 8], then row 0's [3, 4, 5]: one packed row of 7 = P + R tokens.
    assert pack.input_ids.tolist() == [[6, 10, 7, 8, 3, 4, 5]]
    assert pack.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert pack.rows.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert pack.cols.tolist() == [[5, 6, 0], [1, 2, 3]]
    allowed = pack.allowed[0, 0].int()
    assert allowed[4:, :4].sum() == 0 and allowed[:4, 4:].sum() == 0  # the two rows never see each other
    assert allowed[4:, 4:].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_no_packing_when_it_would_not_pay():
    """Rows that share only a first token (as SFT rows share BOS) would put whole sequences into one long
    attention span: they stay padded."""
    long_rows = torch.randint(3, 40, (16, 64))
    long_rows[:, 0] = 1
    mask = torch.ones_like(long_rows)
    assert pack_shared_prefixes(long_rows, mask, mask.cumsum(-1) - 1, 63, attention_weight=1 / 192) is None


def _engines(path: str, **kw):
    # eps=1: Adam's first step ~ lr * g, so comparing weights compares gradients (see test_fsdp_engine).
    optim = OptimConfig(lr=1e-2, eps=1.0, weight_decay=0.0)
    padded = FSDPEngine(EngineConfig(model_path=path, optim=optim, total_steps=10, shared_prefix=False, **kw))
    shared = FSDPEngine(EngineConfig(model_path=path, optim=optim, total_steps=10, shared_prefix=True, **kw))
    return padded, shared


@pytest.mark.parametrize("fused, n", [(False, 4), (True, 4), (False, 1)])
def test_shared_prefix_matches_padded_rows(gloo_world_one, llama_dir, fused, n):  # noqa: F811
    """n=4: groups of a prompt; n=1: distinct prompts, only padding dropped and short rows packed together."""
    batch = grouped_batch(prompts=12 // n, n=n)
    valid = batch.batch["response_mask"].bool()
    pack = pack_shared_prefixes(batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["position_ids"], R)
    assert pack is not None and pack.tokens < batch.batch["input_ids"].numel() * (0.5 if n > 1 else 0.8)
    padded, shared = _engines(llama_dir, use_fused_kernels=fused)
    assert not padded.sharded  # world size 1, fp32: a plain module
    a = padded.infer(batch, micro_batch_size=12, temperature=0.8, entropy=True)
    b = shared.infer(batch, micro_batch_size=12, temperature=0.8, entropy=True)
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(b.batch[key][valid], a.batch[key][valid], rtol=0, atol=1e-5, msg=key)

    def loss(out, mb):
        m = mb.batch["response_mask"].to(out["log_probs"].dtype)
        value = -((out["log_probs"] * mb.batch["advantages"] + 0.1 * out["entropy"]) * m).sum() / m.sum()
        return value, {"loss": float(value.detach())}

    # micro-batches of 6 split the second prompt's group: packing works within each micro-batch.
    m_pad = padded.train_step(batch, loss, micro_batch_size=6, temperature=0.8, entropy=True)
    m_sh = shared.train_step(batch, loss, micro_batch_size=6, temperature=0.8, entropy=True)
    real = int(batch.batch["attention_mask"].sum())
    assert m_pad["micro_batches"] == m_sh["micro_batches"] == 2
    assert m_pad["padding_fraction"] == m_sh["padding_fraction"] == pytest.approx(1 - real / (12 * (P + R)))
    assert m_pad["computed_tokens_ratio"] == 1.0 and m_sh["computed_tokens_ratio"] < (0.5 if n > 1 else 0.8)
    assert m_sh["loss"] == pytest.approx(m_pad["loss"], rel=1e-5)
    assert m_sh["grad_norm"] == pytest.approx(m_pad["grad_norm"], rel=1e-5)
    for (name, x), (_, y) in zip(padded.weights(), shared.weights()):
        torch.testing.assert_close(y, x, rtol=0, atol=1e-6, msg=name)


def test_shared_prefix_values_match_padded_rows(gloo_world_one, llama_dir):  # noqa: F811
    batch = grouped_batch(seed=1)
    valid = batch.batch["response_mask"].bool()
    outs = []
    for shared in (False, True):
        torch.manual_seed(0)
        engine = FSDPEngine(EngineConfig(model_path=llama_dir, kind="value", shared_prefix=shared))
        outs.append(engine.infer(batch, micro_batch_size=12).batch["values"])
    torch.testing.assert_close(outs[1][valid], outs[0][valid], rtol=0, atol=1e-5)


def test_token_budget_micro_batches_take_the_whole_batchs_step(gloo_world_one, llama_dir):  # noqa: F811
    """actor.ppo_max_tokens_per_device: micro-batches cut by tokens (here ~3 rows each, of unequal token counts)
    take the step of one forward over the batch, with token-mean weights."""
    from verl.config.schema import ActorConfig
    from verl.workers.losses import actor_loss_fn

    batch = grouped_batch(prompts=6, n=2, seed=4)
    loss = actor_loss_fn(ActorConfig(ppo_mini_batch_size=1, loss_agg_mode="token-mean"))
    whole, budget = _engines(llama_dir)
    m1 = whole.train_step(batch, loss, micro_batch_size=12)
    m2 = budget.train_step(batch, loss, micro_batch_size=1, max_tokens=P + R + 8)
    assert m1["pg_loss"] == pytest.approx(m2["pg_loss"], rel=1e-5, abs=1e-7)
    for (name, x), (_, y) in zip(whole.weights(), budget.weights()):
        torch.testing.assert_close(y, x, rtol=0, atol=1e-6, msg=name)
    lp = budget.infer(batch, micro_batch_size=1, max_tokens=P + R).batch["log_probs"]
    assert lp.shape == (12, R)
