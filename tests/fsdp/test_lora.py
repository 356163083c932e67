"""LoRA on the FSDP engine (actor.lora): only adapters train, the adapters-off model is the base exactly (the
reference policy), merged weights and exported folders reproduce the trained policy, and resume is exact."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from tests.support.engines import gloo_world_one, llama_dir, policy_batch, random_batch  # noqa: F401
from verl.config.schema import LoraConfig, OptimConfig
from verl.engine_protocol import EngineConfig
from verl.engine_skeleton import meta_file
from verl_fsdp import backends, export  # noqa: F401  (what `verl export` discovers and runs)
from verl_fsdp.engine import LORA_ADAPTER_DIR, FSDPEngine

P, R, VOCAB = 5, 4, 40
LORA = LoraConfig(rank=4, alpha=8.0)


def _engine(path: str, lora: LoraConfig | None = LORA, **kw) -> FSDPEngine:
    optim = OptimConfig(lr=5e-2, weight_decay=0.0)
    return FSDPEngine(EngineConfig(model_path=path, optim=optim, total_steps=10, lora=lora, **kw))


def _nll(out, mb):
    loss = -out["log_probs"].mean()
    return loss, {"loss": float(loss.detach())}


def _log_probs(engine: FSDPEngine, batch) -> torch.Tensor:
    return engine.infer(batch, micro_batch_size=8).batch["log_probs"]


def _hf_log_probs(model: torch.nn.Module, batch) -> torch.Tensor:
    """Log-probs of the responses under a plain Hugging Face (or peft) model."""
    b = batch.batch
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits[:, P - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def test_the_optimizer_holds_only_adapters(gloo_world_one, llama_dir):  # noqa: F811
    engine = _engine(llama_dir)
    in_optimizer = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    names = {n for n, p in engine.model.named_parameters() if id(p) in in_optimizer}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    # every linear layer of both decoder layers has A and B: 7 linears x 2 layers x 2
    assert len(names) == 28
    frozen = [n for n, p in engine.model.named_parameters() if not p.requires_grad]
    assert any("embed_tokens" in n for n in frozen) and any("lm_head" in n for n in frozen)


def test_adapters_off_is_the_base_model_after_training(gloo_world_one, llama_dir):  # noqa: F811
    """The reference of a LoRA run is the actor with its adapters off: the base model's log-probs, bit for bit,
    after the adapters have moved."""
    batch = random_batch(6, P, R, seed=2, left_pad=2)
    base = FSDPEngine(EngineConfig(model_path=llama_dir))
    lora = _engine(llama_dir)
    before = _log_probs(lora, batch)
    torch.testing.assert_close(before, _log_probs(base, batch), rtol=0, atol=1e-6)  # B starts at zero
    for _ in range(2):
        lora.train_step(batch, _nll, micro_batch_size=3)
    after = _log_probs(lora, batch)
    assert (after - before).abs().max() > 1e-3  # the adapters changed the policy
    with lora.adapters_off():
        reference = _log_probs(lora, batch)
    torch.testing.assert_close(reference, _log_probs(base, batch), rtol=0, atol=1e-6)
    torch.testing.assert_close(_log_probs(lora, batch), after, rtol=0, atol=0)  # adapters on again


def test_merged_weights_and_exports_reproduce_the_policy(gloo_world_one, llama_dir, tmp_path):  # noqa: F811
    """weights() (what a rollout with its own copy loads) and both export folders give the trained policy."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    batch = random_batch(6, P, R, seed=3)
    engine = _engine(llama_dir)
    for _ in range(2):
        engine.train_step(batch, _nll, micro_batch_size=6)
    policy = _log_probs(engine, batch)

    merged = dict(engine.weights())
    plain = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32, attn_implementation="sdpa")
    assert set(merged) == {n for n, _ in plain.named_parameters()}  # the base model's own names
    plain.load_state_dict(merged)
    torch.testing.assert_close(_hf_log_probs(plain.eval(), batch), policy, rtol=1e-5, atol=1e-5)

    out = str(tmp_path / "hf")
    engine.export_hf(out)
    assert not os.path.exists(os.path.join(out, "adapter_config.json"))  # the merged folder loads as a plain model
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    torch.testing.assert_close(_hf_log_probs(exported, batch), policy, rtol=1e-5, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, os.path.join(out, LORA_ADAPTER_DIR)).eval()
    torch.testing.assert_close(_hf_log_probs(adapted, batch), policy, rtol=1e-5, atol=1e-5)


