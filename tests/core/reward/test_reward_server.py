"""RewardServer: authenticated, bounded, validated; a rejected request changes nothing; an acknowledged score or
preference survives the server being killed; preferences rank a group's samples by wins minus losses."""

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
    assert call(server.url, "/v1/health") == (200, {"pending": 1, "scored": 1, "preferences": 0})


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


def _server_process(store):
    """A reward server process of its own over `store`, and its URL."""
    env = {**os.environ, "VERL_REWARD_TOKEN": TOKEN, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl.api.reward_server", "--store", str(store)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    return proc, line.split()[2]  # "reward server: http://127.0.0.1:PORT (store ...)"


def _kill(proc) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_a_score_acknowledged_before_the_server_was_killed_is_not_lost(tmp_path):
    store = tmp_path / "store"
    trainer_side = RewardServer(store, token=TOKEN)
    ids = trainer_side.submit([{"prompt": "1+1=", "response": "2"}, {"prompt": "1+2=", "response": "3"}])
    trainer_side.close()
    # A server process of its own over the same store; a client scores through it, then the process is killed.
    proc, url = _server_process(store)
    try:
        assert [s["id"] for s in call(url, "/v1/pending")[1]["samples"]] == ids  # it knows the submitted samples
        assert call(url, "/v1/scores", {"scores": [{"id": ids[1], "score": 0.25}]}) == (200, {"accepted": 1})
    finally:
        _kill(proc)
    again = RewardServer(store, token=TOKEN)
    try:
        start = time.monotonic()
        assert again.wait(ids[1:], timeout_s=5) == {ids[1]: 0.25}
        assert time.monotonic() - start < 1  # there at once: read from the store
    finally:
        again.close()


# ---- preferences ----------------------------------------------------------------------------------------


def _groups(server, sizes=(("g1", 2), ("g2", 1))) -> dict:
    """{group: [ids]}: samples submitted in groups."""
    out = {}
    for group, n in sizes:
        out[group] = server.submit([{"prompt": group, "response": f"r{i}", "group": group} for i in range(n)])
    return out


def test_pending_samples_show_their_group_until_it_has_a_preference(server):
    ids = _groups(server)
    samples = call(server.url, "/v1/pending")[1]["samples"]
    assert [(s["id"], s["group"]) for s in samples] == [*((i, "g1") for i in ids["g1"]), (ids["g2"][0], "g2")]
    body = {"preferences": [{"chosen": ids["g1"][1], "rejected": ids["g1"][0]}]}
    assert call(server.url, "/v1/preferences", body) == (200, {"accepted": 1})
    assert [s["id"] for s in call(server.url, "/v1/pending")[1]["samples"]] == ids["g2"]  # g1 is answered
    assert call(server.url, "/v1/health") == (200, {"pending": 1, "scored": 0, "preferences": 1})
    assert server.wait_preferred(ids["g1"] + ids["g2"], timeout_s=0.05) == {ids["g1"][0]: -1.0, ids["g1"][1]: 1.0}


@pytest.mark.parametrize(
    "case, status, text",
    [
        ("no_token", 401, "bearer token"),
        ("no_length", 411, "Content-Length"),
        ("oversized", 413, "over 2048 bytes"),
        ("not_json", 400, "not JSON"),
        ("no_list", 400, "non-empty list"),
        ("empty_list", 400, "non-empty list"),
        ("missing_field", 400, "preferences[0] must be"),
        ("extra_field", 400, "preferences[0] must be"),
        ("id_not_a_string", 400, "preferences[0] must be"),
        ("same_sample", 400, "preferences[1]: chosen and rejected are the same sample"),
        ("other_group", 400, "(group 'g1') and '{g2}' (group 'g2') are not in one group"),
        ("no_group", 400, "(group None)"),
        ("unknown_chosen", 404, "preferences[1].chosen 'nope' is no sample"),
        ("unknown_rejected", 404, "preferences[0].rejected 'nope' is no sample"),
        ("twice_in_one_request", 409, "preferences[1]: samples '{b}' and '{a}' are already compared"),
        ("too_many", 413, "at most 1000 preferences"),
    ],
)
def test_bad_preferences_get_their_4xx_and_change_nothing(server, tmp_path, case, status, text):
    ids = _groups(server)
    (loner,) = server.submit([{"prompt": "p", "response": "r"}])  # no group
    a, b, g2 = ids["g1"][0], ids["g1"][1], ids["g2"][0]
    good = {"chosen": a, "rejected": b}
    path = "/v1/preferences"
    requests = {
        "no_token": dict(body={"preferences": [good]}, token=None),
        "oversized": dict(raw=json.dumps({"preferences": [good] * 40}).encode()),
        "not_json": dict(raw=b"{preferences: "),
        "no_list": dict(body={"preferences": good}),
        "empty_list": dict(body={"preferences": []}),
        "missing_field": dict(body={"preferences": [{"chosen": a}]}),
        "extra_field": dict(body={"preferences": [{**good, "margin": 2}]}),
        "id_not_a_string": dict(body={"preferences": [{"chosen": a, "rejected": 3}]}),
        "same_sample": dict(body={"preferences": [good, {"chosen": a, "rejected": a}]}),
        "other_group": dict(body={"preferences": [{"chosen": a, "rejected": g2}]}),
        "no_group": dict(body={"preferences": [{"chosen": loner, "rejected": a}]}),
        "unknown_chosen": dict(body={"preferences": [good, {"chosen": "nope", "rejected": a}]}),
        "unknown_rejected": dict(body={"preferences": [{"chosen": a, "rejected": "nope"}]}),
        "twice_in_one_request": dict(body={"preferences": [good, {"chosen": b, "rejected": a}]}),
    }
    if case == "no_length":
        got, answer = _without_content_length(server.url + path)
    elif case == "too_many":  # (the count, not the bytes: a server with room for the body)
        got, answer = _too_many_preferences(tmp_path, good)
    else:
        got, answer = call(server.url, path, **requests[case])
    assert got == status and text.format(a=a, b=b, g2=g2) in answer["error"], answer
    assert server.compared == set() and server.group_preferences == {}  # nothing kept
    assert not (server.store / "preferences.jsonl").exists()  # nothing written
    assert call(server.url, path, {"preferences": [good]}) == (200, {"accepted": 1})  # fine afterwards


def _without_content_length(url: str):
    """(status, answer) of a POST without a Content-Length header (and so without a body: the server answers and
    closes the connection, so a body still being sent would race its close)."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.putrequest("POST", u.path)
        conn.putheader("Authorization", f"Bearer {TOKEN}")
        conn.endheaders()
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def _too_many_preferences(tmp_path, good):
    roomy = RewardServer(tmp_path / "roomy", token=TOKEN)
    try:
        return call(roomy.url, "/v1/preferences", {"preferences": [good] * 1001})
    finally:
        roomy.close()


def test_a_second_preference_between_the_same_two_samples_is_refused(server):
    ids = _groups(server)
    a, b = ids["g1"]
    assert call(server.url, "/v1/preferences", {"preferences": [{"chosen": a, "rejected": b}]})[0] == 200
    for again in ({"chosen": a, "rejected": b}, {"chosen": b, "rejected": a}):  # either way round
        status, answer = call(server.url, "/v1/preferences", {"preferences": [again]})
        assert status == 409 and "already compared" in answer["error"]
    assert server.wait_preferred([a, b], timeout_s=0) == {a: 1.0, b: -1.0}
    assert len((server.store / "preferences.jsonl").read_text().splitlines()) == 1


def test_copeland_scores_are_wins_minus_losses_within_the_group(server):
    (a, b, c, d, e), (x, y) = _groups(server, (("g", 5), ("h", 2))).values()
    pairs = [(a, b), (a, c), (b, c), (d, b), (c, d), (a, d)]  # e: never compared
    body = {"preferences": [{"chosen": w, "rejected": lose} for w, lose in pairs]}
    assert call(server.url, "/v1/preferences", body) == (200, {"accepted": 6})
    # by hand: a beats b, c, d: 3-0; b beats c, loses to a, d: 1-2; c beats d, loses to a, b: 1-2;
    # d beats b, loses to c, a: 1-2; e: 0-0
    assert server.wait_preferred([a, b, c, d, e], timeout_s=0) == {a: 3.0, b: -1.0, c: -1.0, d: -1.0, e: 0.0}
    assert server.wait_preferred([x, y], timeout_s=0.05) == {}  # group h has no preference yet
    assert call(server.url, "/v1/preferences", {"preferences": [{"chosen": y, "rejected": x}]})[0] == 200
    assert server.wait_preferred([x, y, a], timeout_s=0) == {x: -1.0, y: 1.0, a: 3.0}
    assert server.preferences_in([a, x]) == 7


def test_a_preference_acknowledged_before_the_server_was_killed_is_not_lost(tmp_path):
    store = tmp_path / "store"
    trainer_side = RewardServer(store, token=TOKEN)
    a, b, c = trainer_side.submit([{"prompt": "1+1=", "response": r, "group": "g"} for r in ("2", "3", "11")])
    trainer_side.close()
    proc, url = _server_process(store)
    try:
        assert [s["group"] for s in call(url, "/v1/pending")[1]["samples"]] == ["g"] * 3
        body = {"preferences": [{"chosen": a, "rejected": b}, {"chosen": a, "rejected": c}]}
        assert call(url, "/v1/preferences", body) == (200, {"accepted": 2})
    finally:
        _kill(proc)
    again = RewardServer(store, token=TOKEN)
    try:
        start = time.monotonic()
        assert again.wait_preferred([a, b, c], timeout_s=5) == {a: 2.0, b: -1.0, c: -1.0}
        assert time.monotonic() - start < 1  # there at once: read from the store
        assert again.pending(10) == []  # the group is answered
        status, answer = call(again.url, "/v1/preferences", {"preferences": [{"chosen": b, "rejected": a}]})
        assert status == 409  # the pairs compared came back too
    finally:
        again.close()
