"""RewardServer: an HTTP service through which people or other services score a run's samples.

The trainer submits each sample (prompt and response text, and the prompt group it belongs to) and waits for its
score; a client fetches pending samples and posts scores by sample id, or preferences between two samples of one
group:

    GET  /v1/pending?limit=N   -> {"samples": [{"id", "prompt", "response", "data_source", "group"}, ...]}
    POST /v1/scores            <- {"scores": [{"id": "...", "score": 0.5}, ...]}  -> {"accepted": n}
    POST /v1/preferences       <- {"preferences": [{"chosen": "<id>", "rejected": "<id>"}, ...]}  -> {"accepted": n}
    GET  /v1/health            -> {"pending": n, "scored": n, "preferences": n}

`group` (present when the trainer gave one) is an opaque id shared by the samples of one prompt: the samples a
preference may compare. A sample is pending until it is scored or its group has a preference. The trainer
(reward.server.feedback=preferences) scores each sample of an answered group by its wins minus its losses in the
group's preferences (a Copeland score: each pair of samples is compared at most once). It takes a group's scores
as soon as the group has a preference, so a client posts all of a group's preferences in one request.

Every request carries `Authorization: Bearer <token>` (401 otherwise). A POST without Content-Length is 411; a
body over `max_body_bytes` is 413 and not read; a client over `rate_per_s` requests a second is 429; malformed
JSON or fields are 400 (so is a preference of a sample over itself, or over a sample of another group) and an
unknown sample id 404, naming what is wrong; a second score for a sample, or a second preference between the same
two samples (either way round), is 409. A rejected request changes nothing: a batch of scores or preferences is
checked whole before any is kept. An accepted score is appended to `<store>/scores.jsonl` (a preference to
`<store>/preferences.jsonl`) and flushed to disk before the answer is sent, so a server killed after
acknowledging loses nothing: a new server on the same store serves every sample, score and preference the old one
had (samples are kept in `<store>/samples.jsonl` the same way). The server listens on loopback unless told
otherwise.

    python -m verl.api.reward_server --store DIR [--host H] [--port P]   (token from $VERL_REWARD_TOKEN)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set
from urllib.parse import parse_qs, urlparse

from verl.utils.http import JSONHandler

logger = logging.getLogger(__name__)

TOKEN_ENV = "VERL_REWARD_TOKEN"
MAX_SCORES_PER_REQUEST = 1000


class RequestError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _append_synced(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append JSON lines and flush them to disk before returning (what an acknowledgment promises)."""
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _read_lines(path: Path) -> List[Dict[str, Any]]:
    """The JSON lines of a store file; a last line cut short by a crash mid-write is ignored."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s: ignored a line cut short (a crash while it was written)", path)
    return rows


class _RateLimit:
    """A token bucket per client address: `rate` requests a second, bursts up to `rate`."""

    def __init__(self, rate: float):
        self.rate, self.lock = rate, threading.Lock()
        self.buckets: Dict[str, Any] = {}

    def allow(self, client: str) -> bool:
        now = time.monotonic()
        with self.lock:
            tokens, last = self.buckets.get(client, (self.rate, now))
            tokens = min(self.rate, tokens + (now - last) * self.rate)
            if tokens < 1:
                self.buckets[client] = (tokens, now)
                return False
            self.buckets[client] = (tokens - 1, now)
            return True


class RewardServer:
    """Samples waiting for an external score, served over HTTP; scores persisted before they are acknowledged.

    server = RewardServer("run/reward_server", token="...")   # starts listening (loopback, a free port)
    ids = server.submit([{"prompt": "1+1=", "response": "2", "group": "g0"}, ...])
    scores = server.wait(ids, timeout_s=60)                  # {id: score} of those scored in time
    ranks = server.wait_preferred(ids, timeout_s=60)         # {id: wins - losses} of those whose group is answered
    server.close()
    """

    def __init__(
        self,
        store: str | os.PathLike,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = 256 * 1024,
        rate_per_s: float = 20.0,
    ):
        if not token:
            raise ValueError(f"the reward server needs a bearer token (set ${TOKEN_ENV}, or pass token=...)")
        self.store = Path(store)
        self.store.mkdir(parents=True, exist_ok=True)
        self.token, self.max_body_bytes = token, max_body_bytes
        self.samples: Dict[str, Dict[str, Any]] = {row["id"]: row for row in _read_lines(self.store / "samples.jsonl")}
        self.scores: Dict[str, float] = {row["id"]: row["score"] for row in _read_lines(self.store / "scores.jsonl")}
        self.compared: Set[FrozenSet[str]] = set()  # {chosen, rejected} of each preference
        self.copeland: Dict[str, int] = {}  # sample id -> wins - losses
        self.group_preferences: Dict[str, int] = {}  # group -> preferences posted (a key: the group is answered)
        for row in _read_lines(self.store / "preferences.jsonl"):
            self._keep_preference(row)
        self.lock = threading.Condition()
        self.rate = _RateLimit(rate_per_s)
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        # (close() waits for the serving loop's next poll: 0.05 s, not the default 0.5 s)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="reward-server", daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    # ---- the trainer's side ---------------------------------------------------------------------------
    def submit(self, samples: Sequence[Mapping[str, Any]]) -> List[str]:
        """Make samples (prompt, response, data_source: text; group: an id shared by one prompt's samples, if any)
        available to clients; returns their ids."""
        rows = [
            {
                "id": uuid.uuid4().hex,
                "prompt": str(s.get("prompt", "")),
                "response": str(s.get("response", "")),
                "data_source": str(s.get("data_source", "")),
                **({"group": str(s["group"])} if s.get("group") is not None else {}),
            }
            for s in samples
        ]
        with self.lock:
            _append_synced(self.store / "samples.jsonl", rows)
            self.samples.update({row["id"]: row for row in rows})
        return [row["id"] for row in rows]

    def wait(self, ids: Sequence[str], timeout_s: float) -> Dict[str, float]:
        """Scores of `ids` posted within `timeout_s` (all of them as soon as they are all in)."""
        return self._wait(ids, timeout_s, self.scores.get)

    def wait_preferred(self, ids: Sequence[str], timeout_s: float) -> Dict[str, float]:
        """Copeland scores (wins - losses within the group) of those `ids` whose group has a preference within
        `timeout_s` (all of them as soon as every group is answered)."""
        return self._wait(ids, timeout_s, self._preferred)

    def preferences_in(self, ids: Sequence[str]) -> int:
        """How many preferences the groups of `ids` have."""
        with self.lock:
            groups = {self.samples[i].get("group") for i in ids}
            return sum(self.group_preferences.get(g, 0) for g in groups if g is not None)

    def _preferred(self, sid: str) -> Optional[float]:
        """A sample's Copeland score once its group is answered, else None."""
        if self.samples[sid].get("group") not in self.group_preferences:
            return None
        return float(self.copeland.get(sid, 0))

    def _wait(self, ids: Sequence[str], timeout_s: float, answer: Callable[[str], Optional[float]]) -> Dict[str, float]:
        """{id: answer(id)} of the `ids` answered (not None) within `timeout_s`; called and waited on under the lock."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while not all(answer(i) is not None for i in ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(left)
            got = {i: answer(i) for i in ids}
            return {i: v for i, v in got.items() if v is not None}

    def _is_pending(self, row: Mapping[str, Any]) -> bool:
        """Neither scored nor in a group with a preference (what a client still has to look at)."""
        return row["id"] not in self.scores and row.get("group") not in self.group_preferences

    def pending(self, limit: int) -> List[Dict[str, Any]]:
        with self.lock:
            waiting = (row for row in self.samples.values() if self._is_pending(row))
            return [row for _, row in zip(range(limit), waiting)]

    def health(self) -> Dict[str, int]:
        with self.lock:
            return {
                "pending": sum(map(self._is_pending, self.samples.values())),
                "scored": len(self.scores),
                "preferences": len(self.compared),
            }

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    # ---- the clients' side ------------------------------------------------------------------------------
    def accept(self, body: Any) -> int:
        """Validate a POST /v1/scores body whole, persist its scores, then keep them; RequestError otherwise."""
        if not isinstance(body, dict) or not isinstance(body.get("scores"), list) or not body["scores"]:
            raise RequestError(
                400, 'the body must be {"scores": [{"id": "...", "score": 0.5}, ...]} (a non-empty list)'
            )
        entries = body["scores"]
        if len(entries) > MAX_SCORES_PER_REQUEST:
            raise RequestError(413, f"at most {MAX_SCORES_PER_REQUEST} scores per request, got {len(entries)}")
        rows: List[Any] = []
        seen: set = set()
        with self.lock:
            for k, entry in enumerate(entries):
                if not isinstance(entry, dict) or set(entry) - {"id", "score"} or not isinstance(entry.get("id"), str):
                    raise RequestError(400, f'scores[{k}] must be {{"id": str, "score": number}}, got {entry!r:.200}')
                score = entry.get("score")
                if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                    raise RequestError(400, f"scores[{k}].score must be a finite number, got {score!r:.100}")
                sid = entry["id"]
                if sid not in self.samples:
                    raise RequestError(404, f"scores[{k}].id {sid!r:.100} is no sample of this server")
                if sid in self.scores or sid in seen:
                    raise RequestError(409, f"scores[{k}].id {sid!r:.100} is already scored")
                seen.add(sid)
                rows.append({"id": sid, "score": float(score), "time": time.time()})
            _append_synced(self.store / "scores.jsonl", rows)  # on disk before the answer
            self.scores.update({row["id"]: row["score"] for row in rows})
            self.lock.notify_all()
        for row in rows:
            logger.info("reward server: accepted score %s for sample %s", row["score"], row["id"])
        return len(rows)

    def accept_preferences(self, body: Any) -> int:
        """Validate a POST /v1/preferences body whole, persist its preferences, then keep them; RequestError
        otherwise."""
        if not isinstance(body, dict) or not isinstance(body.get("preferences"), list) or not body["preferences"]:
            raise RequestError(
                400,
                'the body must be {"preferences": [{"chosen": "<id>", "rejected": "<id>"}, ...]} (a non-empty list)',
            )
        entries = body["preferences"]
        if len(entries) > MAX_SCORES_PER_REQUEST:
            raise RequestError(413, f"at most {MAX_SCORES_PER_REQUEST} preferences per request, got {len(entries)}")
        rows: List[Any] = []
        seen: set = set()
        with self.lock:
            for k, entry in enumerate(entries):
                rows.append(self._checked_preference(k, entry, seen))
            _append_synced(self.store / "preferences.jsonl", rows)  # on disk before the answer
            for row in rows:
                self._keep_preference(row)
            self.lock.notify_all()
        for row in rows:
            logger.info("reward server: accepted preference of %s over %s", row["chosen"], row["rejected"])
        return len(rows)

    def _checked_preference(self, k: int, entry: Any, seen: Set[FrozenSet[str]]) -> Dict[str, Any]:
        """preferences[k] as a store row, if valid (and no pair of this request or before compares the same two
        samples: `seen` gathers this request's); RequestError otherwise. Called under the lock."""
        if (
            not isinstance(entry, dict)
            or set(entry) != {"chosen", "rejected"}
            or not all(isinstance(v, str) for v in entry.values())
        ):
            raise RequestError(400, f'preferences[{k}] must be {{"chosen": id, "rejected": id}}, got {entry!r:.200}')
        chosen, rejected = entry["chosen"], entry["rejected"]
        if chosen == rejected:
            raise RequestError(400, f"preferences[{k}]: chosen and rejected are the same sample {chosen!r:.100}")
        for side in ("chosen", "rejected"):
            if entry[side] not in self.samples:
                raise RequestError(404, f"preferences[{k}].{side} {entry[side]!r:.100} is no sample of this server")
        group, other = self.samples[chosen].get("group"), self.samples[rejected].get("group")
        if group is None or group != other:
            raise RequestError(
                400,
                f"preferences[{k}]: samples {chosen!r} (group {group!r}) and {rejected!r} (group {other!r}) are not "
                "in one group; a preference compares two samples of one prompt group",
            )
        pair = frozenset((chosen, rejected))
        if pair in self.compared or pair in seen:
            raise RequestError(409, f"preferences[{k}]: samples {chosen!r} and {rejected!r} are already compared")
        seen.add(pair)
        return {"chosen": chosen, "rejected": rejected, "group": group, "time": time.time()}

    def _keep_preference(self, row: Mapping[str, Any]) -> None:
        """Count a (validated or reloaded) preference into the pairs compared, the Copeland scores and its group."""
        self.compared.add(frozenset((row["chosen"], row["rejected"])))
        self.copeland[row["chosen"]] = self.copeland.get(row["chosen"], 0) + 1
        self.copeland[row["rejected"]] = self.copeland.get(row["rejected"], 0) - 1
        self.group_preferences[row["group"]] = self.group_preferences.get(row["group"], 0) + 1

    def _handler(self) -> type:
        server = self
        posts = {"/v1/scores": self.accept, "/v1/preferences": self.accept_preferences}

        class Handler(JSONHandler):
            def _checked(self) -> None:
                if not self.has_bearer(server.token):
                    raise RequestError(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
                if not server.rate.allow(self.client_address[0]):
                    raise RequestError(429, "too many requests: slow down")

            def _serve(self, method: str) -> None:
                try:
                    self._checked()
                    url = urlparse(self.path)
                    if method == "GET" and url.path == "/v1/pending":
                        limit = parse_qs(url.query).get("limit", ["100"])[0]
                        if not limit.isdigit() or not 1 <= int(limit) <= MAX_SCORES_PER_REQUEST:
                            raise RequestError(400, f"limit must be an integer in [1, {MAX_SCORES_PER_REQUEST}]")
                        self.send_json(200, {"samples": server.pending(int(limit))})
                    elif method == "GET" and url.path == "/v1/health":
                        self.send_json(200, server.health())
                    elif method == "POST" and url.path in posts:
                        self.send_json(200, {"accepted": posts[url.path](self._body())})
                    else:
                        raise RequestError(404, f"no such endpoint: {method} {url.path}")
                except RequestError as e:
                    self.send_json(e.status, {"error": e.message})

            def _body(self) -> Any:
                """The request's JSON body, within max_body_bytes."""
                size = self.headers.get("Content-Length")
                if size is None or not size.isdigit():
                    self.close_connection = True  # (a body of unknown length is not read)
                    raise RequestError(411, "a Content-Length header is required")
                if int(size) > server.max_body_bytes:
                    self.close_connection = True  # (the body is not read)
                    raise RequestError(413, f"the body is over {server.max_body_bytes} bytes")
                try:
                    return json.loads(self.rfile.read(int(size)) or b"null")
                except (ValueError, UnicodeDecodeError):
                    raise RequestError(400, "the body is not JSON") from None

            def do_GET(self) -> None:  # noqa: N802 (http.server's names)
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

        return Handler


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Serve a store until killed (a reward server of its own, e.g. next to an annotation tool)."""
    parser = argparse.ArgumentParser(prog="python -m verl.api.reward_server")
    parser.add_argument("--store", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = RewardServer(args.store, token=os.environ.get(TOKEN_ENV, ""), host=args.host, port=args.port)
    print(f"reward server: {server.url} (store {server.store})", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
