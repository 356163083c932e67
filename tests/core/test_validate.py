"""Config validation: every problem at once, each with its key, its numbers and a fix."""

from __future__ import annotations

import importlib.util

import pytest
from omegaconf import OmegaConf

from tests.support.fixtures import make_cfg
from verl.backends import BackendSpec
from verl.config import layout_checks
from verl.config.schema import VerlConfig
from verl.config.validate import validate, validate_and_plan

# Every backend installed, none needing a third-party module (so the tests do not depend on the path),
# except sglang, whose library is not installed here.
INSTALLED = {
    "fsdp": BackendSpec("fsdp", "train", "verl-fsdp"),
    "megatron": BackendSpec("megatron", "train", "verl-megatron"),
    "hf": BackendSpec("hf", "rollout", "verl-rollout"),
    "vllm": BackendSpec("vllm", "rollout", "verl-rollout"),
    "sglang": BackendSpec("sglang", "rollout", "verl-rollout", requires=("sglang",), extra="verl-rollout[sglang]"),
    "torch": BackendSpec("torch", "kernels", "verl-kernels"),
    "triton": BackendSpec("triton", "kernels", "verl-kernels"),
}


def check(*updates: dict, strict: bool = True, installed=INSTALLED):
    return validate(make_cfg(*updates), strict=strict, installed=installed)


def errors(problems):
    return [p for p in problems if p.severity == "error"]


def only(problems, severity="error"):
    """The single problem of a severity; fails listing them all otherwise."""
    found = [p for p in problems if p.severity == severity]
    assert len(found) == 1, [p.format() for p in problems]
    return found[0]


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    # Deterministic on GPU and CPU machines alike; tests that need CUDA present patch it back.
    monkeypatch.setattr(layout_checks, "_cuda_available", lambda: False)


def test_base_config_is_clean():
    assert check() == []


def test_accepts_a_verl_config_instance():
    cfg = VerlConfig()
    cfg.model.path, cfg.data.train_files, cfg.data.train_batch_size = "m", ["t"], 8
    cfg.actor.ppo_mini_batch_size, cfg.rollout.n = 8, 2
    assert validate(cfg, installed=INSTALLED) == []


def test_missing_required_values_are_reported():
    problems = validate(OmegaConf.structured(VerlConfig), installed=INSTALLED)
    keys = {p.key for p in errors(problems) if "not set" in p.message}
    assert keys == {"model.path", "data.train_files", "data.train_batch_size", "actor.ppo_mini_batch_size"}


def test_three_different_problems_are_all_reported():
    problems = check(
        {
            "placement": {"device": "tpu"},
            "actor": {"ppo_mini_batch_size": 5},
            "tracking": {"loggers": ["console", "wandbb"]},
        }
    )
    assert sorted(p.key for p in problems) == ["actor.ppo_mini_batch_size", "placement.device", "tracking.loggers[1]"]
    assert all(p.severity == "error" and p.fix for p in problems)


# --------------------------------------------------------------------------- placement


def test_device_must_be_cpu_or_cuda():
    p = only(check({"placement": {"device": "gpu"}}))
    assert p.key == "placement.device" and "'gpu'" in p.message and "cpu, cuda" in p.fix


@pytest.mark.parametrize("key", ["nnodes", "devices_per_node"])
def test_node_counts_are_positive(key):
    p = only(check({"placement": {key: 0}}))
    assert p.key == f"placement.{key}" and "got 0" in p.message


def test_enabled_role_missing_from_pools():
    p = only(
        check(
            {
                "algorithm": {"adv_estimator": "gae"},
                "placement": {"pools": [{"name": "h", "roles": ["actor", "rollout"]}]},
            }
        )
    )
    assert p.key == "placement.pools"
    assert "'critic'" in p.message and "algorithm.adv_estimator=gae" in p.message
    assert "critic.enable=false" in p.fix


def test_disabled_role_may_be_missing_from_pools():
    assert check({"placement": {"pools": [{"name": "h", "roles": ["actor", "rollout"]}]}}) == []


def test_role_in_two_pools():
    pools = [
        {"name": "a", "roles": ["actor", "rollout"], "devices": 2},
        {"name": "b", "roles": ["actor"], "devices": 2},
    ]
    p = only(check({"placement": {"devices_per_node": 4, "pools": pools}}))
    assert p.key == "placement.pools" and "'actor' is in 2 pools ('a', 'b')" in p.message


def test_unknown_role_gets_a_suggestion():
    p = only(check({"placement": {"pools": [{"name": "h", "roles": ["actr", "actor", "rollout"]}]}}))
    assert p.key == "placement.pools.0.roles" and "'actr'" in p.message and "did you mean 'actor'" in p.fix


