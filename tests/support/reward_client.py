"""A reward server's client in a process of its own: scores every pending sample 1 if its response has odd length,
else 0, until killed. `python -m tests.support.reward_client OUTPUT_DIR` (token in $VERL_REWARD_TOKEN)."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request


def main(output_dir: str) -> None:
    info = os.path.join(output_dir, "reward_server.json")
    while not os.path.exists(info):  # written when the run starts its server
        time.sleep(0.05)
    time.sleep(0.05)
    url = json.load(open(info))["url"]
    headers = {"Authorization": f"Bearer {os.environ['VERL_REWARD_TOKEN']}", "Content-Type": "application/json"}
    while True:
        req = urllib.request.Request(url + "/v1/pending?limit=100", headers=headers)
        samples = json.loads(urllib.request.urlopen(req, timeout=10).read())["samples"]
        if samples:
            scores = [{"id": s["id"], "score": float(len(s["response"]) % 2)} for s in samples]
            body = json.dumps({"scores": scores}).encode()
            urllib.request.urlopen(urllib.request.Request(url + "/v1/scores", body, headers), timeout=10).read()
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1])
