"""The train engine contract (train_engine_contract.py) for the FSDP engine, on one gloo rank."""

from __future__ import annotations

import pytest

from tests.engines.train_engine_contract import *  # noqa: F403 (the shared checks, in their order)
from tests.engines.train_engine_contract import Backend


@pytest.fixture(scope="module")
def backend() -> Backend:
    from verl_fsdp.engine import FSDPEngine

    return Backend("fsdp", FSDPEngine)


def test_fsdp_declares_in_place_generation(backend, world, llama):  # noqa: F405
    """The hf rollout generates on the FSDP module itself, held unsharded by gathered()."""
    engine = make(backend, llama)  # noqa: F405
    assert engine.gathered is not None and engine.sync_received_bytes() == 0
    with engine.gathered() as module:
        assert module is engine.model
