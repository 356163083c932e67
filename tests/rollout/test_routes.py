"""Routing replay R3's column in the rollout batch: vLLM's per-sample routes ([tokens, layers, k] over each sample's
unpadded prompt and generated tokens) placed where the batch holds those tokens. The hf rollout's hooks are tested
with the megatron actor that replays them (tests/megatron/test_moe.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl_rollout.routes import place_routes


def test_each_samples_routes_land_on_its_tokens_in_the_left_padded_layout():
    layers, k = 3, 2
    short = np.arange(2 * layers * k).reshape(2, layers, k)  # a 1-token prompt and 1 token fed back
    long = 100 + np.arange(6 * layers * k).reshape(6, layers, k)  # a 3-token prompt, 3 fed back (one past the width)
    out = place_routes([short, long], prompt_lengths=[1, 3], prompt_width=3, width=2)
    assert out.shape == (2, 5, layers, k) and out.dtype == torch.int16
    assert bool((out[0, :2] == -1).all()) and torch.equal(out[0, 2:4], torch.from_numpy(short).to(torch.int16))
    assert bool((out[0, 4] == -1).all())  # (the last generated token is never fed: nothing routed it)
    assert torch.equal(out[1], torch.from_numpy(long[:5]).to(torch.int16))  # (cut at the batch's width)


def test_a_sample_without_routes_is_an_error_that_says_why():
    with pytest.raises(RuntimeError, match="1 of 2 samples came back without their routed experts"):
        place_routes([np.zeros((2, 1, 1)), None], prompt_lengths=[1, 1], prompt_width=1, width=1)
