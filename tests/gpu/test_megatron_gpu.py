"""The megatron engine on CUDA: the CPU parity tests' checks on GPU, and a few GRPO steps with timing.

Skipped without CUDA. On one GPU: log-probs (TP=1) against the HF model, HF -> mcore -> HF exactness, one
training step; then `recipes:grpo_tiny_megatron` at TP=1 on that GPU for a few steps, its step time printed
and written to $VERL_GPU_RESULTS (a JSON file) when set; a few bf16 steps (the dtype GPU runs train in). With two
or more GPUs the TP=2 (with and without sequence parallelism), PP=2 and CP=2 parity checks run too. A mixture of
experts: log-probs against HF in float32 and bf16 (router in float32), a few steps of `recipes:grpo_tiny_moe`
(plain and with routing replay R3), and EP=2 over two GPUs.
TransformerEngine's layers are used when the package is installed (the engine picks them itself).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# GPU float32 matmuls and attention kernels differ from HF's in reduction order (and TF32 may be on in
# TransformerEngine's GEMMs): looser than the CPU bound of 1e-5.
LOGPROB_ATOL = 1e-3
BF16_LOGPROB_ATOL = 0.1  # bf16 weights and activations against the float32 HF model


def _single_gpu_world():
    import torch.distributed as dist

    from tests.support.engines import free_port

    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.support.megatron_workers import random_model_dir

    return random_model_dir(str(tmp_path_factory.mktemp("qwen2")), "qwen2", tie=False, layers=4, vocab=64)


def _nll(out, mb):
    mask = mb.batch["response_mask"]
    loss = -(out["log_probs"] * mask).sum() / mask.sum()
    return loss, {"nll": float(loss)}


def _one_gpu_engine(model_dir: str, dtype: str, **kw):
    """A megatron actor (TP=1, AdamW) on this process's GPU."""
    from verl.config.schema import OptimConfig
    from verl.engine_protocol import EngineConfig
    from verl_megatron.engine import MegatronEngine

    _single_gpu_world()
    parallel = types.SimpleNamespace(tp=1, pp=1, vpp=None, cp=1, ep=1, dp=None)
    cfg = EngineConfig(
        model_path=model_dir,
        device="cuda",
        dtype=dtype,
        parallel=parallel,
        optim=OptimConfig(lr=1e-3),
        total_steps=3,
        **kw,
    )
    return MegatronEngine(cfg)


def test_tp1_log_probs_round_trip_and_a_step_on_one_gpu(model_dir):
    from safetensors.torch import load_file

    from tests.support.megatron_workers import check_log_probs, parity_batch

    engine = _one_gpu_engine(model_dir, "float32")
    print(f"TransformerEngine layers: {engine.te}")
    original = load_file(f"{model_dir}/model.safetensors")
    weights = {k: v.cpu() for k, v in engine.weights()}
    assert weights.keys() == original.keys()
    assert all(torch.equal(weights[k], original[k]) for k in original)

    batch = parity_batch(vocab=64)
    got = engine.infer(batch, micro_batch_size=2).batch["log_probs"]
    diff = check_log_probs([{"log_probs": got}], model_dir, batch, atol=LOGPROB_ATOL)
    print(f"GPU TP=1: max |log-prob - HF| = {diff:.2e}")

    first = engine.train_step(batch, _nll, micro_batch_size=2)
    second = engine.train_step(batch, _nll, micro_batch_size=2)
    assert second["nll"] < first["nll"]


