# Pytest fixtures shared with other test directories.
import pytest

from tests.support.fixtures import char_tokenizer, embedded_cache, tiny_model_dir, tiny_vlm_dir  # noqa: F401


@pytest.fixture(autouse=True)
def _prompt_cache_in_tmp(monkeypatch, tmp_path_factory):
    """Data sets built here cache their tokenised prompts (verl.data.prompt_cache) in a test folder, not in
    the user's ~/.cache/verl."""
    monkeypatch.setenv("VERL_CACHE", str(tmp_path_factory.getbasetemp() / "verl-cache-data"))
