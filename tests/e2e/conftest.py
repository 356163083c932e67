from tests.support.fixtures import (  # noqa: F401
    embedded_cache,
    ray_four_cpus,
    ray_three_cpus,
    ray_two_cpus,
    smollm2_dir,
    tiny_model_dir,
)