def test_pools_take_more_devices_than_exist():
    pools = [{"name": "a", "roles": ["actor", "rollout"], "devices": 8}, {"name": "b", "roles": ["ref"], "devices": 12}]
    fits = {"data": {"train_batch_size": 48}}  # so the batch arithmetic adds no problem of its own
    problems = check(fits, {"ref": {"enable": True}, "placement": {"nnodes": 2, "devices_per_node": 8, "pools": pools}})
    p = only(not_hybrid(problems))
    assert p.key == "placement.pools" and "take 20 devices" in p.message and "has 16" in p.message


def test_pool_with_zero_devices():
    pools = [{"name": "a", "roles": ["actor", "rollout"], "devices": 0}]
    p = only(check({"placement": {"pools": pools}}))
    assert p.key == "placement.pools.0.devices" and "pool 'a' has 0 devices" in p.message


def test_pool_left_without_devices_by_the_pools_before_it():
    pools = [{"name": "a", "roles": ["actor", "rollout"], "devices": 4}, {"name": "b", "roles": ["ref"]}]
    p = only(not_hybrid(check({"ref": {"enable": True}, "placement": {"devices_per_node": 4, "pools": pools}})))
    assert p.key == "placement.pools.1.devices" and "gets 0 devices" in p.message


def not_hybrid(problems):
    """The problems besides the reference's (these tests place the reference in a pool of its own)."""
    return [p for p in problems if "must share the actor's pool" not in p.message]


def test_the_reference_shares_the_actors_pool():
    pools = [{"name": "a", "roles": ["actor", "rollout"], "devices": 2}, {"name": "b", "roles": ["ref"]}]
    p = only(check({"ref": {"enable": True}, "placement": {"devices_per_node": 4, "pools": pools}}))
    assert p.key == "placement.pools" and "must share the actor's pool" in p.message and "ref in 'b'" in p.message


def test_a_rollout_may_have_a_pool_of_its_own_and_overlap_generation():
    pools = [{"name": "train", "roles": ["actor", "ref"], "devices": 2}, {"name": "gen", "roles": ["rollout"]}]
    cfg = {"ref": {"enable": True}, "placement": {"devices_per_node": 4, "pools": pools}}
    for mode in ("sync", "one_step_off"):
        problems = check({**cfg, "trainer": {"mode": mode}})
        assert not [p for p in problems if p.severity == "error"], [p.format() for p in problems]
    plan, _ = validate_and_plan(make_cfg(cfg, {"trainer": {"mode": "one_step_off"}}), installed=INSTALLED)
    assert plan.rollout_apart and plan.mode == "one_step_off" and not plan.colocated("rollout", "actor")
    assert plan.pool("rollout").ranks == range(2, 4) and plan.layout("rollout").dp == 2
    # ... but overlap needs devices of its own
    hybrid = [{"name": "a", "roles": ["actor", "rollout", "ref"]}]
    p = only(check({"ref": {"enable": True}, "trainer": {"mode": "one_step_off"}, "placement": {"pools": hybrid}}))
    assert p.key == "trainer.mode" and "pool of its own" in p.fix


def test_idle_devices_are_a_warning():
    pools = [{"name": "a", "roles": ["actor", "rollout"], "devices": 2}]
    p = only(check({"placement": {"devices_per_node": 4, "pools": pools}}), "warning")
    assert "take 2 of 4 devices" in p.message


def test_cuda_missing_is_an_error_only_when_strict(monkeypatch):
    p = only(check({"placement": {"device": "cuda"}}))
    assert p.key == "placement.device" and "placement.device=cpu" in p.fix
    assert check({"placement": {"device": "cuda"}}, strict=False) == []
    monkeypatch.setattr(layout_checks, "_cuda_available", lambda: True)
    assert check({"placement": {"device": "cuda"}}) == []


def test_local_controller_is_one_node_only():
    p = only(check({"trainer": {"controller": "local"}, "placement": {"nnodes": 2}}))
    assert p.key == "trainer.controller" and "nnodes=2" in p.message
    assert check({"trainer": {"controller": "local"}}) == []
    assert check({"trainer": {"controller": "ray"}, "placement": {"nnodes": 2}}) == []


# --------------------------------------------------------------------------- layouts

MEGATRON8 = {"placement": {"devices_per_node": 8}, "actor": {"backend": "megatron"}}


def test_parallel_sizes_are_positive():
    p = only(check({"actor": {"parallel": {"cp": 0}}}))
    assert p.key == "actor.parallel.cp" and "got 0" in p.message


