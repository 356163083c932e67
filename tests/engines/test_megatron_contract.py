"""The train engine contract (train_engine_contract.py) for the megatron engine (TP=PP=CP=1), on one gloo rank."""

from __future__ import annotations

import pytest

from tests.engines.train_engine_contract import *  # noqa: F403 (the shared checks, in their order)
from tests.engines.train_engine_contract import Backend


def _teardown() -> None:
    from verl_megatron.parallel import destroy_model_parallel

    destroy_model_parallel()


@pytest.fixture(scope="module")
def backend() -> Backend:
    from verl_megatron.engine import MegatronEngine

    return Backend("megatron", MegatronEngine, teardown=_teardown)


def test_megatron_declares_no_in_place_generation(backend, world, llama):  # noqa: F405
    """Its chunks are not one HF module: a colocated hf rollout keeps its own copy and takes weights()."""
    engine = make(backend, llama, inference=True)  # noqa: F405
    assert engine.gathered is None
    dict(engine.weights())
    assert engine.sync_received_bytes() == 0  # a world of one: nothing arrives from other ranks
