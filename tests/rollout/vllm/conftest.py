from tests.fixtures import embedded_cache  # noqa: F401
