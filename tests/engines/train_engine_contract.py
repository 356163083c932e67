"""The train engine contract (verl.engine_protocol.TrainEngine), checked the same way for every backend on one gloo rank.

A backend's test file imports these tests and defines one module fixture, `backend` (a `Backend`: how to build
its engine from an EngineConfig, and how to tear down its global state). The engines are real, on a small random
Llama; Hugging Face transformers on the same weights is the reference.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from tests.support.engines import free_port, make_llama_dir, random_batch
from verl.config.schema import OptimConfig, ParallelConfig
from verl.engine_protocol import EngineConfig

P, R = 6, 5  # prompt and response lengths of the test batches
LR = 1e-2
TOL = dict(rtol=1e-5, atol=1e-5)  # fp32 on both sides; the kernels differ from transformers' in rounding only


@dataclass
class Backend:
    name: str
    build: Callable[[EngineConfig], Any]  # the engine class, or a function of the config
    teardown: Callable[[], None] = lambda: None  # after the module's tests, before the process group goes


def make(backend: Backend, path: str, *, optim: OptimConfig | None = None, inference: bool = False, **kw) -> Any:
    """An engine on `path` (fp32 on CPU, world of one); AdamW at LR without weight decay unless `optim` is given."""
    optim = None if inference else optim or OptimConfig(lr=LR, weight_decay=0.0)
    kw.setdefault("total_steps", 10)
    return backend.build(EngineConfig(model_path=path, optim=optim, parallel=ParallelConfig(), **kw))


@pytest.fixture(scope="module")
def world(backend):
    """torch.distributed with world size 1 in this process, as a worker has it."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    backend.teardown()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return make_llama_dir(str(tmp_path_factory.mktemp("llama")))


def nll(out, mb):
    mask = mb.batch["response_mask"]
    loss = -(out["log_probs"] * mask).sum() / mask.sum()
    return loss, {"loss": float(loss.detach())}


def nan_loss(out, mb):
    loss, metrics = nll(out, mb)
    return loss * float("nan"), metrics


def weights(engine) -> dict:
    return {name: t.clone() for name, t in engine.weights()}