def test_model_parallel_must_divide_the_pool():
    twelve = {
        "placement": {"devices_per_node": 12},
        "data": {"train_batch_size": 24},
        "actor": {"backend": "megatron", "ppo_mini_batch_size": 3},
    }
    p = only(check(twelve, {"actor": {"parallel": {"tp": 8}}}))
    assert p.key == "actor.parallel.tp"
    assert "tp*pp*cp = 8 does not divide the 12 devices of pool 'hybrid'" in p.message
    assert "1, 2, 3, 4, 6, 12" in p.fix
    assert check(twelve, {"actor": {"parallel": {"tp": 4}}}) == []


def test_ref_inheriting_a_bad_actor_layout_is_reported_once():
    problems = check(MEGATRON8, {"actor": {"parallel": {"tp": 3}, "use_kl_loss": True}})
    assert [p.key for p in problems] == ["actor.parallel.tp"]


def test_virtual_pipeline_needs_pipeline():
    p = only(check(MEGATRON8, {"actor": {"parallel": {"vpp": 2}}}))
    assert p.key == "actor.parallel.vpp" and "pp=1" in p.message
    assert check(MEGATRON8, {"actor": {"parallel": {"pp": 2, "vpp": 2}}}) == []


def test_sequence_parallel_is_megatrons_and_needs_tensor_parallelism():
    p = only(check(MEGATRON8, {"actor": {"parallel": {"sequence_parallel": True}}}))
    assert p.key == "actor.parallel.sequence_parallel" and "tp=1" in p.message and "parallel.tp to 2" in p.fix
    assert check(MEGATRON8, {"actor": {"parallel": {"tp": 2, "sequence_parallel": True}}}) == []
    assert check(MEGATRON8, {"actor": {"parallel": {"tp": 2, "sequence_parallel": False}}}) == []
    p = only(check({"placement": {"devices_per_node": 8}, "actor": {"parallel": {"sequence_parallel": True}}}))
    assert p.key == "actor.parallel.sequence_parallel" and "uses fsdp" in p.message
    p = only(check(MEGATRON8, {"rollout": {"parallel": {"sequence_parallel": True}}}))
    assert p.key == "rollout.parallel.sequence_parallel"


@pytest.mark.parametrize("base", [MEGATRON8, {"placement": {"devices_per_node": 8}}], ids=["megatron", "fsdp"])
def test_expert_parallel_is_refused_without_moe_models(base):
    p = only(check(base, {"model": {"path": "embedded:tiny-llama"}, "actor": {"parallel": {"ep": 2}}}))
    assert p.key == "actor.parallel.ep" and "dense models" in p.message and p.fix == "set actor.parallel.ep=1"


def test_the_embedded_mixture_of_experts_takes_expert_parallelism():
    moe = {"model": {"path": "embedded:tiny-qwen3-moe"}}  # 8 experts, read from its spec (nothing is built)
    assert not errors(check(MEGATRON8, moe, {"actor": {"parallel": {"ep": 8}}}))
    p = only(check(MEGATRON8, moe, {"actor": {"parallel": {"ep": 4, "etp": 4}}}))  # 16 ranks over 8
    assert p.key == "actor.parallel.ep" and "does not divide" in p.message


def test_a_vision_language_model_trains_on_fsdp_with_the_hf_rollout_and_nothing_else(tmp_path):
    """The embedded tiny Qwen2.5-VL (read from its spec), and a folder whose config.json has a vision tower."""
    vlm = {"model": {"path": "embedded:tiny-qwen2.5-vl"}}
    assert not errors(check(vlm))
    p = only(check(MEGATRON8, {"model": {"path": "embedded:tiny-qwen3-vl"}}))
    assert p.key == "actor.backend" and "vision-language model (qwen3_vl)" in p.message
    p = only(check(MEGATRON8, vlm))
    assert (
        p.key == "actor.backend"
        and "vision-language model (qwen2_5_vl)" in p.message
        and p.fix == "set actor.backend=fsdp"
    )
    (tmp_path / "config.json").write_text('{"model_type": "qwen2_vl", "vision_config": {"depth": 32}}')
    folder = {"model": {"path": str(tmp_path)}}
    assert not errors(check(folder))
    refused = {
        "rollout.backend": {"rollout": {"backend": "vllm"}},
        "actor.lora.rank": {"actor": {"lora": {"rank": 8}}},
        "critic.enable": {"algorithm": {"adv_estimator": "gae"}, "critic": {"enable": True}},
    }
    for key, update in refused.items():
        assert key in {p.key for p in errors(check(folder, update, strict=False))}, key
    for mode in ("one_step_off", "async"):  # (the hf rollout's service takes images; the pools are another matter)
        found = errors(check(folder, {"trainer": {"mode": mode}}, strict=False))
        assert not [p for p in found if p.key == "trainer.mode" and "vision-language" in p.message]


