from tests.support.fixtures import embedded_cache  # noqa: F401