def hf_outputs(model, batch, temperature: float = 1.0):
    """Per-token log-probs and entropy of `responses` from a transformers causal LM (positions P-1 .. P+R-2)."""
    b = batch.batch
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
    r = b["responses"].shape[1]
    logp = torch.log_softmax(logits.logits[:, -r - 1 : -1].float() / temperature, -1)
    return logp.gather(-1, b["responses"][..., None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def hf_model(path: str, cls=None):
    from transformers import AutoModelForCausalLM

    return (cls or AutoModelForCausalLM).from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


# Runs first, before any test asks for the module's process group.
def test_engine_needs_a_process_group(backend, llama):
    assert not dist.is_initialized()  # first in the module: the world fixture has not run yet
    with pytest.raises(RuntimeError, match="torch.distributed"):
        make(backend, llama)


def test_bad_settings_are_refused_by_name(backend, world, llama):
    with pytest.raises(ValueError, match="model.dtype 'fp8'"):
        make(backend, llama, dtype="fp8")
    with pytest.raises(ValueError, match="model.override_config.no_such_key"):
        make(backend, llama, override_config={"no_such_key": 1})
    with pytest.raises(RuntimeError, match="without an optimizer"):
        make(backend, llama, inference=True).train_step(random_batch(2, 4, 2), nll, micro_batch_size=2)


def test_log_probs_and_entropy_match_transformers(backend, world, llama):
    batch = random_batch(4, P, R, left_pad=3)
    engine = make(backend, llama, inference=True)
    out = engine.infer(batch, micro_batch_size=3, temperature=0.7, entropy=True)  # 3 does not divide 4
    assert out.batch["log_probs"].shape == (4, R) and out.batch["entropy"].shape == (4, R)
    log_probs, entropy = hf_outputs(hf_model(llama), batch, temperature=0.7)
    torch.testing.assert_close(out.batch["log_probs"], log_probs, **TOL)
    torch.testing.assert_close(out.batch["entropy"], entropy, **TOL)
    assert "entropy" not in engine.infer(batch, micro_batch_size=4).batch.keys()


def test_value_model_outputs_one_value_per_response_token(backend, world, llama, tmp_path):
    """kind=value: values [B, R] (the state before each response token), as the exported HF token classifier
    computes them, the same for any micro-batch size; training moves them towards the target."""
    from transformers import AutoModelForTokenClassification

    batch = random_batch(3, P, R, left_pad=2)
    critic = make(backend, llama, kind="value")
    values = critic.infer(batch, micro_batch_size=2).batch["values"]
    assert values.shape == (3, R) and values.dtype == torch.float32
    torch.testing.assert_close(values, critic.infer(batch, micro_batch_size=3).batch["values"], rtol=0, atol=1e-6)
    critic.export_hf(str(tmp_path / "critic"))
    hf = hf_model(str(tmp_path / "critic"), AutoModelForTokenClassification)
    b = batch.batch
    with torch.no_grad():
        out = hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
    torch.testing.assert_close(values, out.logits.squeeze(-1)[:, -R - 1 : -1], **TOL)

    def value_loss(out, mb):
        loss = ((out["values"] - 1.0) ** 2).mean()
        return loss, {"vf_loss": float(loss.detach())}

    losses = [critic.train_step(batch, value_loss, micro_batch_size=2)["vf_loss"] for _ in range(5)]
    assert losses[-1] < losses[0], losses


def test_train_step_reports_and_changes_the_weights(backend, world, llama):
    batch = random_batch(4, P, R, seed=2)
    engine = make(backend, llama)
    before = weights(engine)
    metrics = [engine.train_step(batch, nll, micro_batch_size=2) for _ in range(5)]
    assert metrics[0]["lr"] == pytest.approx(LR) and metrics[0]["grad_norm"] > 0
    assert all("skipped_steps" not in m for m in metrics)
    after = weights(engine)
    assert after.keys() == before.keys() and all(not torch.equal(after[k], before[k]) for k in before)
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.1, [m["loss"] for m in metrics]


def test_micro_batching_does_not_change_the_step(backend, world, llama):
    """One step with 4 micro-batches of 1 equals one step with the whole batch (weighted gradient accumulation)."""
    batch = random_batch(4, P, R, seed=1)
    # eps=1 makes Adam's first update ~ lr * g, so comparing weights compares gradients; with the default eps
    # Adam maps tiny gradients to +-lr and rounding-level gradient differences flip them.
    optim = OptimConfig(lr=LR, eps=1.0, weight_decay=0.0)
    whole, micro = make(backend, llama, optim=optim), make(backend, llama, optim=optim)
    m1 = whole.train_step(batch, nll, micro_batch_size=4)
    m2 = micro.train_step(batch, nll, micro_batch_size=1)
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-6)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    w2 = weights(micro)
    for name, w in whole.weights():
        torch.testing.assert_close(w, w2[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("split", ["rows", "tokens"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_of_unequal_lengths_take_the_whole_batchs_step(backend, world, llama, mode, split):
    """The actor's loss in each aggregation mode, over responses of 1..R tokens split into micro-batches of
    unequal token counts (by rows: 4, then 2; by a budget of 22 tokens: 3 micro-batches of 18, 19 and 19),
    takes the step of one forward over the whole batch; log-probs under the budget are the whole batch's."""
    from verl.config.schema import ActorConfig
    from verl.workers.losses import actor_loss_fn

    batch = random_batch(6, P, R, seed=2)
    b = batch.batch
    for row, length in enumerate([1, 5, 2, 5, 3, 4]):
        b["response_mask"][row, length:] = 0
        b["attention_mask"][row, P + length :] = 0
        b["input_ids"][row, P + length :] = 0
        b["responses"][row, length:] = 0
    b["advantages"] = torch.randn(6, R, generator=torch.Generator().manual_seed(3))
    loss = actor_loss_fn(ActorConfig(ppo_mini_batch_size=1, loss_agg_mode=mode))
    optim = OptimConfig(lr=LR, eps=1.0, weight_decay=0.0)  # eps=1: weights compare gradients (see above)
    whole, micro = make(backend, llama, optim=optim), make(backend, llama, optim=optim)
    cut = {"micro_batch_size": 4} if split == "rows" else {"micro_batch_size": 1, "max_tokens": 2 * (P + R)}
    real = b["response_mask"].bool()
    lp1 = whole.infer(batch, micro_batch_size=6).batch["log_probs"][real]
    lp2 = micro.infer(batch, **cut).batch["log_probs"][real]
    torch.testing.assert_close(lp2, lp1, **TOL)
    m1 = whole.train_step(batch, loss, micro_batch_size=6)
    m2 = micro.train_step(batch, loss, **cut)
    if split == "tokens":
        assert m2["micro_batches"] == 3.0
    assert m1["pg_loss"] == pytest.approx(m2["pg_loss"], rel=1e-5, abs=1e-7)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    w2 = weights(micro)
    for name, w in whole.weights():
        torch.testing.assert_close(w, w2[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_non_finite_gradient_skips_the_step(backend, world, llama):
    batch = random_batch(4, P, R, seed=5)
    engine = make(backend, llama)
    before = weights(engine)
    skipped = engine.train_step(batch, nan_loss, micro_batch_size=2)
    assert skipped["skipped_steps"] == 1.0 and not math.isfinite(skipped["grad_norm"])
    assert all(torch.equal(t, before[name]) for name, t in engine.weights())
    # The next step is a normal one (no poisoned optimizer state), one position further along the schedule.
    ok = engine.train_step(batch, nll, micro_batch_size=2)
    assert "skipped_steps" not in ok and math.isfinite(ok["grad_norm"])
    assert all(torch.isfinite(t).all() and not torch.equal(t, before[name]) for name, t in engine.weights())


def test_lr_follows_warmup_then_cosine_over_total_steps(backend, world, llama):
    optim = OptimConfig(lr=LR, weight_decay=0.0, warmup_steps=2, scheduler="cosine", min_lr_ratio=0.1)
    engine = make(backend, llama, optim=optim, total_steps=6)
    batch = random_batch(2, P, R, seed=3)
    lrs = [engine.train_step(batch, nll, micro_batch_size=2)["lr"] for _ in range(7)]

    def cosine(progress):  # from 1.0 down to min_lr_ratio over the 4 steps after warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    want = [0.5, 1.0, cosine(0), cosine(0.25), cosine(0.5), cosine(0.75), 0.1]  # step 6: past the end, the floor
    assert lrs == pytest.approx([LR * m for m in want], rel=1e-12)


def test_checkpoint_resumes_bit_exactly(backend, world, llama, tmp_path):
    """The step after loading a checkpoint equals the step taken without saving and loading: weights, Adam moments,
    the step count (warmup makes the lr depend on it) and the RNG all come back, into a fresh or a used engine."""
    optim = OptimConfig(lr=LR, weight_decay=0.0, warmup_steps=3)
    batch = random_batch(4, P, R, seed=4, left_pad=2)
    trained = make(backend, llama, optim=optim)
    trained.train_step(batch, nll, micro_batch_size=2)
    trained.save_checkpoint(str(tmp_path / "ckpt"))
    want = trained.train_step(batch, nll, micro_batch_size=2)
    want_weights = weights(trained)
    assert want["lr"] == pytest.approx(LR * 2 / 3)

    fresh = make(backend, llama, optim=optim)  # as in a new process
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    trained.load_checkpoint(str(tmp_path / "ckpt"))  # over its own later state
    for engine in (fresh, trained):
        assert engine.train_step(batch, nll, micro_batch_size=2) == want
        assert all(torch.equal(t, want_weights[name]) for name, t in engine.weights())


def test_offload_between_phases_keeps_every_result(backend, world, llama, tmp_path):
    """param_offload + optimizer_offload: the optimizer state leaves the device after each step, the parameters on
    release_memory(); every call brings back what it needs, so steps, outputs, weights and checkpoints are those of
    an engine that keeps everything resident (bitwise)."""
    batch = random_batch(4, P, R, seed=5, left_pad=1)
    plain = make(backend, llama)
    away = make(backend, llama, param_offload=True, optimizer_offload=True)
    for _ in range(2):
        assert away.train_step(batch, nll, micro_batch_size=2) == plain.train_step(batch, nll, micro_batch_size=2)
        assert away.optim_away.away.nbytes > 0  # Adam's moments are in host memory between steps
        away.release_memory()
        assert away.params_away.away.nbytes >= sum(t.numel() * 4 for _, t in plain.weights())
    got, want = (e.infer(batch, micro_batch_size=2).batch["log_probs"] for e in (away, plain))
    assert torch.equal(got, want)
    away.release_memory()
    assert all(torch.equal(t, w) for (_, t), (_, w) in zip(away.weights(), plain.weights()))
    away.release_memory()
    away.save_checkpoint(str(tmp_path / "ckpt"))  # state away on both counts: the save brings it back
    resumed = make(backend, llama, param_offload=True, optimizer_offload=True)
    resumed.release_memory()
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    want = plain.train_step(batch, nll, micro_batch_size=2)
    assert resumed.train_step(batch, nll, micro_batch_size=2) == want
    assert away.train_step(batch, nll, micro_batch_size=2) == want


def test_weights_are_the_models_in_hugging_face_names(backend, world, llama):
    engine = make(backend, llama)
    ref = dict(hf_model(llama).named_parameters())
    got = weights(engine)
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in ref.items()}
    assert all(torch.equal(got[k], ref[k].detach()) for k in ref)
    assert engine.sync_received_bytes() >= 0  # declared by every engine (0 where nothing is counted)


def test_export_hf_loads_in_transformers_with_equal_log_probs(backend, world, llama, tmp_path):
    batch = random_batch(4, P, R, left_pad=1)
    engine = make(backend, llama)
    engine.train_step(batch, nll, micro_batch_size=2)
    out = str(tmp_path / "hf")
    engine.export_hf(out)
    assert os.path.exists(os.path.join(out, "model.safetensors"))
    exported = hf_model(out)
    params = dict(exported.named_parameters())
    for name, w in engine.weights():
        assert torch.equal(params[name], w), name
    log_probs, _ = hf_outputs(exported, batch)
    torch.testing.assert_close(engine.infer(batch, micro_batch_size=4).batch["log_probs"], log_probs, **TOL)