def test_a_vision_language_model_generates_with_vllm_on_a_gpu_only():
    vlm = {"model": {"path": "embedded:tiny-qwen2.5-vl"}, "rollout": {"backend": "vllm"}}
    p = only(check(vlm))
    assert p.key == "rollout.backend" and "torchvision" in p.message and p.fix == "set rollout.backend=hf"
    gpu = {"placement": {"device": "cuda"}}
    assert "rollout.backend" not in {p.key for p in errors(check(vlm, gpu))}
    p = [p for p in errors(check(vlm, gpu, {"rollout": {"backend": "sglang"}})) if p.key == "rollout.backend"][0]
    assert "sglang" in p.message and p.fix == "set rollout.backend=hf or vllm"
    stepped = errors(check(vlm, gpu, {"trainer": {"mode": "async"}}, strict=False))
    assert [p for p in stepped if p.key == "trainer.mode" and "token prompts only" in p.message]


def test_a_vision_tower_is_frozen_only_where_the_model_has_one():
    freeze = {"actor": {"freeze_vision_tower": True}}
    assert not errors(check({"model": {"path": "embedded:tiny-qwen2.5-vl"}}, freeze))
    p = only(check({"model": {"path": "embedded:tiny-llama"}}, freeze))
    assert p.key == "actor.freeze_vision_tower" and "text model" in p.message
    assert p.fix == "set actor.freeze_vision_tower=false"


def test_the_load_balancing_loss_is_megatrons_and_for_mixtures_of_experts():
    aux = {"actor": {"moe_aux_loss_coeff": 0.01}}
    assert not errors(check(MEGATRON8, {"model": {"path": "embedded:tiny-qwen3-moe"}}, aux))
    p = only(check(MEGATRON8, {"model": {"path": "embedded:tiny-llama"}}, aux))
    assert p.key == "actor.moe_aux_loss_coeff" and "dense" in p.message and p.fix == "set actor.moe_aux_loss_coeff=0"
    p = only(check({"placement": {"devices_per_node": 8}}, {"model": {"path": "embedded:tiny-qwen3-moe"}}, aux))
    assert p.key == "actor.moe_aux_loss_coeff" and "uses fsdp" in p.message
    p = only(check(MEGATRON8, {"actor": {"moe_aux_loss_coeff": -1.0}}))
    assert p.key == "actor.moe_aux_loss_coeff"


def test_vllm_on_cpu_is_refused_for_a_mixture_of_experts():
    moe = {"model": {"path": "embedded:tiny-qwen3-moe"}, "rollout": {"backend": "vllm"}}
    p = only(check(moe, {"placement": {"device": "cpu"}}))
    assert p.key == "rollout.backend" and "mixture of experts" in p.message and "rollout.backend=hf" in p.fix
    assert not [p for p in errors(check(moe, {"placement": {"device": "cuda"}})) if p.key == "rollout.backend"]
    assert not errors(check({"model": {"path": "embedded:tiny-qwen3-moe"}, "placement": {"device": "cpu"}}))


def test_routing_replay_needs_a_megatron_mixture_of_experts_and_r3_a_rollout_that_records():
    moe, r2, r3 = (
        {"model": {"path": "embedded:tiny-qwen3-moe"}},
        {"actor": {"routing_replay": "r2"}},
        {"actor": {"routing_replay": "r3"}},
    )
    for mode in (r2, r3):  # any layout: tensor, context and pipeline splits put the routes together
        assert not errors(check(MEGATRON8, moe, mode, {"actor": {"parallel": {"ep": 2}}}))
        assert not errors(check(MEGATRON8, moe, mode, {"actor": {"parallel": {"tp": 2, "pp": 2, "cp": 2}}}))
        p = only(check(MEGATRON8, {"model": {"path": "embedded:tiny-llama"}}, mode))
        assert p.key == "actor.routing_replay" and "dense" in p.message
        p = only(check({"placement": {"devices_per_node": 8}}, moe, mode))
        assert p.key == "actor.routing_replay" and "megatron" in p.message
    for other, fix in (
        ({"rollout": {"backend": "sglang"}}, "rollout.backend=hf"),
        ({"rollout": {"backend": "vllm"}, "placement": {"device": "cpu"}}, "rollout.backend=hf"),
        ({"rollout": {"agent": {"loop": "tool_agent"}}}, "rollout.agent.loop=null"),
        ({"trainer": {"mode": "async"}}, "trainer.mode=sync"),
    ):
        p = next(p for p in errors(check(MEGATRON8, moe, r3, other)) if p.key == "actor.routing_replay")
        assert "r3" in p.message and fix in p.fix and "r2" in p.fix
    on_gpu = {"rollout": {"backend": "vllm"}, "placement": {"device": "cuda"}}
    assert not [p for p in errors(check(MEGATRON8, moe, r3, on_gpu)) if p.key == "actor.routing_replay"]
    p = only(check(MEGATRON8, moe, {"actor": {"routing_replay": "r4"}}))
    assert p.key == "actor.routing_replay"


