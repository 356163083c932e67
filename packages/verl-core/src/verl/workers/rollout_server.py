"""RolloutServer: request-level, asynchronous generation over one rollout engine (one replica of the service).

    server = RolloutServer(engine, eos_ids=[2], pad_id=0, max_new_tokens=256, chunk=32)
    server.submit([Request("a", prompt_ids, temperature=1.0)])
    done = server.poll(timeout_s=1.0)      # finished requests: tokens, log-probs, the version of each token
    server.load_weights(weights, version)  # between two turns; requests in flight continue with the new weights
    done, news = server.poll(timeout_s=0.1, stream=True)  # ... and the tokens sampled since the last poll

A thread drives the engine in turns: each takes up to `max_batch` live requests (oldest first, one temperature),
extends each by at most `chunk` tokens in one batched `generate` (the prompt and its tokens so far as the new
prompt), and records every new token with its log-prob and the policy version that sampled it. A request is done
at an eos or at its token limit. Loading weights waits for the turn in progress, then swaps them in; a request
that was midway continues under the new version, keeping its tokens and their log-probs (a partial rollout:
`Finished.versions` says which policy produced each token). `pause` holds the thread after its turn, `abort`
drops requests. Continuous batching comes from the turns: a request submitted now joins the next turn.

An engine with a scheduler of its own (`add_request` / `step_requests` / `abort_requests`: vllm) is instead
stepped: requests go into its scheduler (up to `max_batch` at a time) and each step adds a token to every running
one, its KV cache kept between steps (no prefill again per turn; `chunk` does not apply). A weight load aborts the
requests inside the engine and puts them in again with their tokens so far as prompt: they continue under the new
weights, computed anew.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from verl.protocol import DataProto
from verl.rollout_batch import left_padded


@dataclass
class Request:
    id: str
    prompt: List[int]  # token ids, no padding
    temperature: float = 1.0
    max_tokens: int = 0  # 0: the server's max_new_tokens
    tokens: List[int] = field(default_factory=list)
    log_probs: List[float] = field(default_factory=list)
    versions: List[int] = field(default_factory=list)  # the policy version that sampled each token
    submitted_at: float = 0.0
    streamed: int = 0  # tokens already handed out by a streaming poll
    engine_id: Optional[str] = None  # its id inside a stepped engine's scheduler, while it is there
    images: Dict[str, Any] = field(default_factory=dict)  # an image prompt's pixels and grids (multi_modal_inputs)


@dataclass
class Update:
    """Tokens a live request gained since the last streaming poll (its log-probs and their versions alongside)."""

    id: str
    tokens: List[int]
    log_probs: List[float]
    versions: List[int]


@dataclass
class Finished:
    """A finished request, as `poll` returns it (plain values: it crosses process boundaries)."""

    id: str
    tokens: List[int]
    log_probs: List[float]
    versions: List[int]
    seconds: float  # from submission to the end of its last turn

    @property
    def oldest_version(self) -> int:
        return min(self.versions, default=-1)


class RolloutServer:
    def __init__(
        self,
        engine: Any,
        *,
        eos_ids: Iterable[int],
        pad_id: int,
        max_new_tokens: int,
        chunk: int = 32,
        max_batch: int = 256,
        version: int = 0,
    ):
        self.engine, self.eos_ids, self.pad_id = engine, set(eos_ids), pad_id
        self.max_new_tokens, self.chunk, self.max_batch = max_new_tokens, max(1, chunk), max(1, max_batch)
        self.version = version
        self.live: "OrderedDict[str, Request]" = OrderedDict()
        self.finished: List[Finished] = []
        self.paused = False
        self.closed = False
        self.error: Optional[BaseException] = None
        self.stats = {"turns": 0, "tokens": 0, "busy_s": 0.0, "interrupted": 0}
        self.cond = threading.Condition()
        self.engine_lock = threading.Lock()  # one turn or one weight load at a time
        self.stepped = callable(getattr(engine, "step_requests", None))
        self.by_engine_id: Dict[str, Request] = {}  # (stepped) the requests inside the engine
        self.to_abort: List[str] = []  # (stepped) engine ids of aborted requests, dropped at the next step
        self.starts = 0
        self.thread = threading.Thread(target=self._loop, name="rollout-server", daemon=True)
        self.thread.start()

    # ---- the interface ---------------------------------------------------------------------------------------
    def submit(self, requests: Sequence[Request]) -> None:
        with self.cond:
            self._raise_if_failed()
            for r in requests:
                if r.id in self.live:
                    raise ValueError(f"request id {r.id!r} is already in flight")
                if r.images and self.stepped:
                    raise ValueError(
                        f"request {r.id!r} has images, and this engine's scheduler ({type(self.engine).__name__}) "
                        "takes token prompts only: serve image prompts with the hf rollout"
                    )
                r.max_tokens = min(r.max_tokens or self.max_new_tokens, self.max_new_tokens)
                r.submitted_at = time.perf_counter()
                self.live[r.id] = r
            self.cond.notify_all()

    def poll(self, timeout_s: float = 0.0, max_items: int = 0, stream: bool = False) -> Any:
        """Finished requests (oldest first), waiting up to timeout_s for at least one. stream: also the tokens
        live requests gained since the last streaming poll, as `(finished, updates)`, waiting for either (a
        finished request's last tokens are in its Finished, not in an Update)."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not self.finished and not self.error and time.monotonic() < deadline:
                if stream and any(len(r.tokens) > r.streamed for r in self.live.values()):
                    break
                self.cond.wait(deadline - time.monotonic())
            self._raise_if_failed()
            take = len(self.finished) if max_items <= 0 else max_items
            out, self.finished = self.finished[:take], self.finished[take:]
            if not stream:
                return out
            updates = []
            for r in self.live.values():
                if len(r.tokens) > r.streamed:
                    k = r.streamed
                    updates.append(Update(r.id, r.tokens[k:], r.log_probs[k:], r.versions[k:]))
                    r.streamed = len(r.tokens)
            return out, updates

    def abort(self, ids: Iterable[str]) -> int:
        """Drop requests (in flight or finished and not yet polled); returns how many were found."""
        ids = set(ids)
        with self.cond:
            gone = [self.live.pop(i) for i in ids if i in self.live]
            self.to_abort += [r.engine_id for r in gone if r.engine_id is not None]
            found = [r.id for r in gone]
            before = len(self.finished)
            self.finished = [f for f in self.finished if f.id not in ids]
            return len(found) + before - len(self.finished)

    def pause(self) -> None:
        """Generate no more turns (the one in progress finishes) until `resume`."""
        with self.cond:
            self.paused = True

    def resume(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def load_weights(self, weights: Iterable, version: int) -> int:
        """New weights between two turns; requests midway continue with them. Returns the engine's bytes."""
        with self.engine_lock:
            if self.stepped:  # their KV caches hold the old weights: computed anew from their tokens so far
                with self.cond:
                    inside = list(self.by_engine_id.values())
                self.engine.abort_requests([r.engine_id for r in inside])
                for r in inside:
                    r.engine_id = None
                self.by_engine_id.clear()
            moved = self.engine.update_weights(weights)
            with self.cond:
                self.version = version
                self.stats["interrupted"] += sum(1 for r in self.live.values() if r.tokens)
        return moved

    def in_flight(self) -> int:
        with self.cond:
            return len(self.live)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join(timeout=60)
        if self.stepped and self.by_engine_id:
            with self.engine_lock:
                self.engine.abort_requests(list(self.by_engine_id))
                self.by_engine_id.clear()

    # ---- the engine thread -----------------------------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the rollout server's engine failed: {self.error!r}") from self.error

    def _next_turn(self) -> List[Request]:
        with self.cond:
            while not self.closed and (self.paused or not self.live):
                self.cond.wait()
            if self.closed:
                return []
            first = next(iter(self.live.values()))
            same = [r for r in self.live.values() if r.temperature == first.temperature]
            return same[: self.max_batch]

    def _loop(self) -> None:
        try:
            while True:
                turn = self._next_turn()
                if not turn:
                    return
                self._step() if self.stepped else self._run(turn)
        except BaseException as err:  # reported to the next submit/poll: the caller names the replica
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _run(self, turn: List[Request]) -> None:
        width = min(self.chunk, max(r.max_tokens - len(r.tokens) for r in turn))
        with self.engine_lock:  # (held until the turn is recorded: a weight load sees every request's tokens)
            start = time.perf_counter()
            version = self.version
            prompts = left_padded([r.prompt + r.tokens for r in turn], self.pad_id)
            if any(r.images for r in turn):  # (the engine finds the images' places from their pad tokens)
                column = np.empty(len(turn), dtype=object)
                column[:] = [r.images for r in turn]
                prompts.non_tensor_batch["multi_modal_inputs"] = column
            out = self.engine.generate(prompts, n=1, temperature=turn[0].temperature, max_new_tokens=width)
            busy = time.perf_counter() - start
            self._record(turn, out, version, width, busy)

    def _step(self) -> None:
        """One step of a stepped engine: aborted requests out, new ones in (up to max_batch inside), a token each."""
        with self.cond:
            room = self.max_batch - len(self.by_engine_id)
            new = [r for r in self.live.values() if r.engine_id is None][: max(0, room)]
            aborted, self.to_abort = self.to_abort, []
        with self.engine_lock:
            start = time.perf_counter()
            self.engine.abort_requests(aborted)
            for eid in aborted:
                self.by_engine_id.pop(eid, None)
            for r in new:
                if r.engine_id is not None or self.live.get(r.id) is not r:  # (a weight load or an abort came first)
                    continue
                self.starts += 1
                r.engine_id = f"{r.id}#{self.starts}"
                self.by_engine_id[r.engine_id] = r
                left = r.max_tokens - len(r.tokens)
                self.engine.add_request(r.engine_id, r.prompt + r.tokens, temperature=r.temperature, max_tokens=left)
            version = self.version
            outs = self.engine.step_requests()
            busy = time.perf_counter() - start
            now = time.perf_counter()
            with self.cond:
                self.stats["turns"] += 1
                self.stats["busy_s"] += busy
                for eid, toks, lps, done in outs:
                    r = self.by_engine_id.get(eid)
                    if r is None:
                        continue
                    if self.live.get(r.id) is not r:  # aborted during the step
                        self.by_engine_id.pop(eid)
                        self.engine.abort_requests([eid])
                        continue
                    self._extend(r, toks, lps, version)
                    if done or len(r.tokens) >= r.max_tokens:
                        if not done:
                            self.engine.abort_requests([eid])
                        self.by_engine_id.pop(eid)
                        self._finish(r, now)
                self.cond.notify_all()

    def _extend(self, r: Request, tokens: List[int], log_probs: List[float], version: int) -> int:
        """New tokens for `r` (up to its limit), each marked with the version that sampled it; returns how many."""
        n = min(len(tokens), r.max_tokens - len(r.tokens))
        r.tokens += tokens[:n]
        r.log_probs += log_probs[:n]
        r.versions += [version] * n
        self.stats["tokens"] += n
        return n

    def _finish(self, r: Request, now: float) -> None:
        del self.live[r.id]
        self.finished.append(Finished(r.id, r.tokens, r.log_probs, r.versions, now - r.submitted_at))

    def _record(self, turn: List[Request], out: DataProto, version: int, width: int, busy: float) -> None:
        responses, log_probs = out.batch["responses"].tolist(), out.batch["rollout_log_probs"].tolist()
        lengths = out.batch["response_mask"].sum(-1).tolist()
        now = time.perf_counter()
        with self.cond:
            self.stats["turns"] += 1
            self.stats["busy_s"] += busy
            for r, toks, lps, n in zip(turn, responses, log_probs, lengths):
                if self.live.get(r.id) is not r:  # aborted during the turn
                    continue
                n = self._extend(r, toks[: int(n)], lps[: int(n)], version)
                ended = n < width or (n > 0 and toks[n - 1] in self.eos_ids)
                if ended or len(r.tokens) >= r.max_tokens:
                    self._finish(r, now)
            self.cond.notify_all()

    def take_stats(self) -> Dict[str, float]:
        with self.cond:
            stats, self.stats = dict(self.stats), {"turns": 0, "tokens": 0, "busy_s": 0.0, "interrupted": 0}
        return {k: float(v) for k, v in stats.items()}
