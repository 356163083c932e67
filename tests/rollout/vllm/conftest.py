import pytest

from tests.support.engines import make_llama_dir
from tests.support.fixtures import embedded_cache, ray_three_cpus, smollm2_dir  # noqa: F401


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    """vLLM's CPU attention kernels take head sizes from 32 up: a 2-layer GQA Llama with head_dim 32."""
    return make_llama_dir(str(tmp_path_factory.mktemp("llama")), hidden_size=64, head_dim=32)
