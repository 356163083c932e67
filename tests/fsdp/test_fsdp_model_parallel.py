"""The fsdp engine split over two gloo ranks by tensor parallelism (parallel.tp=2: the model's declared plan on its
decoder layers) or Ulysses sequence parallelism (parallel.cp=2): log-probs, entropy and values within 1e-5 of one
rank, and one optimizer step within 1e-6, on packed (shared-prefix) and padded rows; each rank holds what the
memory model says."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from tests.support.fixtures import embedded_cache, tiny_vlm_dir  # noqa: F401
from tests.support.fsdp_ranks import VOCAB, run_image_ranks, run_ranks
from tests.support.image_batches import image_batch
from tests.support.megatron_workers import random_model_dir
from verl_fsdp.memory_model import state_bytes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> str:
    """Qwen3: per-head q/k norms (replicated, gradients summed over tp ranks), a head_dim of its own."""
    return random_model_dir(str(tmp_path_factory.mktemp("qwen3")), "qwen3", tie=False, layers=2, vocab=VOCAB)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory) -> str:
    """Qwen2: q/k/v biases (split with their projections), tied embeddings."""
    return random_model_dir(str(tmp_path_factory.mktemp("qwen2")), "qwen2", tie=True, layers=2, vocab=VOCAB)


_REFERENCE: dict = {}


def _reference(path: str, packed: bool) -> dict:
    if (path, packed) not in _REFERENCE:
        _REFERENCE[path, packed] = run_ranks(1, path, {}, packed)[0]
    return _REFERENCE[path, packed]


@pytest.mark.parametrize(
    "model, parallel, packed",
    [
        ("qwen3", dict(tp=2), True),
        ("qwen3", dict(tp=2), False),
        ("qwen2", dict(tp=2), True),  # (its biases and tied head; padded rows change nothing tp does)
        ("qwen3", dict(cp=2), True),
        ("qwen3", dict(cp=2), False),
    ],
    ids=["qwen3-tp2-packed", "qwen3-tp2-padded", "qwen2-tp2-packed", "qwen3-cp2-packed", "qwen3-cp2-padded"],
)
def test_two_ranks_equal_one(request, tmp_path, model, parallel, packed):
    path = request.getfixturevalue(model)
    want = _reference(path, packed)
    got = run_ranks(2, path, parallel, packed, ckpt=str(tmp_path / "ckpt") if packed else "")
    if packed:
        assert got[0]["resumed"] and got[1]["resumed"]
    assert [got[r]["info"] for r in (0, 1)] == [(0, 1, True), (0, 1, False)]  # one data-parallel replica
    assert got[0]["in_place"] == ("tp" not in parallel)  # a tp module cannot generate rank by rank
    for rank in (0, 1):  # every rank computes the whole rows (the driver reads rank 0's)
        for key in ("log_probs", "entropy", "values"):
            torch.testing.assert_close(got[rank][key], want[key], rtol=0, atol=1e-5, msg=f"{key} on rank {rank}")
        m, w = got[rank]["metrics"], want["metrics"]
        assert m["loss"] == pytest.approx(w["loss"], rel=1e-6, abs=1e-7)
        assert m["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-5)
        assert got[rank]["weights"].keys() == want["weights"].keys()
        for name, expected in want["weights"].items():
            torch.testing.assert_close(got[rank]["weights"][name], expected, rtol=0, atol=1e-6, msg=name)
    # what rank 0 holds is what the memory model says before launch (tp: the plan's pieces; cp: FSDP over both)
    estimate = state_bytes(AutoConfig.from_pretrained(path), {**parallel, "dp": 1})[0].as_dict()
    assert got[0]["held"] == estimate
    assert estimate["params"] < state_bytes(AutoConfig.from_pretrained(path), {"dp": 1})[0].params * 0.75
    initial = load_file(os.path.join(path, "model.safetensors"))
    assert all(not torch.equal(want["weights"][name], t) for name, t in initial.items())  # the step moved them all


def test_fsdp_over_tensor_parallel_on_four_ranks_equals_one(qwen3):
    """dp=2 x tp=2: FSDP2 shards the tp pieces over the dp ranks (2-D DTensors beside 1-D ones: the gradient norm
    adds each kind over the ranks that split it). Every dp replica takes the whole batch here, so their averaged
    gradient is the one-rank gradient."""
    want = _reference(qwen3, True)
    got = run_ranks(4, qwen3, dict(tp=2), True)
    assert [got[r]["info"] for r in range(4)] == [(0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)]
    for rank in range(4):
        torch.testing.assert_close(got[rank]["log_probs"], want["log_probs"], rtol=0, atol=1e-5)
        assert got[rank]["metrics"]["grad_norm"] == pytest.approx(want["metrics"]["grad_norm"], rel=1e-5)
        for name, expected in want["weights"].items():
            torch.testing.assert_close(got[rank]["weights"][name], expected, rtol=0, atol=1e-6, msg=name)


def test_image_prompts_on_two_data_parallel_ranks_equal_one(tiny_vlm_dir, embedded_cache):  # noqa: F811
    """The tiny Qwen2.5-VL sharded over two ranks, each with half the rows (images and a text row): log-probs within
    1e-5 and the step's weights within 1e-6 of one rank holding them all."""
    batch = image_batch(tiny_vlm_dir, embedded_cache)
    (want,) = run_image_ranks(1, tiny_vlm_dir, batch).values()
    got = run_image_ranks(2, tiny_vlm_dir, batch)
    log_probs = torch.cat([got[0]["log_probs"], got[1]["log_probs"]])
    torch.testing.assert_close(log_probs, want["log_probs"], rtol=0, atol=1e-5)
    for rank in (0, 1):
        assert got[rank]["metrics"]["grad_norm"] == pytest.approx(want["metrics"]["grad_norm"], rel=1e-5)
        for name, expected in want["weights"].items():
            torch.testing.assert_close(got[rank]["weights"][name], expected, rtol=0, atol=1e-6, msg=name)