def _moe_folder(path, experts: int = 8) -> str:
    path.mkdir()
    (path / "config.json").write_text(f'{{"model_type": "qwen3_moe", "num_experts": {experts}}}')
    return str(path)


def test_expert_parallel_is_megatrons_and_must_divide_the_experts_and_the_stage(tmp_path):
    moe = {"model": {"path": _moe_folder(tmp_path / "moe", experts=6)}}
    assert not errors(check(MEGATRON8, moe, {"actor": {"parallel": {"ep": 2}}}))
    p = only(check({"placement": {"devices_per_node": 8}}, moe, {"actor": {"parallel": {"ep": 2}}}))
    assert "megatron's" in p.message and p.fix == "set actor.backend=megatron"
    p = only(check(MEGATRON8, moe, {"actor": {"parallel": {"ep": 4}}}))
    assert p.key == "actor.parallel.ep" and "does not divide the model's 6 experts" in p.message
    p = only(check(MEGATRON8, moe, {"actor": {"parallel": {"tp": 2, "etp": 2, "ep": 3}}}))  # 12 over 8 ranks
    assert "does not divide" in p.message


def test_a_mixture_of_experts_with_tensor_parallelism_keeps_sequence_parallelism(tmp_path):
    moe = {"model": {"path": _moe_folder(tmp_path / "moe")}}
    assert not errors(check(MEGATRON8, moe, {"actor": {"parallel": {"tp": 2}}}))
    p = only(check(MEGATRON8, moe, {"actor": {"parallel": {"tp": 2, "sequence_parallel": False}}}))
    assert p.key == "actor.parallel.sequence_parallel" and "sequence parallelism only" in p.message


def test_expert_parallel_of_a_model_not_on_this_machine_is_left_to_the_engine():
    assert not errors(check(MEGATRON8, {"actor": {"parallel": {"ep": 2}}}))


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_fsdp_splits_by_tensor_or_sequence_parallelism(role):
    base = {"placement": {"devices_per_node": 8}, "critic": {"enable": True}}
    for axis in ("tp", "cp"):
        assert not errors(check(base, {role: {"parallel": {axis: 2}}}))
    p = only(check(base, {role: {"parallel": {"tp": 2, "cp": 2}}}))
    assert p.key == f"{role}.parallel.cp" and "not both" in p.message
    p = only(check(base, {role: {"parallel": {"pp": 2}}}))
    assert p.key == f"{role}.parallel.pp" and "pipeline" in p.message and "megatron" in p.fix


def test_fsdp_tensor_parallel_refuses_lora_and_experts_by_key(tmp_path):
    p = only(check({"placement": {"devices_per_node": 8}, "actor": {"parallel": {"tp": 2}, "lora": {"rank": 4}}}))
    assert p.key == "actor.parallel.tp" and "LoRA" in p.message
    moe = {"model": {"path": _moe_folder(tmp_path / "moe")}}
    p = only(check({"placement": {"devices_per_node": 8}}, moe, {"actor": {"parallel": {"tp": 2}}}))
    assert p.key == "actor.parallel.tp" and "experts" in p.message and "megatron" in p.fix


def test_fsdp_sequence_parallel_needs_a_maskable_attention():
    cfg = {"placement": {"devices_per_node": 8, "device": "cuda"}, "actor": {"parallel": {"cp": 2}}}
    problems = check(cfg, {"model": {"attn_implementation": "flash_attention_2"}})
    assert "actor.parallel.cp" in [p.key for p in problems]


@pytest.mark.parametrize("axis", ["pp", "cp", "ep"])
def test_rollout_is_tensor_parallel_only(axis):
    p = only(check({"placement": {"devices_per_node": 8}, "rollout": {"parallel": {axis: 2}}}))
    assert p.key == f"rollout.parallel.{axis}" and f"{axis}=2" in p.message


def test_sglang_rollout_needs_cuda_and_tp_one():
    problems = check({"placement": {"devices_per_node": 2}, "rollout": {"backend": "sglang", "parallel": {"tp": 2}}})
    by_key = {p.key: p for p in problems if "not importable" not in p.message}  # sglang is not installed here
    assert "tp=1 only" in by_key["rollout.parallel.tp"].message and "vllm" in by_key["rollout.parallel.tp"].fix
    assert (
        "CUDA GPUs only" in by_key["rollout.backend"].message
        and "placement.device=cuda" in by_key["rollout.backend"].fix
    )


