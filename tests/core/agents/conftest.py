from tests.support.fixtures import char_tokenizer  # noqa: F401
