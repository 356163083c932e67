"""The `verl` command with the megatron backend: the 8B recipe's model built on the meta device and counted, and
`verl export` turning a TP=2 x PP=2 training checkpoint (and a mixture of experts' EP=2 x PP=2 one) into a Hugging
Face folder.

The CLI runs in a child process (as a user runs it): the model check starts a fake process group, and export a
world of one, which must not meet this test process's own torch.distributed state.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import ray
import torch

from tests.support.megatron_workers import EngineWorker
from tests.support.run_configs import RECIPES
from verl.config.schema import OptimConfig
from verl.controller import ResourcePool, make_worker_group
from verl.protocol import DataProto

pytestmark = pytest.mark.slow  # the fast tier skips this file (tagged "slow" in tests/BUILD too)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(sys.modules["tests.support.megatron_workers"])

# Meta-Llama-3-8B's published architecture (its config.json, no weights).
LLAMA3_8B = RECIPES / "model_configs" / "Meta-Llama-3-8B"
# Qwen3-30B-A3B's published architecture (a mixture of experts: 128 experts, top 8).
QWEN3_30B_A3B = RECIPES / "model_configs" / "Qwen3-30B-A3B"
QWEN2_7B = RECIPES / "model_configs" / "Qwen2-7B"
QWEN3_0_6B = RECIPES / "model_configs" / "Qwen3-0.6B"


def _verl(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "verl.cli", *argv], env=env, capture_output=True, text=True, timeout=600
    )


def test_llama3_8b_recipe_builds_its_megatron_model_and_counts_it():
    out = _verl("train", str(RECIPES / "grpo_llama3_8b.yaml"), "--dry-run", f"model.path={LLAMA3_8B}")
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout[out.stdout.index("# model") :])
    # HF count: embed + lm_head 2 * 128256 * 4096 = 1,050,673,152; per layer q/o 2 * 4096^2 = 33,554,432,
    # k/v 2 * 1024 * 4096 = 8,388,608, MLP 3 * 4096 * 14336 = 176,160,768, norms 2 * 4096 = 8,192
    # -> 218,112,000 x 32 = 6,979,584,000; final norm 4,096. Total 8,030,261,248.
    assert "actor: parameters: 8,030,261,248 (8.03 B)" in out.stdout
    # Per rank at TP=4, PP=2 (16 layers a stage): a layer holds a quarter of its matrices, 218,103,808 / 4 =
    # 54,525,952, plus both norms whole, 8,192 -> 54,534,144; x 16 = 872,546,304. Stage 0 adds a quarter of
    # the embedding (131,334,144), stage 1 the final norm (4,096) and a quarter of lm_head (131,334,144).
    assert "TP=4 PP=2; parameters per rank: stage 0: 1,003,880,448, stage 1: 1,003,884,544" in out.stdout


def test_llama3_8b_recipe_prints_its_memory_by_phase_and_fits_an_h100():
    """The table: every phase of the hybrid pool on its busiest rank, vLLM's share of the device in generation,
    the actor update's activations and logits; the peak checked against the recipe's accelerator (h100)."""
    out = _verl("validate", str(RECIPES / "grpo_llama3_8b.yaml"), f"model.path={LLAMA3_8B}")
    assert out.returncode == 0, out.stderr[-3000:]
    section = out.stdout[out.stdout.index("# memory") :]
    print(section)
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ")}
    assert {"generate", "actor log-probs", "ref log-probs", "actor update"} <= rows.keys()
    assert "rollout (vllm, 0.6 of the device)" in rows["phase"]
    # the state (megatron's buffers, tested byte for byte on CPU): 1.870 + 3.740 + 5.610 GiB and the ref's 1.870
    assert "| 1.87 | 3.74 | 5.61 | 1.87 |" in rows["actor update"]
    assert "peak: generate on pool 'hybrid', 60.609 GiB of 79.200 GiB per device" in section


def test_a_peak_that_does_not_fit_is_refused_with_overrides_that_fit():
    """16 GB devices: validate exits 2 naming the phase, the rank and the key; the overrides it names validate."""
    out = _verl(
        "validate", str(RECIPES / "grpo_llama3_8b.yaml"), f"model.path={LLAMA3_8B}", "placement.device_memory_gb=16"
    )
    assert out.returncode == 2, out.stdout[-2000:]
    error = next(line for line in out.stderr.splitlines() if line.startswith("error: placement.device_memory_gb"))
    assert "actor update needs ~30.424 GiB on rank 8 (pool 'hybrid'), more than the 16.000 GiB" in error
    fix = out.stderr.split(error, 1)[1].splitlines()[1].removeprefix("    fix: ")
    print(error, fix, sep="\n")
    overrides = [f"{key}={new}" for key, new in re.findall(r"(\S+) \S+ -> ([^,\s]+)", fix.split(" or ")[0])]
    assert overrides
    fixed = _verl(
        "validate",
        str(RECIPES / "grpo_llama3_8b.yaml"),
        f"model.path={LLAMA3_8B}",
        "placement.device_memory_gb=16",
        *overrides,
    )
    assert fixed.returncode == 0, fixed.stderr[-3000:]


@pytest.mark.parametrize(
    "recipe, model",
    [("grpo_llama3_8b", LLAMA3_8B), ("ppo_qwen2_7b", QWEN2_7B), ("grpo_qwen3_0_6b", QWEN3_0_6B)],
)
def test_every_suggested_layout_validates(recipe, model, capsys):
    """`verl plan --suggest` on the recipe's accelerator (h100): each layout it lists, as its overrides, passes
    `verl validate` with its memory check (exit 0; run in this process: one import of megatron for them all)."""
    from verl import cli

    path = str(RECIPES / f"{recipe}.yaml")
    out = _verl("plan", path, f"model.path={model}", "--suggest")
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    listed = out.stdout[out.stdout.index("# layouts") :]
    print(listed)
    assert "throughput model: 989.4 TFLOP/s at 40% MFU" in listed
    # each listed layout's overrides (none: the recipe as it is)
    suggestions = [
        [] if "(the recipe" in line else line.split() for line in listed.splitlines() if line.startswith("   ")
    ]
    assert suggestions
    capsys.readouterr()
    for overrides in suggestions:
        code = cli.main(["validate", path, f"model.path={model}", *overrides])
        checked = capsys.readouterr()
        assert code == 0, (overrides, checked.err[-3000:])
        assert "peak: " in checked.out


def test_qwen3_30b_a3b_recipe_lays_out_its_experts_and_counts_them():
    out = _verl("train", str(RECIPES / "grpo_qwen3_30b_a3b.yaml"), "--dry-run", f"model.path={QWEN3_30B_A3B}")
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout[out.stdout.index("# model") :])
    # HF count: embed + lm_head 2 * 151936 * 2048 = 622,329,856; per layer attention q/o 2 * 4096 * 2048 =
    # 16,777,216, k/v 2 * 512 * 2048 = 2,097,152, q/k norms 2 * 128, router 128 * 2048 = 262,144, norms
    # 2 * 2048, experts 128 * 3 * 768 * 2048 = 603,979,776 -> 623,120,640 x 48 = 29,909,790,720; final norm 2,048.
    assert "actor: parameters: 30,532,122,624 (30.53 B)" in out.stdout
    # Active: 120 of 128 experts skipped per layer, 120 * 4,718,592 * 48 = 27,179,089,920 fewer.
    assert (
        "top 8; active per token: 3,353,032,704 (3.35 B); EP=8 x ETP=1: 16 experts of each routed layer" in out.stdout
    )
    # Per rank at EP=8, TP=1: everything dense (30,532,122,624 - 48 * 603,979,776 = 1,541,093,376) plus 16 experts
    # of each layer, 16 * 4,718,592 * 48 = 3,623,878,656.
    assert "EP=8 ETP=1; parameters per rank: stage 0: 5,164,972,032 (1,541,093,376 dense + 3,623,878,656 experts)" in (
        out.stdout
    )


def test_a_model_megatron_cannot_build_is_a_validation_error(tmp_path):
    config = json.loads((LLAMA3_8B / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "mlp_bias": True}))
    out = _verl("validate", str(RECIPES / "grpo_llama3_8b.yaml"), f"model.path={tmp_path}")
    assert out.returncode == 2
    assert "error: model.path: actor (megatron) cannot build" in out.stderr and "mlp_bias=true" in out.stderr


def _batch(vocab: int, rows: int = 4, prompt: int = 5, response: int = 3) -> DataProto:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": mask.cumsum(-1) - 1,
            "responses": ids[:, prompt:],
            "response_mask": torch.ones(rows, response, dtype=torch.long),
        }
    )


@pytest.mark.parametrize(
    "name, layout",
    [("tiny-llama", {"tp": 2, "pp": 2}), ("tiny-qwen3-moe", {"ep": 2, "pp": 2})],  # the MoE: experts split in two
    ids=["tp2-pp2", "moe-ep2-pp2"],
)
def test_export_reshards_a_checkpoint_into_hf(ray_two_cpus, tmp_path, embedded_cache, name, layout):
    from safetensors.torch import load_file

    from verl.embedded.models import materialize_embedded_model

    model = materialize_embedded_model(name, embedded_cache)
    pool = ResourcePool("megatron", nnodes=1, devices_per_node=4, cpus_per_device=0.5)
    group = make_worker_group("ray", pool, EngineWorker, layout, role="actor", env={"OMP_NUM_THREADS": "1"})
    try:
        group.call("load", "actor", model, OptimConfig(lr=1e-2, weight_decay=0.0))
        group.call("train", "actor", _batch(vocab=83))  # weights that differ from the HF folder it started from
        trained = group.call("hf_weights", "actor")[0]
        group.call("save", "actor", str(tmp_path / "ckpt"))
    finally:
        group.shutdown()
        pool.remove()
    out = _verl("export", str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"verl export: {len(trained)} tensors" in out.stdout
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    original = load_file(f"{model}/model.safetensors")
    assert exported.keys() == trained.keys() == original.keys()
    for key in trained:
        assert torch.equal(exported[key], trained[key]), key  # bitwise: resharding moves bytes, never rounds
    assert not torch.equal(exported["model.norm.weight"], original["model.norm.weight"])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(tmp_path / "hf"))


def test_export_refuses_what_is_not_a_megatron_checkpoint(tmp_path):
    out = _verl("export", str(tmp_path), str(tmp_path / "hf"))
    assert out.returncode == 2 and "names no backend (no verl_<backend>.json)" in out.stderr
    out = _verl("export", str(tmp_path), str(tmp_path / "hf"), "--backend", "megatron")
    assert out.returncode == 2 and "is not a checkpoint of the megatron engine" in out.stderr
    out = _verl("export", str(tmp_path), str(tmp_path / "hf"), "--backend", "fsdp")
    assert out.returncode == 2 and "is not a checkpoint of the fsdp engine" in out.stderr
    out = _verl("export", str(tmp_path), str(tmp_path / "hf"), "--backend", "megatron", "--model", str(tmp_path))
    assert out.returncode == 2 and "--model: a megatron checkpoint holds every weight" in out.stderr