def test_colocated_rollout_tp_only_has_to_fit_the_pool():
    """The weight sync streams full tensors (each rollout engine slices its own shard), so a colocated rollout's
    tp need not divide the megatron actor's tp*pp: only the pool's device count."""
    assert check(MEGATRON8, {"actor": {"parallel": {"tp": 2}}, "rollout": {"parallel": {"tp": 4}}}) == []
    p = only(check(MEGATRON8, {"actor": {"parallel": {"tp": 2}}, "rollout": {"parallel": {"tp": 3}}}))
    assert p.key == "rollout.parallel.tp"


# --------------------------------------------------------------------------- batch sizes


def test_mini_batch_must_divide_the_train_batch():
    p = only(check({"actor": {"ppo_mini_batch_size": 6}}))
    assert p.key == "actor.ppo_mini_batch_size"
    assert "data.train_batch_size=16 is not a multiple of actor.ppo_mini_batch_size=6" in p.message
    assert "4 or 8" in p.fix


def test_mini_batch_samples_must_split_over_dp():
    problems = check(
        {
            "placement": {"devices_per_node": 8},
            "data": {"train_batch_size": 12},
            "actor": {"ppo_mini_batch_size": 3},
            "rollout": {"n": 2},
        }
    )
    p = next(p for p in problems if p.key == "actor.ppo_mini_batch_size")
    assert "3 prompts x n=2 = 6 samples does not split over actor DP=8" in p.message


def test_micro_batch_must_divide_the_per_rank_samples():
    p = only(
        check(
            {"placement": {"devices_per_node": 2}, "rollout": {"n": 2}, "actor": {"ppo_micro_batch_size_per_device": 3}}
        )
    )
    assert p.key == "actor.ppo_micro_batch_size_per_device"
    assert (
        "4 samples per DP rank (8 samples / DP 2) is not a multiple of actor.ppo_micro_batch_size_per_device=3"
        in p.message
    )
    assert "2 or 4" in p.fix


def test_log_prob_pass_must_split_over_ref_dp():
    pools = [{"name": "train", "roles": ["actor", "rollout"], "devices": 4}, {"name": "ref", "roles": ["ref"]}]
    cfg = {"placement": {"devices_per_node": 7, "pools": pools}, "ref": {"enable": True}, "rollout": {"n": 2}}
    p = only(not_hybrid(check(cfg)))
    assert p.key == "data.train_batch_size"
    assert "16 prompts x n=2 = 32 samples do not split over ref DP=3" in p.message


def test_prompts_must_split_over_rollout_dp():
    cfg = {
        "placement": {"devices_per_node": 4},
        "data": {"train_batch_size": 6},
        "actor": {"ppo_mini_batch_size": 6},
        "rollout": {"n": 2},
    }
    p = only(check(cfg))
    assert p.key == "data.train_batch_size" and "6 prompts do not split over rollout DP=4" in p.message
    assert "4 or 8" in p.fix
    assert check(cfg, {"rollout": {"parallel": {"tp": 2}}}) == []  # rollout DP 2 divides 6


def test_critic_batches_default_to_the_actor_and_are_checked():
    gae = {"algorithm": {"adv_estimator": "gae"}, "placement": {"devices_per_node": 2}, "rollout": {"n": 2}}
    assert check(gae) == []
    p = only(check(gae, {"critic": {"ppo_micro_batch_size_per_device": 3}}))
    assert p.key == "critic.ppo_micro_batch_size_per_device" and "4 samples per DP rank" in p.message
    p = only(check(gae, {"critic": {"ppo_mini_batch_size": 3}}))
    assert p.key == "critic.ppo_mini_batch_size" and "critic.ppo_mini_batch_size=3" in p.message


@pytest.mark.parametrize(
    "key", ["data.train_batch_size", "rollout.n", "actor.ppo_epochs", "actor.ppo_micro_batch_size_per_device"]
)
def test_batch_numbers_are_positive(key):
    section, name = key.split(".")
    problems = check({section: {name: 0}})
    assert any(p.key == key and "got 0" in p.message for p in errors(problems)), [p.format() for p in problems]


def test_single_sample_groups_warn_for_group_estimators():
    p = only(check({"rollout": {"n": 1}}), "warning")
    assert p.key == "rollout.n" and "grpo" in p.message
    assert check({"rollout": {"n": 1}, "algorithm": {"adv_estimator": "gae"}}) == []  # gae: no groups