def test_resume_is_exact_from_an_adapter_only_checkpoint(gloo_world_one, llama_dir, tmp_path):  # noqa: F811
    import torch.distributed.checkpoint as dcp

    batch = policy_batch(6, P, R, VOCAB, old_log_prob=-3.0)
    first = _engine(llama_dir)
    first.train_step(batch, _nll, micro_batch_size=3)
    path = str(tmp_path / "ckpt")
    first.save_checkpoint(path)
    first.train_step(batch, _nll, micro_batch_size=3)

    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)  # no frozen base weights in the checkpoint

    resumed = _engine(llama_dir)
    resumed.load_checkpoint(path)
    resumed.train_step(batch, _nll, micro_batch_size=3)
    for (name, x), (_, y) in zip(first.weights(), resumed.weights()):
        torch.testing.assert_close(y, x, rtol=0, atol=0, msg=name)


def test_a_lora_critic_trains_its_value_head_in_full(gloo_world_one, llama_dir):  # noqa: F811
    engine = _engine(llama_dir, kind="value")
    trainable = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    heads = {n for n in trainable if ".lora_" not in n}
    assert heads and all("score" in n for n in heads)
    batch = random_batch(4, P, R, seed=5)
    before = engine.infer(batch, micro_batch_size=4).batch["values"]

    def loss(out, mb):
        value = ((out["values"] - 1.0) ** 2).mean()
        return value, {"loss": float(value.detach())}

    engine.train_step(batch, loss, micro_batch_size=4)
    after = engine.infer(batch, micro_batch_size=4).batch["values"]
    assert (after - before).abs().max() > 1e-3
    names = {n for n, _ in engine.weights()}
    assert "score.weight" in names and not any("lora_" in n or "modules_to_save" in n for n in names)


def test_verl_export_writes_merged_and_adapter_folders(gloo_world_one, llama_dir, tmp_path):  # noqa: F811
    """`verl export` of an adapter-only checkpoint: the merged folder loads in plain transformers and the peft folder
    on the base model, and both give the trained policy's log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from verl.cli import main

    batch = random_batch(6, P, R, seed=4)
    engine = _engine(llama_dir)
    for _ in range(2):
        engine.train_step(batch, _nll, micro_batch_size=6)
    policy = _log_probs(engine, batch)
    engine.save_checkpoint(str(tmp_path / "ckpt"))

    out = str(tmp_path / "hf")
    assert main(["export", str(tmp_path / "ckpt"), out]) == 0  # the backend is read from the checkpoint
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    torch.testing.assert_close(_hf_log_probs(merged, batch), policy, rtol=1e-5, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, os.path.join(out, LORA_ADAPTER_DIR)).eval()
    torch.testing.assert_close(_hf_log_probs(adapted, batch), policy, rtol=1e-5, atol=1e-5)


def test_verl_export_of_a_full_checkpoint_and_a_missing_base(gloo_world_one, llama_dir, tmp_path, capsys):  # noqa: F811
    from safetensors.torch import load_file

    from verl.cli import main

    engine = _engine(llama_dir, lora=None)
    engine.train_step(random_batch(6, P, R, seed=5), _nll, micro_batch_size=6)
    trained = {k: v.clone() for k, v in engine.weights()}
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 0
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert exported.keys() == trained.keys()
    for key in trained:
        assert torch.equal(exported[key], trained[key]), key

    moved = str(tmp_path / "nowhere")
    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "hf2"), "--model", moved]) == 2
    assert f"--model {moved} holds no config.json" in capsys.readouterr().err
    meta_path = Path(meta_file(str(tmp_path / "ckpt"), "fsdp"))
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "model_path": moved}))
    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "hf2")]) == 2
    err = capsys.readouterr().err
    assert f"{moved} (the model named in {meta_path}) holds no config.json" in err and "--model" in err
    assert not os.path.exists(tmp_path / "hf2")
