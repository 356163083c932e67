"""The rollout service's replica (RolloutServer) contract, checked the same way over every engine: the hf engine
driven in turns (tests/rollout/test_rollout_server.py) and vLLM's own scheduler stepped request by request
(tests/rollout/vllm/test_vllm_service.py). Requests in, finished samples out, with the log-probs of the policy
that sampled each token, also when new weights arrive midway (partial rollouts); abort, pause, streaming.

Each check takes `make(eos)`: a server over a fresh engine on the model in `path` (a random Llama whose vocabulary
has 40 ids), with max_new_tokens MAX_NEW and eos id `eos`, and `turn`: how many engine calls make 3 tokens.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import torch
from transformers import AutoModelForCausalLM

from verl.workers.rollout_server import Request, RolloutServer

EOS, PAD, MAX_NEW = 2, 0, 8
NEVER = 10**6  # an eos id outside the vocabulary: every request runs to its token limit
Make = Callable[..., RolloutServer]  # make(eos, *, chunk) -> a server over a fresh engine


def requests(k: int = 6, temperature: float = 1.0) -> list[Request]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 40, (int(n),), generator=g).tolist() for n in torch.randint(2, 6, (k,), generator=g)]
    return [Request(f"r{i}", p, temperature=temperature) for i, p in enumerate(prompts)]


def wait_all(server: RolloutServer, n: int, timeout_s: float = 120.0) -> dict:
    done, deadline = {}, time.monotonic() + timeout_s
    while len(done) < n:
        assert time.monotonic() < deadline, f"{len(done)} of {n} requests finished within {timeout_s} s"
        done.update({f.id: f for f in server.poll(timeout_s=1.0)})
    return done


def log_probs(model, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    """The model's log-prob of each of `tokens` after `prompt` (teacher forcing), at `temperature`."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)


class PauseAfter:
    """The real engine, with the server paused after its first `calls` generating calls (turns, or steps of a
    stepped engine), so weights can be swapped midway; everything else goes to the engine."""

    def __init__(self, engine, calls: int):
        self.engine, self.calls, self.server = engine, calls, None
        self.paused = threading.Event()
        name = "step_requests" if callable(getattr(engine, "step_requests", None)) else "generate"
        setattr(self, name, self._counted(getattr(engine, name)))

    def _counted(self, call):
        def counted(*args, **kwargs):
            out = call(*args, **kwargs)
            self.calls -= 1
            if self.calls == 0:
                self.server.pause()
                self.paused.set()
            return out

        return counted

    def __getattr__(self, name):
        return getattr(self.engine, name)


def check_requests_finish_with_the_sampling_policys_log_probs(make: Make, path: str) -> None:
    server = make(EOS, chunk=3)
    try:
        batch = requests(temperature=0.7)
        prompts = {r.id: list(r.prompt) for r in batch}
        server.submit(batch)
        try:
            server.submit([Request("r0", [3, 4])])
            raise AssertionError("a second request with a live id was taken")
        except ValueError as err:
            assert "already in flight" in str(err)
        done = wait_all(server, len(batch))
    finally:
        server.close()
    model = AutoModelForCausalLM.from_pretrained(path)
    for rid, f in done.items():
        assert 1 <= len(f.tokens) <= MAX_NEW and len(f.log_probs) == len(f.versions) == len(f.tokens)
        assert f.versions == [0] * len(f.tokens)
        assert len(f.tokens) == MAX_NEW or f.tokens[-1] == EOS  # ends at eos or at the limit
        assert EOS not in f.tokens[:-1]
        want = log_probs(model, prompts[rid], f.tokens, 0.7)
        assert torch.allclose(torch.tensor(f.log_probs), want, atol=1e-5), rid
    stats = server.take_stats()
    assert stats["tokens"] == sum(len(f.tokens) for f in done.values()) and stats["turns"] >= 3


def check_a_partial_rollout_keeps_its_tokens_and_their_log_probs_across_a_weight_update(
    make: Make, path: str, turn: int
) -> None:
    """`turn`: the engine calls that make each request's first 3 tokens (1 hf turn of chunk 3; 3 vLLM steps)."""
    server = make(NEVER, chunk=3, wrap=lambda engine: PauseAfter(engine, turn))  # 8 tokens each
    server.engine.server = server
    old = AutoModelForCausalLM.from_pretrained(path)
    new = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    try:
        batch = requests()
        prompts = {r.id: list(r.prompt) for r in batch}
        server.submit(batch)
        assert server.engine.paused.wait(120), "the first turn did not finish"
        moved = server.load_weights(((k, v.detach().clone()) for k, v in new.named_parameters()), version=1)
        assert moved > 0
        server.resume()
        done = wait_all(server, len(batch))
    finally:
        server.close()
    for rid, f in done.items():
        assert f.versions == [0] * 3 + [1] * 5, f.versions  # the first turn's 3 tokens, then the new policy's
        lp = torch.tensor(f.log_probs)
        assert torch.allclose(lp[:3], log_probs(old, prompts[rid], f.tokens, 1.0)[:3], atol=1e-5), rid
        assert torch.allclose(lp[3:], log_probs(new, prompts[rid], f.tokens, 1.0)[3:], atol=1e-5), rid
        assert not torch.allclose(lp[3:], log_probs(old, prompts[rid], f.tokens, 1.0)[3:], atol=1e-2)
    assert server.take_stats()["interrupted"] == len(batch)


def check_abort_and_pause(make: Make) -> None:
    server = make(NEVER, chunk=2)
    try:
        server.pause()
        server.submit(requests(4))
        time.sleep(0.2)
        assert server.poll() == [] and server.in_flight() == 4  # paused: nothing generated
        assert server.abort(["r1", "r3", "nope"]) == 2
        server.resume()
        assert sorted(wait_all(server, 2)) == ["r0", "r2"]
        assert server.poll(timeout_s=0.3) == []  # the aborted ones never come back
        server.submit(requests(2))  # (r0 and r1 again, as new requests: finished ids may be used anew)
        time.sleep(0.05)
        assert server.abort(["r1"]) == 1  # aborted while running
        assert sorted(wait_all(server, 1)) == ["r0"]
        assert server.poll(timeout_s=0.3) == []
    finally:
        server.close()


def check_streaming_polls_hand_out_each_token_once_then_the_finished_request(make: Make) -> None:
    server = make(NEVER, chunk=2)  # hf: 4 turns of 2 tokens
    try:
        server.submit(requests(3))
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
    assert any(streamed.values())  # over several turns per request, some tokens were streamed before the end
