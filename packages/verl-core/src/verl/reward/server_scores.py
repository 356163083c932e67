"""Scores from the reward server's clients (reward.server): submit a batch's samples, wait, apply the policy.

feedback=scores: each sample waits for the score a client posts. feedback=preferences: each prompt group (the
batch's `uid`) waits for a client's preferences between its samples; once a group has one, each of its samples
scores its wins minus its losses (a Copeland score: online DPO pairs the most and the least preferred, GRPO gets a
ranking reward). A sample of a group without a preference is missing.

Policies for the samples not scored within `timeout_s`: default (score them `default_score`), retry (wait again,
up to `max_retries` more times, then stop the run naming how many are missing) or skip (the trainer drops the
prompt groups they belong to; `RewardManager.last_missing` marks them).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from verl.config.schema import RewardServerConfig, VerlConfig

logger = logging.getLogger(__name__)


class ServerScores:
    def __init__(self, server: Any, cfg: RewardServerConfig):
        """server: a verl.api.RewardServer; cfg: the reward.server section."""
        self.server, self.cfg = server, cfg
        # Groups are uids made unique to this run: a rerun on the same store numbers its uids again from the start,
        # and must not find its groups answered by the old run's preferences.
        self.run = uuid.uuid4().hex[:8]

    def __call__(
        self, prompts: List[str], responses: List[str], sources: List[str], groups: Optional[Sequence[Any]] = None
    ) -> Tuple[torch.Tensor, np.ndarray, Dict[str, float]]:
        """(scores [n], missing [n] bool, metrics) for these samples; groups: each one's prompt group (uid)."""
        c = self.cfg
        preferences = c.feedback == "preferences"
        if preferences and groups is None:
            raise ValueError(
                "reward.server.feedback=preferences compares the samples of one prompt group, and this batch has no "
                "groups (no uid column: validation, or a greedy baseline, generates one sample per prompt); use "
                "feedback=scores, or another reward source for it"
            )
        start = time.perf_counter()
        named = [None] * len(prompts) if groups is None else [f"{self.run}-{g}" for g in groups]
        ids = self.server.submit(
            [
                {"prompt": p, "response": r, "data_source": s, "group": g}
                for p, r, s, g in zip(prompts, responses, sources, named)
            ]
        )
        wait = self.server.wait_preferred if preferences else self.server.wait
        got = wait(ids, c.timeout_s)
        retries = 0
        while len(got) < len(ids) and c.on_timeout == "retry":
            if retries == c.max_retries:
                raise RuntimeError(
                    f"reward server {self.server.url}: {len(ids) - len(got)} of {len(ids)} samples were not scored "
                    f"within {(c.max_retries + 1) * c.timeout_s:g} s (reward.server.timeout_s={c.timeout_s:g} x "
                    f"{c.max_retries + 1} tries); are its clients running? (reward.server.on_timeout=default or "
                    "skip goes on without them)"
                )
            retries += 1
            logger.warning(
                "reward server %s: %d of %d samples not scored yet; waiting again (%d/%d)",
                self.server.url,
                len(ids) - len(got),
                len(ids),
                retries,
                c.max_retries,
            )
            got.update(wait(ids, c.timeout_s))
        missing = np.array([i not in got for i in ids])
        fill = c.default_score if c.on_timeout == "default" else 0.0
        scores = torch.tensor([got.get(i, fill) for i in ids], dtype=torch.float64)
        metrics = {
            "reward/server_scored": float(len(got)),
            "reward/server_missing": float(missing.sum()),
            "reward/server_wait_s": time.perf_counter() - start,
        }
        if preferences:
            metrics["reward/server_preferences"] = float(self.server.preferences_in(ids))
        return scores, missing, metrics


def start_reward_server(cfg: VerlConfig) -> Any:
    """The run's reward server (reward.server): its token from the environment variable token_env, else a random
    one; its URL and (a random) token written to <trainer.output_dir>/reward_server.json, readable by the user."""
    import json
    import os
    import secrets

    from verl.api.reward_server import RewardServer

    s = cfg.reward.server
    token = os.environ.get(s.token_env) or secrets.token_urlsafe(24)
    store = s.store or os.path.join(cfg.trainer.output_dir, "reward_server")
    server = RewardServer(
        store, token=token, host=s.host, port=s.port, max_body_bytes=s.max_body_kb << 10, rate_per_s=s.rate_per_s
    )
    info = os.path.join(cfg.trainer.output_dir, "reward_server.json")
    os.makedirs(cfg.trainer.output_dir, exist_ok=True)
    fd = os.open(info, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": server.url, "token": token if not os.environ.get(s.token_env) else None}, f)
    where = f"token in ${s.token_env}" if os.environ.get(s.token_env) else f"token in {info}"
    print(f"verl: reward server at {server.url} ({where}); store {store}", flush=True)
    return server