def test_bf16_steps_on_one_gpu(model_dir):
    """The dtype GPU runs train in: bfloat16 parameters and compute, float32 log-probs out."""
    from tests.support.megatron_workers import parity_batch

    engine = _one_gpu_engine(model_dir, "bfloat16")
    batch = parity_batch(vocab=64)
    out = engine.infer(batch, micro_batch_size=2, entropy=True).batch
    assert out["log_probs"].dtype == torch.float32 and bool(torch.isfinite(out["log_probs"]).all())
    assert bool((out["entropy"] > 0).all())

    metrics = [engine.train_step(batch, _nll, micro_batch_size=2) for _ in range(3)]
    print(f"GPU bf16: nll {[round(m['nll'], 4) for m in metrics]}")
    assert metrics[-1]["nll"] < metrics[0]["nll"] and all(math.isfinite(m["grad_norm"]) for m in metrics)


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is None, reason="needs TransformerEngine")
def test_thd_rows_match_padded_rows_with_transformer_engine(model_dir):
    """TransformerEngine's attention over the packed THD layout (the engine's choice with TE and shared_prefix):
    log-probs of a GRPO-shaped batch match the padded rows', and only real tokens are computed."""
    from tests.support.engines import grouped_batch

    batch = grouped_batch(prompts=3, n=4, vocab=64)
    valid = batch.batch["response_mask"].bool()
    padded = _one_gpu_engine(model_dir, "float32", shared_prefix=False)
    thd = _one_gpu_engine(model_dir, "float32")
    assert thd.te and thd.thd
    a = padded.infer(batch, micro_batch_size=6).batch["log_probs"]
    b = thd.infer(batch, micro_batch_size=6).batch["log_probs"]
    worst = (a - b)[valid].abs().max().item()
    print(f"GPU THD vs padded rows (TransformerEngine): max |log-prob difference| = {worst:.2e}")
    assert worst < LOGPROB_ATOL
    metrics = thd.train_step(batch, _nll, micro_batch_size=6)
    real = int(batch.batch["attention_mask"].sum())
    assert metrics["computed_tokens_ratio"] == pytest.approx(real / batch.batch["input_ids"].numel())


def test_grpo_tiny_megatron_steps_on_one_gpu(tmp_path):
    """A few GRPO steps of the tiny recipe at TP=1 on the GPU; step time recorded."""
    from tests.support.run_configs import RECIPES

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    steps = 5
    cmd = [
        sys.executable,
        "-m",
        "verl.cli",
        "train",
        str(RECIPES / "grpo_tiny_megatron.yaml"),
        "placement.device=cuda",
        "placement.devices_per_node=1",
        "actor.parallel.tp=1",
        f"trainer.total_steps={steps}",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.resume=disable",
        f"trainer.output_dir={tmp_path}",
        "tracking.loggers=[jsonl]",
        "model.warm_start=null",  # step time is the point here, not what the steps learn
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = [json.loads(line) for f in glob.glob(f"{tmp_path}/logs/*.jsonl") for line in open(f)]
    timed = [r for r in rows if "timing/step_s" in r]
    assert len(timed) == steps
    later = [r["timing/step_s"] for r in timed[1:]]  # the first step includes warm-up
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "steps": steps,
        "step_s_mean_after_first": sum(later) / len(later),
        "step_s": [r["timing/step_s"] for r in timed],
        "weight_sync_s": [r.get("timing/weight_sync_s") for r in timed],
    }
    print(json.dumps(result))
    if os.environ.get("VERL_GPU_RESULTS"):
        with open(os.environ["VERL_GPU_RESULTS"], "w") as f:
            json.dump(result, f, indent=2)


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    """head_dim 64: TransformerEngine's flash/fused attention kernels (the ones that do CP) need a multiple of 8."""
    from tests.support.megatron_workers import random_model_dir

    return random_model_dir(str(tmp_path_factory.mktemp("wide")), "qwen2", tie=False, layers=4, vocab=64, hidden=256)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="TP=2 / PP=2 / CP=2 parity needs two GPUs")
@pytest.mark.parametrize(
    "parallel, dtype, atol",
    [
        ({"tp": 2, "sequence_parallel": False}, "float32", LOGPROB_ATOL),
        ({"tp": 2}, "float32", LOGPROB_ATOL),
        ({"pp": 2}, "float32", LOGPROB_ATOL),
        # TransformerEngine runs context parallelism in its fp16/bf16 attention kernels only: bf16 rounding.
        ({"cp": 2}, "bfloat16", BF16_LOGPROB_ATOL),
    ],
    ids=["tp2", "tp2-sp", "pp2", "cp2-bf16"],
)
def test_two_gpu_log_probs_match_hf(wide_model_dir, parallel, dtype, atol):
    worst = _two_gpu_log_prob_diff(wide_model_dir, parallel, dtype, atol)
    print(f"GPU {parallel}: max |log-prob - HF| = {worst:.2e}")