def test_an_estimator_that_needs_values_needs_the_critic():
    p = only(check({"algorithm": {"adv_estimator": "gae"}, "critic": {"enable": False}}))
    assert p.key == "critic.enable" and "needs values" in p.message


# --------------------------------------------------------------------------- backends


def test_missing_backend_package_is_named():
    installed = {k: v for k, v in INSTALLED.items() if k != "megatron"}
    p = only(check({"actor": {"backend": "megatron"}}, installed=installed))
    assert p.key == "actor.backend" and "verl-megatron" in p.message and p.fix == "pip install verl-megatron"


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
def test_missing_third_party_library_is_an_error_only_when_strict():
    def missing(problems):
        return [p for p in problems if "not importable" in p.message]  # (sglang on CPU is refused as well)

    p = only(missing(check({"rollout": {"backend": "sglang"}}, strict=True)))
    assert p.key == "rollout.backend" and "'sglang'" in p.message and "verl-rollout[sglang]" in p.fix
    w = only(missing(check({"rollout": {"backend": "sglang"}}, strict=False)), "warning")
    assert w.key == "rollout.backend"


def test_ref_and_critic_backends_are_checked_when_enabled():
    installed = {k: v for k, v in INSTALLED.items() if k != "megatron"}
    assert check({"ref": {"backend": "megatron"}}, installed=installed) == []  # ref disabled
    p = only(check({"ref": {"enable": True, "backend": "megatron"}}, installed=installed))
    assert p.key == "ref.backend"
    p = only(check({"critic": {"enable": True, "backend": "megatron"}}, installed=installed))
    assert p.key == "critic.backend"


def test_unknown_backend_name():
    p = only(check({"rollout": {"backend": "vlm"}}))
    assert p.key == "rollout.backend" and "did you mean 'vllm'" in p.fix


def test_fused_kernel_backend_is_checked_only_when_used():
    installed = {k: v for k, v in INSTALLED.items() if k != "triton"}
    assert check({"actor": {"fused_kernel_impl": "triton"}}, installed=installed) == []
    p = only(check({"actor": {"use_fused_kernels": True, "fused_kernel_impl": "triton"}}, installed=installed))
    assert p.key == "actor.fused_kernel_impl" and "verl-kernels" in p.message


# --------------------------------------------------------------------------- enums and ranges


@pytest.mark.parametrize(
    "update, key, text",
    [
        ({"tracking": {"loggers": ["wandbb"]}}, "tracking.loggers[0]", "did you mean 'wandb'"),
        ({"tracking": {"wandb_mode": "offlin"}}, "tracking.wandb_mode", "did you mean 'offline'"),
        ({"trainer": {"controller": "rey"}}, "trainer.controller", "did you mean 'ray'"),
        ({"actor": {"optim": {"scheduler": "cosin"}}}, "actor.optim.scheduler", "did you mean 'cosine'"),
        ({"checkpoint": {"keep_last": 0}}, "checkpoint.keep_last", "checkpoint.keep_last=1"),
        ({"rollout": {"temperature": -0.5}}, "rollout.temperature", "rollout.temperature=0"),
        ({"rollout": {"top_p": 0.0}}, "rollout.top_p", "rollout.top_p=1.0"),
        ({"rollout": {"top_p": 1.5}}, "rollout.top_p", "rollout.top_p=1.0"),
    ],
)
def test_enums_and_ranges(update, key, text):
    p = only(check(update))
    assert p.key == key and text in p.fix


def test_valid_enum_values_pass():
    update = {
        "tracking": {"loggers": ["console", "jsonl", "wandb", "tensorboard", "prometheus"], "wandb_mode": "disabled"},
        "actor": {"optim": {"scheduler": "cosine"}},
        "rollout": {"temperature": 0.0, "top_p": 1.0},
        "checkpoint": {"keep_last": 1},
    }
    assert check(update) == []


@pytest.mark.parametrize(
    "key", ["actor.param_offload", "actor.optimizer_offload", "ref.param_offload", "critic.optimizer_offload"]
)
@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_both_engines_take_the_offload_switches(key, backend):
    section, name = key.split(".")
    roles = {"actor": {"backend": backend}, "ref": {"enable": True}, "critic": {"enable": True, "backend": backend}}
    cfg = make_cfg(roles, {section: {name: True}})
    problems = [p for p in validate(cfg, installed=None) if p.key == key]
    # (these test configs place the run on CPU, where offload has no device memory to free: a warning, no error)
    assert [p.severity for p in problems] == ["warning"] and "CPU" in problems[0].fix


@pytest.mark.parametrize("key", ["actor.use_kl_loss", "algorithm.use_kl_in_reward"])
def test_a_kl_term_needs_the_reference(key):
    section, name = key.split(".")
    p = only(check({section: {name: True}, "ref": {"enable": False}}))
    assert p.key == key and "ref.enable=false" in p.message


