"""The rollout service's replica (RolloutServer) over the real hf engine, driven in turns: the service contract
(tests/rollout/service_contract.py), and an engine failure reported to the caller."""

from __future__ import annotations

import pytest

from tests.rollout import service_contract as contract
from tests.support.engines import llama_dir  # noqa: F401
from verl.config.schema import RolloutConfig
from verl.engine_protocol import RolloutSettings
from verl.workers.rollout_server import Request, RolloutServer
from verl_rollout.hf import HFRollout


@pytest.fixture
def make(llama_dir):  # noqa: F811
    def build(eos: int, *, chunk: int, wrap=lambda engine: engine) -> RolloutServer:
        engine = HFRollout(
            RolloutConfig(),
            model_path=llama_dir,
            settings=RolloutSettings(max_new_tokens=contract.MAX_NEW, eos_ids=(eos,), pad_id=contract.PAD),
        )
        return RolloutServer(
            wrap(engine), eos_ids=[eos], pad_id=contract.PAD, max_new_tokens=contract.MAX_NEW, chunk=chunk
        )

    return build


def test_requests_finish_with_the_sampling_policys_log_probs(make, llama_dir):  # noqa: F811
    contract.check_requests_finish_with_the_sampling_policys_log_probs(make, llama_dir)


def test_a_partial_rollout_keeps_its_tokens_and_their_log_probs_across_a_weight_update(make, llama_dir):  # noqa: F811
    contract.check_a_partial_rollout_keeps_its_tokens_and_their_log_probs_across_a_weight_update(
        make, llama_dir, turn=1
    )


def test_abort_and_pause(make):
    contract.check_abort_and_pause(make)


def test_streaming_polls_hand_out_each_token_once_then_the_finished_request(make):
    contract.check_streaming_polls_hand_out_each_token_once_then_the_finished_request(make)


def test_an_engine_failure_is_raised_by_poll():
    class Broken:
        def generate(self, *args, **kwargs):
            raise MemoryError("out of KV cache")

    broken = RolloutServer(Broken(), eos_ids=[], pad_id=contract.PAD, max_new_tokens=4)
    broken.submit([Request("x", [3, 4])])
    with pytest.raises(RuntimeError, match="engine failed: MemoryError"):
        broken.poll(timeout_s=10)
    broken.close()


def test_image_requests_are_refused_by_an_engine_that_schedules_token_prompts():
    """A stepped engine (vLLM's scheduler) takes token prompts only: an image request is refused by name at submit
    (the hf rollout's service takes them: tests/rollout/test_hf_vision.py)."""

    class Stepped:
        def step_requests(self):
            return []

    server = RolloutServer(Stepped(), eos_ids=[], pad_id=contract.PAD, max_new_tokens=4)
    with pytest.raises(ValueError, match="request 'x' has images.*Stepped.*hf rollout"):
        server.submit([Request("x", [3, 4], images={"pixel_values": None})])
    server.close()