def _two_gpu_log_prob_diff(model_dir: str, parallel: dict, dtype: str, atol: float) -> float:
    """The model in `parallel` over two GPUs (Ray workers, NCCL): its log-probs' largest difference from HF's."""
    import ray

    from tests.support.megatron_workers import EngineWorker, check_log_probs, parity_batch
    from verl.controller import ResourcePool, init_ray, make_worker_group

    ray.cloudpickle.register_pickle_by_value(sys.modules["tests.support.megatron_workers"])
    init_ray(num_gpus=2)
    pool = ResourcePool("megatron", nnodes=1, devices_per_node=2, device="cuda")
    group = make_worker_group("ray", pool, EngineWorker, parallel, role="megatron")
    try:
        group.call("load", "m", model_dir, dtype=dtype)
        batch = parity_batch(vocab=64)
        return check_log_probs(group.call("infer", "m", batch), model_dir, batch, atol=atol)
    finally:
        group.shutdown()
        pool.remove()
        ray.shutdown()


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    """A Qwen3-MoE (4 experts, top-2, one dense layer) wide enough for TransformerEngine's grouped GEMM."""
    from tests.support.megatron_workers import random_model_dir

    path = str(tmp_path_factory.mktemp("qwen3_moe"))
    return random_model_dir(
        path, "qwen3_moe", tie=False, layers=4, vocab=64, hidden=128, head_dim=32, moe_intermediate_size=64
    )


@pytest.mark.parametrize("dtype, atol", [("float32", LOGPROB_ATOL), ("bfloat16", BF16_LOGPROB_ATOL)])
def test_moe_log_probs_and_a_step_on_one_gpu(moe_dir, dtype, atol):
    """A mixture of experts on one GPU (grouped GEMM experts when TransformerEngine is installed), the router in
    float32 whatever the dtype: HF's log-probs, and steps that lower the loss."""
    from tests.support.megatron_workers import check_log_probs, parity_batch

    engine = _one_gpu_engine(moe_dir, dtype)
    assert engine.config.moe_router_dtype == "fp32"
    batch = parity_batch(vocab=64)
    got = engine.infer(batch, micro_batch_size=2).batch["log_probs"]
    diff = check_log_probs([{"log_probs": got}], moe_dir, batch, atol=atol)
    metrics = [engine.train_step(batch, _nll, micro_batch_size=2) for _ in range(3)]
    print(f"GPU MoE {dtype} (TE: {engine.te}): max |log-prob - HF| = {diff:.2e}, nll {[m['nll'] for m in metrics]}")
    assert metrics[-1]["nll"] < metrics[0]["nll"] and metrics[0]["moe/load_max"] >= 1.0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="expert parallelism needs two GPUs")
@pytest.mark.parametrize("dtype, atol", [("float32", LOGPROB_ATOL), ("bfloat16", BF16_LOGPROB_ATOL)])
def test_two_gpu_expert_parallel_log_probs_match_hf(moe_dir, dtype, atol):
    """EP=2 over NCCL (tokens all-to-all between the GPUs): HF's log-probs."""
    worst = _two_gpu_log_prob_diff(moe_dir, {"ep": 2}, dtype, atol)
    print(f"GPU EP=2 {dtype}: max |log-prob - HF| = {worst:.2e}")


@pytest.mark.parametrize("replay", ["none", "r3"])
def test_grpo_tiny_moe_steps_on_one_gpu(tmp_path, replay):
    """A few GRPO steps of the tiny mixture-of-experts recipe (EP=1) on the GPU, and with routing replay R3 (the hf
    rollout's experts replayed by the actor: the routing agreement and the trainer/rollout log-prob gap printed);
    step time printed."""
    from tests.support.run_configs import RECIPES

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    cmd = [sys.executable, "-m", "verl.cli", "train", str(RECIPES / "grpo_tiny_moe.yaml"), "placement.device=cuda"]
    cmd += ["placement.devices_per_node=1", "actor.parallel.ep=1", "trainer.total_steps=5", "trainer.val_every=0"]
    cmd += ["trainer.val_before_train=false", "trainer.resume=disable", f"trainer.output_dir={tmp_path}"]
    cmd += ["tracking.loggers=[jsonl]", "model.warm_start=null", f"actor.routing_replay={replay}"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = [json.loads(line) for f in glob.glob(f"{tmp_path}/logs/*.jsonl") for line in open(f)]
    timed = [r for r in rows if "timing/step_s" in r]
    assert len(timed) == 5 and all("actor/moe/load_max" in r for r in timed)
    report = {"gpu": torch.cuda.get_device_name(0), "replay": replay, "moe_step_s": [r["timing/step_s"] for r in timed]}
    if replay == "r3":
        assert all(r["actor/moe/routes_replayed"] == 1.0 for r in timed)
        report["routing_agreement"] = [r["actor/moe/routing_agreement"] for r in timed]
        report["logprob_diff_max"] = [r.get("rollout/logprob_diff_max") for r in timed]
    print(json.dumps(report))
