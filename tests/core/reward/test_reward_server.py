"""RewardServer: authenticated, bounded, validated; a rejected request changes nothing; an acknowledged score
survives the server being killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from verl.api import RewardServer

TOKEN = "test-token"


@pytest.fixture
def server(tmp_path):
    s = RewardServer(tmp_path / "store", token=TOKEN, max_body_bytes=2048, rate_per_s=1000)
    yield s
    s.close()


def call(url: str, path: str, body=None, token: str | None = TOKEN, raw: bytes | None = None):
    """(status, JSON answer) of a request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, method="POST" if data is not None else "GET")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_clients_fetch_pending_samples_and_their_scores_reach_the_trainer(server):
    ids = server.submit([{"prompt": "1+1=", "response": "2", "data_source": "a"}, {"prompt": "2+2=", "response": "5"}])
    status, out = call(server.url, "/v1/pending?limit=10")
    assert status == 200 and [s["id"] for s in out["samples"]] == ids
    assert out["samples"][0] == {"id": ids[0], "prompt": "1+1=", "response": "2", "data_source": "a"}
    assert call(server.url, "/v1/scores", {"scores": [{"id": ids[0], "score": 1}]}) == (200, {"accepted": 1})
    assert [s["id"] for s in call(server.url, "/v1/pending")[1]["samples"]] == [ids[1]]
    assert server.wait(ids, timeout_s=0.05) == {ids[0]: 1.0}  # the other one never came
    assert call(server.url, "/v1/health") == (200, {"pending": 1, "scored": 1})


@pytest.mark.parametrize(
    "case, status, text",
    [
        ("no_token", 401, "bearer token"),
        ("wrong_token", 401, "bearer token"),
        ("oversized", 413, "over 2048 bytes"),
        ("not_json", 400, "not JSON"),
        ("no_scores_list", 400, "non-empty list"),
        ("extra_field", 400, "scores[0] must be"),
        ("nan_score", 400, "scores[0].score must be a finite number"),
        ("string_score", 400, "scores[0].score must be a finite number"),
        ("unknown_id", 404, "scores[1].id 'nope' is no sample"),
        ("unknown_endpoint", 404, "no such endpoint"),
        ("bad_limit", 400, "limit must be an integer"),
    ],
)
def test_bad_requests_get_their_4xx_and_change_nothing(server, case, status, text):
    (sid,) = server.submit([{"prompt": "p", "response": "r"}])
    good = {"id": sid, "score": 0.5}
    requests = {
        "no_token": dict(path="/v1/scores", body={"scores": [good]}, token=None),
        "wrong_token": dict(path="/v1/scores", body={"scores": [good]}, token="guess"),
        "oversized": dict(path="/v1/scores", raw=json.dumps({"scores": [good] * 100}).encode()),
        "not_json": dict(path="/v1/scores", raw=b"{scores: "),
        "no_scores_list": dict(path="/v1/scores", body={"scores": good}),
        "extra_field": dict(path="/v1/scores", body={"scores": [{**good, "weight": 2}]}),
        "nan_score": dict(path="/v1/scores", raw=b'{"scores": [{"id": "%s", "score": NaN}]}' % sid.encode()),
        "string_score": dict(path="/v1/scores", body={"scores": [{"id": sid, "score": "high"}]}),
        "unknown_id": dict(path="/v1/scores", body={"scores": [good, {"id": "nope", "score": 1.0}]}),
        "unknown_endpoint": dict(path="/v1/scorez", body={"scores": [good]}),
        "bad_limit": dict(path="/v1/pending?limit=-3"),
    }
    got, answer = call(server.url, **requests[case])
    assert got == status and text in answer["error"]
    assert server.scores == {} and not (server.store / "scores.jsonl").exists()  # nothing kept, nothing written
    assert call(server.url, "/v1/scores", {"scores": [good]})[0] == 200  # the server is fine afterwards


def test_a_second_score_for_a_sample_is_refused(server):
    (sid,) = server.submit([{"prompt": "p", "response": "r"}])
    assert call(server.url, "/v1/scores", {"scores": [{"id": sid, "score": 1.0}]})[0] == 200
    status, answer = call(server.url, "/v1/scores", {"scores": [{"id": sid, "score": 0.0}]})
    assert status == 409 and "already scored" in answer["error"] and server.scores == {sid: 1.0}


def test_a_client_over_the_rate_is_told_to_slow_down(tmp_path):
    server = RewardServer(tmp_path, token=TOKEN, rate_per_s=3)
    try:
        statuses = [call(server.url, "/v1/health")[0] for _ in range(6)]
        assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]
    finally:
        server.close()


def test_a_score_acknowledged_before_the_server_was_killed_is_not_lost(tmp_path):
    store = tmp_path / "store"
    trainer_side = RewardServer(store, token=TOKEN)
    ids = trainer_side.submit([{"prompt": "1+1=", "response": "2"}, {"prompt": "1+2=", "response": "3"}])
    trainer_side.close()
    # A server process of its own over the same store; a client scores through it, then the process is killed.
    env = {**os.environ, "VERL_REWARD_TOKEN": TOKEN, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl.api.reward_server", "--store", str(store)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = line.split()[2]  # "reward server: http://127.0.0.1:PORT (store ...)"
        assert [s["id"] for s in call(url, "/v1/pending")[1]["samples"]] == ids  # it knows the submitted samples
        assert call(url, "/v1/scores", {"scores": [{"id": ids[1], "score": 0.25}]}) == (200, {"accepted": 1})
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    again = RewardServer(store, token=TOKEN)
    try:
        start = time.monotonic()
        assert again.wait(ids[1:], timeout_s=5) == {ids[1]: 0.25}
        assert time.monotonic() - start < 1  # there at once: read from the store
    finally:
        again.close()
