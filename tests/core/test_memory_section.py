"""`verl validate` prints each FSDP role's state per rank (verl.memory_model), worked out here by hand from the
model's parameters: fp32 weights, fp32 gradients and AdamW's two fp32 moments plus a 4-byte step per tensor."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from tests.support.run_configs import RECIPES
from verl.cli import main
from verl.memory_model import size_text


def test_validate_prints_the_actor_and_reference_state_per_rank(tmp_path, capsys):
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(tmp_path / "model")
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    overrides = [
        f"model.path={tmp_path / 'model'}",
        "actor.use_kl_loss=true",  # (a reference: parameters only)
        "placement.pools=[{name: hybrid, roles: [actor, rollout, ref]}]",
    ]
    code = main(["validate", str(RECIPES / "grpo_tiny.yaml"), *overrides])
    out = capsys.readouterr().out
    section = out[out.index("# memory") :]
    state = 4 * numel + 4 * numel + (2 * 4 * numel + 4 * len(params))
    assert f"parameters {size_text(4 * numel)}, gradients {size_text(4 * numel)}" in section
    assert f"optimizer {size_text(8 * numel + 4 * len(params))}" in section
    assert f"{size_text(state)} in all" in section
    ref = next(line for line in section.splitlines() if line.startswith("ref"))
    assert f"parameters {size_text(4 * numel)} (no gradients or optimizer" in ref
    assert code == 0, out


def test_validate_prints_each_pipeline_stage_of_a_megatron_actor(tmp_path, capsys):
    """Megatron: the largest rank of each stage, as verl_megatron.memory_model lays out DDP's buffers and the
    distributed optimizer's slices (tested against the engine's tensors in tests/megatron)."""
    pytest.importorskip("megatron.core", reason="verl-megatron's memory model builds megatron-core's model")
    import torch
    from transformers import AutoConfig

    from verl_megatron.memory_model import state_bytes

    path = tmp_path / "model"
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).save_pretrained(path)
    overrides = [f"model.path={path}", "actor.backend=megatron", "actor.parallel.pp=2", "placement.devices_per_node=2"]
    code = main(["validate", str(RECIPES / "grpo_tiny.yaml"), *overrides])
    out = capsys.readouterr().out
    section = out[out.index("# memory") :]
    stages = state_bytes(AutoConfig.from_pretrained(path), {"pp": 2, "dp": 1}, dtype=torch.float32)
    for i, stage in enumerate(stages):
        line = next(x for x in section.splitlines() if x.startswith("actor") and f"stage {i}" in x)
        assert f"parameters {size_text(stage.params)}, gradients {size_text(stage.grads)}" in line, line
        assert f"optimizer {size_text(stage.optimizer)}" in line
    assert code == 0, out
