"""`verl validate`'s memory section: each role's state per rank (the FSDP one worked out here by hand from the
model's parameters: fp32 weights, fp32 gradients and AdamW's two fp32 moments plus a 4-byte step per tensor), the
phase table, and the refusal of a peak over the device's memory."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from tests.support.run_configs import RECIPES
from verl.cli import main
from verl.memory_model import size_text


def _tiny_llama(path) -> LlamaForCausalLM:
    """A 2-layer GQA Llama saved at `path` (untied)."""
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        )
    )
    model.save_pretrained(path)
    return model


def test_validate_prints_the_actor_and_reference_state_per_rank(tmp_path, capsys):
    model = _tiny_llama(tmp_path / "model")
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
    _tiny_llama(path)
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


def test_the_phase_table_sums_what_each_phase_keeps_and_honours_offload(tmp_path, capsys):
    """The hybrid pool's phases: generation with the hf rollout (the actor's weights and a KV cache beside the
    actor's state), the reference's pass, the update with activations and logits; offloading the actor's
    optimizer takes it out of every phase but the update."""
    from tests.support.fixtures import make_plan
    from tests.support.run_configs import tiny_config
    from verl.memory_plan import estimate

    _tiny_llama(tmp_path / "model")
    common = (
        f"model.path={tmp_path / 'model'}",
        "actor.use_kl_loss=true",
        "placement.pools=[{name: hybrid, roles: [actor, rollout, ref]}]",
    )
    tables = {}
    for offload in (False, True):
        cfg = tiny_config("grpo_tiny", str(tmp_path / "out"), *common, f"actor.optimizer_offload={offload}")
        plan, problems = make_plan(cfg)
        assert plan is not None, problems
        table, notes = estimate(cfg, plan)
        assert not notes
        tables[offload] = {p.name: p for p in table}
    kept = tables[False]
    assert list(kept) == ["generate", "actor log-probs", "ref log-probs", "actor update"], list(kept)
    update = kept["actor update"].parts
    assert update["actor activations"] > 0 and update["actor logits"] > 0 and update["actor gradients"] > 0
    assert kept["generate"].parts["rollout KV cache"] > 0 and "actor activations" not in kept["generate"].parts
    away = tables[True]
    assert away["generate"].parts["actor optimizer"] == 0 < kept["generate"].parts["actor optimizer"]
    assert away["actor update"].parts["actor optimizer"] == kept["actor update"].parts["actor optimizer"]


def test_validate_refuses_a_peak_over_the_device_memory_naming_phase_rank_and_key(tmp_path, capsys):
    _tiny_llama(tmp_path / "model")
    code = main(
        [
            "validate",
            str(RECIPES / "grpo_tiny.yaml"),
            f"model.path={tmp_path / 'model'}",
            "placement.device_memory_gb=0.0001",
        ]
    )
    captured = capsys.readouterr()
    assert code == 2
    assert "| actor update |" in captured.out and "peak: " in captured.out
    error = next(line for line in captured.err.splitlines() if line.startswith("error: placement.device_memory_gb"))
    assert " needs ~" in error and "on rank 0 (pool 'hybrid'), more than the 104.9 KiB of a device" in error
