"""model.path as a Hub id (resolved from the local Hugging Face cache, offline) and how validate reports one that
is not there; folders and embedded names as before."""

from __future__ import annotations

import shutil

import pytest
from omegaconf import OmegaConf

from tests.support.fixtures import embedded_cache, tiny_model_dir  # noqa: F401
from verl.config.run_checks import check_run
from verl.config.schema import VerlConfig
from verl.model_source import ModelSourceError, is_hub_id, local_model_folder, resolve_model_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache_with(cache, repo: str, source: str) -> str:
    """`source`'s files as the snapshot of `repo` at main, laid out as huggingface_hub's cache keeps them."""
    org, name = repo.split("/")
    root = cache / f"models--{org}--{name}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    snapshot = root / "snapshots" / COMMIT
    shutil.copytree(source, snapshot)
    return str(snapshot)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants  # pants: no-infer-dep (installed with transformers)

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_id_resolves_to_its_cached_snapshot_offline(offline_cache, tiny_model_dir):  # noqa: F811
    snapshot = hub_cache_with(offline_cache, "verl-test/tiny-llama", tiny_model_dir)
    assert is_hub_id("verl-test/tiny-llama") and resolve_model_source("verl-test/tiny-llama") == snapshot
    assert resolve_model_source(f"verl-test/tiny-llama@{COMMIT}") == snapshot
    assert local_model_folder("verl-test/tiny-llama") == snapshot
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(resolve_model_source("verl-test/tiny-llama")).model_type == "llama"


def test_a_hub_id_missing_offline_names_the_id_and_the_cache(offline_cache):
    with pytest.raises(ModelSourceError, match=r"'verl-test/absent' is not in the Hugging Face cache .*HF_HUB_OFFLINE"):
        resolve_model_source("verl-test/absent")
    assert local_model_folder("verl-test/absent") is None


def test_local_paths_are_not_taken_for_hub_ids(tmp_path, tiny_model_dir):  # noqa: F811
    assert not is_hub_id(tiny_model_dir) and resolve_model_source(tiny_model_dir) == tiny_model_dir
    assert not is_hub_id("embedded:tiny-llama") and not is_hub_id("model.gguf") and not is_hub_id("a/b/c")


def _problems(**model):
    cfg = OmegaConf.merge(OmegaConf.structured(VerlConfig), {"model": model, "reward": {"fn": "arithmetic"}})
    return check_run(cfg, roles=[])


def test_validate_takes_a_cached_hub_id_and_names_a_missing_one(offline_cache, tiny_model_dir, monkeypatch):  # noqa: F811
    hub_cache_with(offline_cache, "verl-test/tiny-llama", tiny_model_dir)
    assert [p for p in _problems(path="verl-test/tiny-llama") if p.key.startswith("model.")] == []
    assert [p for p in _problems(path=tiny_model_dir, tokenizer_path="verl-test/tiny-llama")] == []
    (p,) = [p for p in _problems(path="verl-test/absent") if p.key == "model.path"]
    assert p.severity == "error" and str(offline_cache) in p.message and "huggingface-cli download" in p.fix
    from huggingface_hub import constants  # pants: no-infer-dep (installed with transformers)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online: fetched when the run starts
    (p,) = [p for p in _problems(path="verl-test/absent") if p.key == "model.path"]
    assert p.severity == "warning" and "downloaded from the Hub" in p.message


def test_a_missing_gguf_file_is_named(tmp_path):
    (p,) = [p for p in _problems(path=str(tmp_path / "model.Q4_1.gguf")) if p.key == "model.path"]
    assert "GGUF file" in p.message and "does not exist" in p.message
