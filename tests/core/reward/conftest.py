# Pytest fixtures shared with other test directories.
from tests.support.fixtures import char_tokenizer  # noqa: F401
