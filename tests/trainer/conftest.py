from tests.support.fixtures import embedded_cache, ray_two_cpus  # noqa: F401
