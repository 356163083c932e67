"""A reward server's client in a process of its own, until killed (token in $VERL_REWARD_TOKEN).

`python -m tests.support.reward_client OUTPUT_DIR` scores each pending sample 1 if its response has odd length,
else 0; `... OUTPUT_DIR preferences` compares every two samples of each pending group, choosing the one
`preferred_key` ranks higher.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections import defaultdict
from itertools import combinations
from typing import Any, Callable, Dict, List, Tuple


def preferred_key(response: str) -> Tuple[int, str]:
    """The longer response is preferred; of two as long, the later in text order (a strict order: no ties)."""
    return len(response), response


def scores(samples: List[Dict[str, Any]]) -> Tuple[str, Dict[str, Any]]:
    return "/v1/scores", {"scores": [{"id": s["id"], "score": float(len(s["response"]) % 2)} for s in samples]}


def preferences(samples: List[Dict[str, Any]]) -> Tuple[str, Dict[str, Any]]:
    """Every pair of each group's samples, the preferred one chosen: a whole group in one request, since a group
    stops being pending once it has a preference."""
    groups = defaultdict(list)
    for s in samples:
        groups[s["group"]].append(s)
    pairs = []
    for group in groups.values():
        for a, b in combinations(group, 2):
            chosen, rejected = (a, b) if preferred_key(a["response"]) > preferred_key(b["response"]) else (b, a)
            pairs.append({"chosen": chosen["id"], "rejected": rejected["id"]})
    return "/v1/preferences", {"preferences": pairs}


MODES: Dict[str, Callable[[List[Dict[str, Any]]], Tuple[str, Dict[str, Any]]]] = {
    "scores": scores,
    "preferences": preferences,
}


def main(output_dir: str, mode: str = "scores") -> None:
    answer = MODES[mode]
    info = os.path.join(output_dir, "reward_server.json")
    while not os.path.exists(info):  # written when the run starts its server
        time.sleep(0.05)
    time.sleep(0.05)
    url = json.load(open(info))["url"]
    headers = {"Authorization": f"Bearer {os.environ['VERL_REWARD_TOKEN']}", "Content-Type": "application/json"}
    while True:
        # (the trainer submits a batch at once, so a fetch sees each of its groups whole)
        req = urllib.request.Request(url + "/v1/pending?limit=1000", headers=headers)
        samples = json.loads(urllib.request.urlopen(req, timeout=10).read())["samples"]
        if samples:
            path, body = answer(samples)
            data = json.dumps(body).encode()
            urllib.request.urlopen(urllib.request.Request(url + path, data, headers), timeout=10).read()
        time.sleep(0.05)


if __name__ == "__main__":
    main(*sys.argv[1:])
