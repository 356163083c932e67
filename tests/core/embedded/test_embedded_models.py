"""Embedded models: built once into the cache, loadable with Auto classes, deterministic, clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from verl.embedded import models
from verl.embedded.cache import cache_root, cached_dir
from verl.embedded.models import (
    EmbeddedModelSpec,
    build_embedded_model,
    materialize_embedded_model,
    num_parameters,
    parse_embedded,
    resolve_model_path,
)

# tiny-llama, worked out by hand (V = 83 tokens, d = 128, 4 layers, 4 query heads and 2 kv heads of 32):
#   embeddings 83*128 = 10624, lm_head (untied) 10624
#   per layer: q 128*128 + k 128*64 + v 128*64 + o 128*128 = 49152; mlp 3*128*384 = 147456; 2 norms 256
#              = 196864; 4 layers = 787456
#   final norm 128                                   total 10624*2 + 787456 + 128 = 808832
TINY_LLAMA_PARAMETERS = 808832


def test_folder_contents(tiny_model_dir, embedded_cache):
    folder = Path(tiny_model_dir)
    assert folder.parent == cache_root(embedded_cache)
    assert folder.name.startswith("tiny-llama-")
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (
        config["vocab_size"],
        config["bos_token_id"],
        config["eos_token_id"],
        config["pad_token_id"],
    ) == (83, 1, 2, 0)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 0)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_second_call_reuses_the_folder(tiny_model_dir, embedded_cache):
    before = {p.name: p.stat().st_mtime_ns for p in Path(tiny_model_dir).iterdir()}
    again = materialize_embedded_model("embedded:tiny-llama", embedded_cache)
    assert again == tiny_model_dir
    assert {p.name: p.stat().st_mtime_ns for p in Path(again).iterdir()} == before


def test_loads_and_generates(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model.dtype == torch.float32
    assert num_parameters(model) == TINY_LLAMA_PARAMETERS
    assert 0.5e6 <= num_parameters(model) <= 3e6
    batch = tokenizer(["1+1=", "12+7="], padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert out.shape == (2, 5 + 4)
    assert torch.equal(out[:, :5], batch["input_ids"])


def test_saved_weights_are_the_seeded_build(tiny_model_dir):
    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    built, _ = build_embedded_model("tiny-llama")
    assert loaded.keys() == built.state_dict().keys()
    for name, tensor in built.state_dict().items():
        assert torch.equal(tensor, loaded[name]), name


def test_build_leaves_the_callers_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_embedded_model("tiny-llama")
    assert torch.equal(torch.rand(3), expected)


def test_names():
    assert parse_embedded("embedded:tiny-llama") == "tiny-llama"
    assert parse_embedded("tiny-llama") == "tiny-llama"
    with pytest.raises(ValueError, match=r"unknown embedded model 'embedded:gpt5'.*embedded:tiny-llama"):
        parse_embedded("embedded:gpt5")
    assert resolve_model_path("/models/my-llama") == "/models/my-llama"


def test_default_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VERL_CACHE", str(tmp_path / "env-cache"))
    assert cache_root() == tmp_path / "env-cache" / "embedded"
    monkeypatch.delenv("VERL_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "verl" / "embedded"


def test_changed_settings_build_a_new_entry(monkeypatch, embedded_cache, tiny_model_dir):
    spec = models.EMBEDDED_MODELS["tiny-llama"]
    smaller = EmbeddedModelSpec(spec.model_type, {**spec.settings, "num_hidden_layers": 1}, spec.seed)
    monkeypatch.setitem(models.EMBEDDED_MODELS, "tiny-llama", smaller)
    folder = materialize_embedded_model("tiny-llama", embedded_cache)
    assert folder != tiny_model_dir
    assert json.loads((Path(folder) / "config.json").read_text())["num_hidden_layers"] == 1
    monkeypatch.undo()
    assert materialize_embedded_model("tiny-llama", embedded_cache) == tiny_model_dir


def test_failed_build_leaves_nothing(tmp_path):
    def write(folder: Path) -> None:
        (folder / "half-written").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        cached_dir(tmp_path / "entry", write)
    assert os.listdir(tmp_path) == []


def test_concurrent_builder_wins_the_rename(tmp_path):
    final = tmp_path / "entry"

    def write(folder: Path) -> None:
        (folder / "mine").write_text("late")
        final.mkdir()  # another process renamed its complete copy into place meanwhile
        (final / "theirs").write_text("first")

    assert cached_dir(final, write) == final
    assert os.listdir(final) == ["theirs"]
    assert os.listdir(tmp_path) == ["entry"]  # our temporary copy is gone


# tiny-qwen3-moe by hand (V = 83, d = 128, 4 layers, heads as tiny-llama's, 8 experts of width 96, top 2):
#   per layer: attention 49152 + q/k norms 2*32 = 64; router 8*128 = 1024; experts 8 * 3*128*96 = 294912;
#              2 norms 256 = 345408; 4 layers = 1381632
#   embeddings 2*10624 = 21248, final norm 128             total 1381632 + 21248 + 128 = 1403008
TINY_MOE_PARAMETERS = 1403008


def test_the_embedded_mixture_of_experts_saves_per_expert_names(embedded_cache):
    folder = materialize_embedded_model("embedded:tiny-qwen3-moe", embedded_cache)
    config = AutoConfig.from_pretrained(folder)  # (transformers writes num_experts as num_local_experts)
    assert (config.model_type, config.num_experts, config.num_experts_per_tok) == ("qwen3_moe", 8, 2)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert num_parameters(model) == TINY_MOE_PARAMETERS
    from safetensors import safe_open

    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:  # what megatron's converter reads
        names = set(f.keys())
    assert {f"model.layers.3.mlp.experts.7.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")} <= names
    tokenizer = AutoTokenizer.from_pretrained(folder)  # the character tokenizer, not a Qwen2 tokenizer swapped in
    assert tokenizer.decode(tokenizer("12+7=19").input_ids) == "12+7=19"


@pytest.mark.parametrize(
    "name, cls, parameters",
    [
        ("tiny-qwen2.5-vl", "Qwen2_5_VLForConditionalGeneration", 1068224),
        ("tiny-qwen3-vl", "Qwen3VLForConditionalGeneration", 1273664),
    ],
)
def test_the_embedded_vision_language_models_load_and_read_an_image(embedded_cache, name, cls, parameters):
    """tiny-qwen2.5-vl and tiny-qwen3-vl: folders that transformers' Auto classes load (the image processor its PIL
    one), whose logits depend on the image's pixels."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    from verl.data.vision import load_vision_processor
    from verl.embedded.shapes import draw_shapes

    tiny_vlm_dir = materialize_embedded_model(name, embedded_cache)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    assert type(model).__name__ == cls and num_parameters(model) == parameters
    assert type(AutoImageProcessor.from_pretrained(tiny_vlm_dir)).__name__ == "Qwen2VLImageProcessorPil"
    assert len(tokenizer) == 87 and tokenizer.decode(tokenizer("12+7=")["input_ids"]) == "12+7="  # chars as before
    processor = load_vision_processor(tiny_vlm_dir, tokenizer)
    text = tokenizer.apply_chat_template(
        [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]],
        tokenize=False,
        add_generation_prompt=True,
    )[0]
    logits = []
    for count in (1, 4):
        image = draw_shapes(np.random.default_rng(0), count)
        ids = torch.tensor([tokenizer(processor.widen(text, [processor.image_tokens(image)]))["input_ids"]])
        with torch.no_grad():
            out = model(
                input_ids=ids, mm_token_type_ids=(ids == model.config.image_token_id).int(), **processor.pixels([image])
            )
        logits.append(out.logits[0, -1])
    assert logits[0].shape == (87,) and not torch.allclose(logits[0], logits[1])
