# Pytest fixtures shared with other test directories.
from tests.support.fixtures import char_tokenizer, embedded_cache, tiny_model_dir, tiny_vlm_dir  # noqa: F401
