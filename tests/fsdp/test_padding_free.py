"""The padding-free layout (verl.utils.padding_free), what the FSDP engine packs into when the attention takes no
4D mask (flash-attention): every row's real tokens in one stream, position ids restarting at each row. On CPU the
Hugging Face model reads the same boundaries from the position ids through SDPA (a block-diagonal causal mask),
which checks the layout and the engine's use of it; the flash-attention run itself is in tests/gpu."""

from __future__ import annotations

import pytest
import torch

from tests.support.engines import P, R, gloo_world_one, grouped_batch, llama_dir  # noqa: F401
from verl.config.schema import OptimConfig
from verl.engine_protocol import EngineConfig
from verl.utils.padding_free import padding_free


def test_layout_by_hand():
    """Rows [pad, 7, 8 | 5, 6, eos] and [pad, 7, 8 | 9, pad, pad]: one stream [7, 8, 5, 6, 2, 7, 8, 9] at positions
    0..4, 0..2; response tokens are predicted from the stream index of the token before each."""
    ids = torch.tensor([[0, 7, 8, 5, 6, 2], [0, 7, 8, 9, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    pack = padding_free(ids, mask, pos, response_length=3)
    assert pack.input_ids.tolist() == [[7, 8, 5, 6, 2, 7, 8, 9]]
    assert pack.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert pack.cols.tolist() == [[1, 2, 3], [6, 0, 0]] and pack.rows.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert pack.valid.tolist() == [[True, True, True], [True, False, False]]
    assert pack.attention_mask("sdpa", torch.float32) is None  # the model finds the rows from the positions
    assert pack.tokens == 8  # of 12 padded


def test_transformers_reads_the_rows_from_the_positions(llama_dir):  # noqa: F811
    """A Hugging Face Llama (SDPA) on the stream, no mask: each response token's log-prob is its padded row's."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    batch = grouped_batch(prompts=3, n=4).batch
    valid = batch["response_mask"].bool()
    pack = padding_free(batch["input_ids"], batch["attention_mask"], batch["position_ids"], R)
    with torch.no_grad():
        rows = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
        padded = model(**rows, use_cache=False).logits[:, P - 1 : -1]
        # (no cache: with one, transformers does not look for packed rows in the position ids)
        flat = pack.gather(model(input_ids=pack.input_ids, position_ids=pack.position_ids, use_cache=False).logits)
    lp = lambda logits: torch.log_softmax(logits, -1).gather(-1, batch["responses"][..., None])[..., 0]  # noqa: E731
    torch.testing.assert_close(lp(flat)[valid], lp(padded)[valid], rtol=0, atol=1e-5)


def test_the_engine_packs_padding_free_where_the_attention_takes_no_mask(
    gloo_world_one,  # noqa: F811
    llama_dir,  # noqa: F811
    monkeypatch,
):
    """With SDPA treated as mask-less, the FSDP engine runs the padding-free stream: the padded rows' log-probs
    (1e-5), one step's weights (1e-6, Adam eps=1: weights compare gradients) and fewer tokens computed."""
    import verl_fsdp.engine as fsdp_engine

    optim = OptimConfig(lr=1e-2, eps=1.0, weight_decay=0.0)
    padded = fsdp_engine.FSDPEngine(
        EngineConfig(model_path=llama_dir, optim=optim, total_steps=10, shared_prefix=False)
    )
    monkeypatch.setattr(fsdp_engine, "MASKABLE_ATTENTION", ())
    stream = fsdp_engine.FSDPEngine(EngineConfig(model_path=llama_dir, optim=optim, total_steps=10))
    batch = grouped_batch(prompts=3, n=4)
    valid = batch.batch["response_mask"].bool()
    a = padded.infer(batch, micro_batch_size=12, entropy=True).batch
    b = stream.infer(batch, micro_batch_size=12, entropy=True).batch
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(b[key][valid], a[key][valid], rtol=0, atol=1e-5, msg=key)

    def loss(out, mb):
        m = mb.batch["response_mask"].to(out["log_probs"].dtype)
        value = -(out["log_probs"] * mb.batch["advantages"] * m).sum() / m.sum()
        return value, {"loss": float(value.detach())}

    loss.weight_by = "tokens"
    m_pad = padded.train_step(batch, loss, micro_batch_size=6)
    m_str = stream.train_step(batch, loss, micro_batch_size=6)
    real = int(batch.batch["attention_mask"].sum())
    assert m_str["computed_tokens_ratio"] == pytest.approx(real / (12 * (P + R)))  # the real tokens, no more
    assert m_str["tokens_per_micro_batch"] == real / 2 and m_str["micro_batches"] == 2
    assert m_str["loss"] == pytest.approx(m_pad["loss"], rel=1e-5)
    for (name, x), (_, y) in zip(padded.weights(), stream.weights()):
        torch.testing.assert_close(y, x, rtol=0, atol=1e-6, msg=name)