def test_a_role_that_does_not_run_is_not_checked():
    assert check({"critic": {"ppo_epochs": 0}}) == []  # grpo: no critic
    p = only(check({"critic": {"ppo_epochs": 0}, "algorithm": {"adv_estimator": "gae"}}))
    assert p.key == "critic.ppo_epochs" and "must be >= 1" in p.message


def test_every_number_in_the_schema_has_a_declared_range():
    """Each int and float key states its range in the schema (`at_least`, `positive`, `fraction`, `checked`, or
    `size` for the placement arithmetic's sizes), so a negative or out-of-range value is refused generically."""
    import dataclasses

    from verl.config.schema import VerlConfig, field_types, is_section, strip_optional

    def numbers(schema, prefix=""):
        for f in dataclasses.fields(schema):
            tp = strip_optional(field_types(schema)[f.name])
            if is_section(tp):
                yield from numbers(tp, f"{prefix}{f.name}.")
            elif tp in (int, float) or getattr(tp, "__args__", None) in ((int,), (float,)):
                yield f"{prefix}{f.name}", f.metadata

    undeclared = [key for key, meta in numbers(VerlConfig) if not {"check", "choices", "checked_by"} & set(meta)]
    assert undeclared == []


def test_an_interpolation_that_does_not_resolve_is_a_problem_not_a_crash():
    cfg = make_cfg({"tracking": {"log_dir": "${trainer.nope}/logs"}, "actor": {"optim": {"lr": "${trainer.nope2}"}}})
    problems = validate(cfg)
    assert [p.key for p in problems] == ["actor.optim.lr", "tracking.log_dir"]
    assert "trainer.nope2" in problems[0].message and problems[0].severity == "error"


def test_an_sft_run_needs_no_rollout_backend():
    """SFT plans no rollout, so an install with the train backend alone (recipes:sft_tiny's pex) validates."""
    only_fsdp = {"fsdp": INSTALLED["fsdp"]}
    sft = {"algorithm": {"name": "sft"}, "placement": {"pools": [{"name": "train", "roles": ["actor"]}]}}
    assert [p.key for p in check(sft, installed=only_fsdp) if p.severity == "error"] == []
    assert "rollout.backend" in [p.key for p in check({}, installed=only_fsdp)]  # (an RL run needs one)


def test_stop_when_needs_one_bound_a_validation_metric_and_validation():
    validating = {"data": {"val_files": ["embedded:arithmetic-val"]}, "trainer": {"val_every": 10}}
    ok = {"trainer": {"stop_when": {"metric": "val/accuracy", "at_least": 0.8}}}
    assert not errors(check(validating, ok))
    p = only(check(validating, {"trainer": {"stop_when": {"metric": "val/accuracy"}}}))
    assert p.key == "trainer.stop_when" and "one bound, got 0" in p.message and "at_least" in p.fix
    both = {"trainer": {"stop_when": {"metric": "val/loss", "at_least": 0.1, "at_most": 1.0}}}
    assert "one bound, got 2" in only(check(validating, both)).message
    p = only(check(validating, {"trainer": {"stop_when": {"metric": "actor/loss", "at_most": 0.1}}}))
    assert p.key == "trainer.stop_when.metric" and "not a validation metric" in p.message
    p = only(check(ok, {"trainer": {"val_every": 0}}))
    assert p.key == "trainer.stop_when" and "trainer.val_every" in p.fix


def test_a_warm_start_to_an_exact_match_share_needs_held_out_files():
    ws = {"files": ["embedded:arithmetic-sft"], "until_exact_match": 0.3}
    p = only(check({"model": {"warm_start": ws}}))
    assert p.key == "model.warm_start.until_exact_match" and "model.warm_start.val_files" in p.fix
    assert not errors(check({"model": {"warm_start": {**ws, "val_files": ["embedded:arithmetic-sft-val"]}}}))
    p = only(check({"model": {"warm_start": {**ws, "val_files": ["x.parquet"], "until_exact_match": 1.5}}}))
    assert p.key == "model.warm_start.until_exact_match" and "[0, 1]" in p.message


def test_a_run_on_ray_without_ray_installed_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    two = {"placement": {"devices_per_node": 2}}
    p = only(check(two))
    assert p.key == "trainer.controller" and "auto: 2 devices" in p.message and "verl-core[ray]" in p.fix
    assert only(check(two, strict=False), "warning").key == "trainer.controller"  # planning for another machine
    assert errors(check({"placement": {"devices_per_node": 1}})) == []  # one device: in-process, no Ray
