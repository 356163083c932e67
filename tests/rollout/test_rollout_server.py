"""The rollout service's replica (RolloutServer) over the real hf engine: requests in, finished samples out, with
the log-probs of the policy that sampled each token, also when new weights arrive midway (partial rollouts)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.support.engines import llama_dir  # noqa: F401
from verl.config.schema import RolloutConfig
from verl.workers.rollout_server import Request, RolloutServer
from verl_rollout.hf import HFRollout

EOS, PAD, MAX_NEW = 2, 0, 8
NEVER = 10**6  # an eos id outside the vocabulary: every request runs to its token limit


def _engine(path: str, eos: int = EOS) -> HFRollout:
    return HFRollout(RolloutConfig(), model_path=path, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=PAD)


def _requests(k: int = 6, temperature: float = 1.0) -> list[Request]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 40, (int(n),), generator=g).tolist() for n in torch.randint(2, 6, (k,), generator=g)]
    return [Request(f"r{i}", p, temperature=temperature) for i, p in enumerate(prompts)]


def _wait_all(server: RolloutServer, n: int, timeout_s: float = 120.0) -> dict:
    done, deadline = {}, time.monotonic() + timeout_s
    while len(done) < n:
        assert time.monotonic() < deadline, f"{len(done)} of {n} requests finished within {timeout_s} s"
        done.update({f.id: f for f in server.poll(timeout_s=1.0)})
    return done


def _log_probs(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """The model's log-prob of each of `tokens` after `prompt` (teacher forcing), at `temperature`."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)


class PauseAfterTurns:
    """The real engine, with the server paused after its first `turns` turns (so weights can be swapped midway)."""

    def __init__(self, engine: HFRollout, turns: int):
        self.engine, self.turns, self.server = engine, turns, None
        self.paused = threading.Event()

    def generate(self, *args, **kwargs):
        out = self.engine.generate(*args, **kwargs)
        self.turns -= 1
        if self.turns == 0:
            self.server.pause()
            self.paused.set()
        return out

    def update_weights(self, weights):
        return self.engine.update_weights(weights)


def test_requests_finish_with_the_sampling_policys_log_probs(llama_dir):  # noqa: F811
    engine = _engine(llama_dir)
    server = RolloutServer(engine, eos_ids=[EOS], pad_id=PAD, max_new_tokens=MAX_NEW, chunk=3)
    try:
        requests = _requests(temperature=0.7)
        prompts = {r.id: list(r.prompt) for r in requests}
        server.submit(requests)
        with pytest.raises(ValueError, match="already in flight"):
            server.submit([Request("r0", [3, 4])])
        done = _wait_all(server, len(requests))
    finally:
        server.close()
    model = AutoModelForCausalLM.from_pretrained(llama_dir)
    for rid, f in done.items():
        assert 1 <= len(f.tokens) <= MAX_NEW and len(f.log_probs) == len(f.versions) == len(f.tokens)
        assert f.versions == [0] * len(f.tokens)
        assert len(f.tokens) == MAX_NEW or f.tokens[-1] == EOS  # ends at eos or at the limit
        assert EOS not in f.tokens[:-1]
        want = _log_probs(model, prompts[rid], f.tokens, 0.7)
        assert torch.allclose(torch.tensor(f.log_probs), want, atol=1e-5), rid
    stats = server.take_stats()
    assert stats["tokens"] == sum(len(f.tokens) for f in done.values()) and stats["turns"] >= 3  # 8 tokens, 3 a turn


def test_a_partial_rollout_keeps_its_tokens_and_their_log_probs_across_a_weight_update(llama_dir):  # noqa: F811
    engine = PauseAfterTurns(_engine(llama_dir, NEVER), turns=1)
    server = RolloutServer(engine, eos_ids=[NEVER], pad_id=PAD, max_new_tokens=MAX_NEW, chunk=3)  # 8 tokens each
    engine.server = server
    old = AutoModelForCausalLM.from_pretrained(llama_dir)
    new = AutoModelForCausalLM.from_pretrained(llama_dir)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    try:
        requests = _requests()
        prompts = {r.id: list(r.prompt) for r in requests}
        server.submit(requests)
        assert engine.paused.wait(120), "the first turn did not finish"
        moved = server.load_weights(((k, v.detach().clone()) for k, v in new.named_parameters()), version=1)
        assert moved > 0
        server.resume()
        done = _wait_all(server, len(requests))
    finally:
        server.close()
    for rid, f in done.items():
        assert f.versions == [0] * 3 + [1] * 5, f.versions  # the first turn's 3 tokens, then the new policy's
        lp = torch.tensor(f.log_probs)
        assert torch.allclose(lp[:3], _log_probs(old, prompts[rid], f.tokens, 1.0)[:3], atol=1e-5), rid
        assert torch.allclose(lp[3:], _log_probs(new, prompts[rid], f.tokens, 1.0)[3:], atol=1e-5), rid
        assert not torch.allclose(lp[3:], _log_probs(old, prompts[rid], f.tokens, 1.0)[3:], atol=1e-2)
    assert server.take_stats()["interrupted"] == len(requests)


def test_abort_pause_and_an_engine_failure(llama_dir):  # noqa: F811
    engine = _engine(llama_dir, NEVER)
    server = RolloutServer(engine, eos_ids=[NEVER], pad_id=PAD, max_new_tokens=MAX_NEW, chunk=2)
    try:
        server.pause()
        server.submit(_requests(4))
        time.sleep(0.2)
        assert server.poll() == [] and server.in_flight() == 4  # paused: nothing generated
        assert server.abort(["r1", "r3", "nope"]) == 2
        server.resume()
        assert sorted(_wait_all(server, 2)) == ["r0", "r2"]
        assert server.poll(timeout_s=0.3) == []  # the aborted ones never come back
    finally:
        server.close()

    class Broken:
        def generate(self, *args, **kwargs):
            raise MemoryError("out of KV cache")

    broken = RolloutServer(Broken(), eos_ids=[], pad_id=PAD, max_new_tokens=4)
    broken.submit([Request("x", [3, 4])])
    with pytest.raises(RuntimeError, match="engine failed: MemoryError"):
        broken.poll(timeout_s=10)
    broken.close()


def test_streaming_polls_hand_out_each_token_once_then_the_finished_request(llama_dir):  # noqa: F811
    engine = _engine(llama_dir, NEVER)
    server = RolloutServer(engine, eos_ids=[NEVER], pad_id=PAD, max_new_tokens=MAX_NEW, chunk=2)  # 4 turns of 2
    try:
        server.submit(_requests(3))
        streamed: dict = {}
        done: dict = {}
        deadline = time.monotonic() + 120
        while len(done) < 3:
            assert time.monotonic() < deadline
            finished, updates = server.poll(timeout_s=1.0, stream=True)
            for u in updates:
                assert len(u.tokens) == len(u.log_probs) == len(u.versions) > 0
                streamed.setdefault(u.id, []).extend(u.tokens)
            done.update({f.id: f for f in finished})
    finally:
        server.close()
    for rid, f in done.items():
        # what streamed is a prefix of the finished tokens (the last turn's tokens come with the Finished)
        assert f.tokens[: len(streamed.get(rid, []))] == streamed.get(rid, [])
        assert len(f.tokens) == MAX_NEW
    assert any(streamed.values())  # with 4 turns per request, some tokens were streamed before the end
