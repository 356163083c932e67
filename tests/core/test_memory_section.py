"""`verl validate` prints each FSDP role's state per rank (verl.memory_model), worked out here by hand from the
model's parameters: fp32 weights, fp32 gradients and AdamW's two fp32 moments plus a 4-byte step per tensor."""

from __future__ import annotations

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
