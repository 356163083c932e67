from tests.support.fixtures import embedded_cache, ray_four_cpus, ray_three_cpus, ray_two_cpus  # noqa: F401
