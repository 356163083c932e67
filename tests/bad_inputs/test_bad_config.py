"""Bad input to `verl train`, each refused before anything starts: exit code 2, a message naming the culprit (the
key, and the file where there is one), no traceback. One row per case; the recipe is the tiny GRPO default."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl import cli

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "grpo_tiny.yaml")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """Broken files of each kind a recipe can name."""
    root = tmp_path_factory.mktemp("bad_files")
    (root / "no_config").mkdir()
    (root / "no_tokenizer").mkdir()
    (root / "no_tokenizer" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "not_parquet.parquet").write_text("prompt,answer\n1+1=,2\n")
    rl = {"prompt": [[{"role": "user", "content": "1+1="}]], "data_source": ["arithmetic"]}
    pq.write_table(pa.table(rl), root / "no_reward_model.parquet")  # lacks the reward_model column
    empty = pa.table(
        {
            "prompt": pa.array([], pa.string()),
            "data_source": pa.array([], pa.string()),
            "reward_model": pa.array([], pa.string()),
        }
    )
    pq.write_table(empty, root / "empty.parquet")
    pq.write_table(pa.table({"prompt": ["1+1="]}), root / "sft_no_response.parquet")
    text_prompt = {"prompt": ["1+1="], "data_source": ["arithmetic"], "reward_model": [{"ground_truth": "2"}]}
    pq.write_table(pa.table(text_prompt), root / "prompt_as_text.parquet")  # a str, not chat messages
    (root / "step_3").mkdir()  # a checkpoint folder without its COMPLETE marker: a save that did not finish
    names = (
        "no_config",
        "no_tokenizer",
        "not_parquet.parquet",
        "no_reward_model.parquet",
        "empty.parquet",
        "sft_no_response.parquet",
        "prompt_as_text.parquet",
        "step_3",
    )
    return {name.removesuffix(".parquet"): str(root / name) for name in names}


# (id, overrides ({name} is a file of the fixture), text the message must hold (the culprit), ...)
CASES = [
    # numbers: each key has a declared range, and no float may be NaN or infinite
    ("negative_lr", ["actor.optim.lr=-1"], "actor.optim.lr", "> 0"),
    ("nan_lr", ["actor.optim.lr=nan"], "actor.optim.lr", "finite"),
    ("inf_lr", ["actor.optim.lr=inf"], "actor.optim.lr", "finite"),
    ("negative_grad_clip", ["actor.optim.grad_clip=-1"], "actor.optim.grad_clip", "> 0"),
    ("zero_grad_clip", ["actor.optim.grad_clip=0"], "actor.optim.grad_clip", "> 0"),
    ("negative_weight_decay", ["actor.optim.weight_decay=-0.1"], "actor.optim.weight_decay", ">= 0"),
    ("betas_out_of_range", ["actor.optim.betas=[0.9,2.0]"], "actor.optim.betas", "[0, 1)"),
    ("zero_eps", ["actor.optim.eps=0"], "actor.optim.eps", "> 0"),
    ("negative_warmup", ["actor.optim.warmup_steps=-1"], "actor.optim.warmup_steps", ">= 0"),
    ("min_lr_ratio_above_one", ["actor.optim.min_lr_ratio=2"], "actor.optim.min_lr_ratio", "[0, 1]"),
    ("negative_total_steps", ["trainer.total_steps=-3"], "trainer.total_steps", ">= 1"),
    ("zero_total_epochs", ["trainer.total_epochs=0"], "trainer.total_epochs", ">= 1"),
    ("negative_save_every", ["checkpoint.save_every=-1"], "checkpoint.save_every", ">= 0"),
    ("negative_val_every", ["trainer.val_every=-5"], "trainer.val_every", ">= 0"),
    ("zero_log_every", ["trainer.log_every=0"], "trainer.log_every", ">= 1"),
    ("negative_seed", ["trainer.seed=-1"], "trainer.seed", ">= 0"),
    ("gamma_above_one", ["algorithm.gamma=1.5"], "algorithm.gamma", "[0, 1]"),
    ("negative_lam", ["algorithm.lam=-0.1"], "algorithm.lam", "[0, 1]"),
    ("negative_kl_loss_coef", ["actor.kl_loss_coef=-1"], "actor.kl_loss_coef", ">= 0"),
    ("nan_entropy_coeff", ["actor.entropy_coeff=nan"], "actor.entropy_coeff", "finite"),
    ("negative_clip_ratio", ["actor.clip_ratio=-0.2"], "actor.clip_ratio", "lower clip"),
    ("zero_top_k", ["rollout.top_k=0"], "rollout.top_k", "-1 (off) or >= 1"),
    ("negative_temperature", ["rollout.temperature=-1"], "rollout.temperature", ">= 0"),
    ("top_p_above_one", ["rollout.top_p=1.5"], "rollout.top_p", "(0, 1]"),
    ("zero_gpu_memory", ["rollout.gpu_memory_utilization=0"], "rollout.gpu_memory_utilization", "(0, 1]"),
    ("port_out_of_range", ["tracking.prometheus_port=70000"], "tracking.prometheus_port", "65535"),
    ("clamp_reversed", ["reward.clamp=[1,0]"], "reward.clamp", "low <= high"),
    ("zero_batch", ["data.train_batch_size=0"], "data.train_batch_size", ">= 1"),
    ("zero_prompt_length", ["data.max_prompt_length=0"], "data.max_prompt_length", ">= 1"),
    (
        "token_budget_below_a_row",
        ["actor.ppo_max_tokens_per_device=10"],
        "actor.ppo_max_tokens_per_device",
        "at least 24",
    ),
    (
        "flash_attention_on_cpu",
        ["model.attn_implementation=flash_attention_2"],
        "model.attn_implementation",
        "CUDA devices only",
    ),
    (
        "token_budget_below_a_row_on_megatron",
        ["actor.backend=megatron", "actor.log_prob_max_tokens_per_device=12"],
        "actor.log_prob_max_tokens_per_device",
        "at least 24",
    ),
    (
        "lora_on_megatron",
        ["actor.backend=megatron", "actor.lora.rank=8"],
        "actor.lora.rank",
        "fsdp engine feature",
    ),
    (
        "lora_reference_on_its_own_layout",
        ["actor.lora.rank=8", "actor.use_kl_loss=true", "ref.backend=megatron"],
        "ref",
        "adapters off",
    ),
    ("lora_init_unknown", ["actor.lora.init=pisa"], "actor.lora.init", "default"),
    ("lora_sync_adapter_without_lora", ["rollout.lora_sync=adapter"], "rollout.lora_sync", "actor.lora.rank"),
    (
        "lora_sync_adapter_on_hf",
        ["actor.lora.rank=8", "rollout.lora_sync=adapter"],
        "rollout.lora_sync",
        "hf rollout loads no LoRA adapters",
    ),
    ("lora_sync_unknown", ["rollout.lora_sync=adapters"], "rollout.lora_sync", "adapter"),
    # agent loops (rollout.agent)
    ("agent_loop_unknown", ["rollout.agent.loop=tools_agent"], "rollout.agent.loop", "tool_agent"),
    ("tool_agent_without_tools", ["rollout.agent.loop=tool_agent"], "rollout.agent.tools", "calculator"),
    (
        "tool_unknown",
        ["rollout.agent.loop=tool_agent", "rollout.agent.tools=[{{name: calculater}}]"],
        "rollout.agent.tools[0]",
        "calculator",
    ),
    (
        "tool_parser_unknown",
        [
            "rollout.agent.loop=tool_agent",
            "rollout.agent.tools=[{{name: calculator}}]",
            "rollout.agent.tool_parser=json",
        ],
        "rollout.agent.tool_parser",
        "hermes",
    ),
    ("env_agent_without_env", ["rollout.agent.loop=env_agent"], "rollout.agent.env", "reset(sample)"),
    ("openai_agent_without_program", ["rollout.agent.loop=openai_agent"], "rollout.agent.program", "OPENAI_BASE_URL"),
    (
        "agent_max_turns_zero",
        ["rollout.agent.loop=single_turn", "rollout.agent.max_turns=0"],
        "rollout.agent.max_turns",
        ">= 1",
    ),
    # placement of a rollout apart from the actor, and the modes that overlap them
    ("one_step_off_colocated", ["trainer.mode=one_step_off"], "trainer.mode", "pool of its own"),
    ("mode_unknown", ["trainer.mode=one_step"], "trainer.mode", "one_step_off"),
    ("async_colocated", ["trainer.mode=async"], "trainer.mode", "pool of its own"),
    ("negative_staleness", ["trainer.max_staleness=-1"], "trainer.max_staleness", ">= 0"),
    ("continue_without_the_service", ["rollout.on_replica_failure=continue"], "rollout.on_replica_failure", "async"),
    (
        "async_with_remax",
        [
            "trainer.mode=async",
            "algorithm.adv_estimator=remax",
            "placement.devices_per_node=2",
            "placement.pools=[{{name: train, roles: [actor], devices: 1}}, {{name: gen, roles: [rollout]}}]",
        ],
        "algorithm.adv_estimator",
        "greedy baseline",
    ),
    (
        "rollout_apart_local",
        [
            "placement.devices_per_node=2",
            "placement.pools=[{{name: train, roles: [actor], devices: 1}}, {{name: gen, roles: [rollout]}}]",
            "trainer.controller=local",
        ],
        "trainer.controller",
        "Ray actors",
    ),
    (
        "ref_apart_from_actor",
        [
            "actor.use_kl_loss=true",
            "placement.devices_per_node=2",
            "placement.pools=[{{name: train, roles: [actor, rollout], devices: 1}}, {{name: ref, roles: [ref]}}]",
        ],
        "placement.pools",
        "reference must share the actor's pool",
    ),
    # preference optimisation (algorithm.name dpo / online_dpo)
    ("algorithm_unknown", ["algorithm.name=dpo2"], "algorithm.name", "did you mean 'dpo'"),
    ("dpo_loss_unknown", ["algorithm.name=online_dpo", "algorithm.dpo.loss=hinge"], "algorithm.dpo.loss", "ipo"),
    ("dpo_beta_zero", ["algorithm.name=online_dpo", "algorithm.dpo.beta=0"], "algorithm.dpo.beta", "> 0"),
    (
        "dpo_odd_micro_batch",
        ["algorithm.name=online_dpo", "actor.ppo_micro_batch_size_per_device=3"],
        "actor.ppo_micro_batch_size_per_device",
        "whole (chosen, rejected) pairs",
    ),
    (
        "dpo_token_budget",
        ["algorithm.name=online_dpo", "actor.ppo_max_tokens_per_device=256"],
        "actor.ppo_max_tokens_per_device",
        "could part a chosen reply",
    ),
    ("dpo_with_kl_loss", ["algorithm.name=online_dpo", "actor.use_kl_loss=true"], "actor.use_kl_loss", "beta"),
    ("online_dpo_one_sample", ["algorithm.name=online_dpo", "rollout.n=1"], "rollout.n", "rollout.n=2 or more"),
    ("online_dpo_no_ref", ["algorithm.name=online_dpo", "ref.enable=false"], "ref.enable", "reference's log-probs"),
    (
        "dpo_on_rl_data",
        [
            "algorithm.name=dpo",
            "placement.pools=[{{name: hybrid, roles: [actor, rollout, ref]}}]",
            "actor.ppo_micro_batch_size_per_device=32",
            "data.train_files=[{no_reward_model}]",
        ],
        "data.train_files[0]",
        "lacks the column(s) chosen, rejected",
    ),
    ("unset_by_override", ["actor.optim.lr=???"], "actor.optim.lr", "sets no value"),
    # text of the recipe and overrides
    ("key_in_the_wrong_section", ["trainer.save_every=5"], "trainer.save_every", "checkpoint.save_every"),
    ("unknown_key", ["trainer.totl_steps=5"], "trainer.totl_steps", "did you mean 'total_steps'"),
    ("malformed_override", ["trainer.total_steps"], "override 'trainer.total_steps'", "KEY=VALUE"),
    ("wrong_type", ["trainer.total_steps=ten"], "trainer.total_steps", "ten"),
    # names and _target_s: each resolves to a callable before the run starts
    ("unknown_reward", ["reward.fn=no_such_reward"], "reward.fn", "unknown reward function"),
    ("reward_module_missing", ["reward.fn._target_=no_such_mod.fn"], "reward.fn._target_", "no_such_mod"),
    ("reward_target_not_callable", ["reward.fn._target_=os.sep"], "reward.fn", "os.sep"),
    ("no_reward", ["reward.fn=null"], "reward.fn", "no reward is configured"),
    ("reward_server_policy", ["reward.server={{on_timeout: wait}}"], "reward.server.on_timeout", "retry"),
    ("reward_server_port", ["reward.server={{port: 70000}}"], "reward.server.port", "[0, 65535]"),
    ("reward_server_timeout", ["reward.server={{timeout_s: 0}}"], "reward.server.timeout_s", "> 0"),
    ("reward_server_feedback", ["reward.server={{feedback: votes}}"], "reward.server.feedback", "preferences"),
    (
        "reward_server_preferences_of_one",
        ["reward.server={{feedback: preferences}}", "rollout.n=1"],
        "rollout.n",
        "compares the samples of a prompt group",
    ),
    (
        "reward_server_preferences_validation",
        ["reward.server={{feedback: preferences}}"],  # (the recipe validates on held-out prompts)
        "data.val_files",
        "validation generates one sample per prompt",
    ),
    (
        "reward_pool_in_an_sft_run",
        [
            "algorithm.name=sft",
            "reward.model={{_target_: verl.reward.hf_model.HFRewardModel, path: rm}}",
            "placement.pools=[{{name: hybrid, roles: [actor, reward]}}]",
        ],
        "placement.pools",
        "scores nothing",
    ),
    (
        "reward_pool_without_a_model",
        ["placement.pools=[{{name: hybrid, roles: [actor, rollout, ref, reward]}}]"],
        "placement.pools.0.roles",
        "reward.model is unset",
    ),
    ("unknown_estimator", ["algorithm.adv_estimator=grpoo"], "algorithm.adv_estimator", "did you mean 'grpo'"),
    (
        "estimator_not_callable",
        ["algorithm.adv_estimator._target_=os.sep"],
        "algorithm.adv_estimator._target_",
        "not a callable",
    ),
    ("policy_loss_missing", ["actor.policy_loss._target_=os.path.no_such_fn"], "actor.policy_loss", "no_such_fn"),
    # a callable with the wrong signature would fail on the first batch: refused now, with the call it must take
    ("estimator_signature", ["algorithm.adv_estimator._target_=math.sqrt"], "algorithm.adv_estimator", "math.sqrt"),
    (
        "policy_loss_signature",
        ["actor.policy_loss._target_=os.path.exists"],
        "actor.policy_loss",
        "fn(old_log_prob, log_prob, advantages, response_mask",
    ),
    ("kl_ctrl_signature", ["algorithm.kl_ctrl.type._target_=os.getcwd"], "algorithm.kl_ctrl.type", "os.getcwd"),
    (
        "estimator_unknown_kwarg",
        ["algorithm.adv_estimator={{_target_: verl.algos.advantages.rloo, gamma: 0.9}}"],
        "algorithm.adv_estimator",
        "unexpected keyword argument 'gamma'",
    ),
    ("plugin_missing", ["trainer.plugins=[no_such_plugin_mod]"], "trainer.plugins", "no_such_plugin_mod"),
    ("interpolation_unresolved", ["tracking.log_dir=${{trainer.nope}}/logs"], "tracking.log_dir", "trainer.nope"),
    ("interpolation_in_a_number", ["actor.optim.lr=${{trainer.nope}}"], "actor.optim.lr", "trainer.nope"),
    # one problem must not hide another
    ("n_zero_and_batch", ["rollout.n=0", "data.train_batch_size=7"], "rollout.n", "actor.ppo_mini_batch_size"),
    # files: the model folder, tokenizer, data and checkpoint exist and are what they should be
    ("model_missing", ["model.path=/no/such/model"], "model.path", "/no/such/model"),
    ("model_without_config", ["model.path={no_config}"], "model.path", "config.json"),
    ("model_without_tokenizer", ["model.path={no_tokenizer}"], "model.path", "no tokenizer"),
    ("tokenizer_missing", ["model.tokenizer_path=/no/such/tok"], "model.tokenizer_path", "/no/such/tok"),
    ("data_missing", ["data.train_files=[/no/such.parquet]"], "data.train_files[0]", "/no/such.parquet"),
    ("csv_named_parquet", ["data.train_files=[{not_parquet}]"], "data.train_files[0]", "{not_parquet}"),
    ("data_without_column", ["data.train_files=[{no_reward_model}]"], "data.train_files[0]", "reward_model"),
    ("data_empty", ["data.train_files=[{empty}]"], "data.train_files[0]", "no rows"),
    ("prompt_as_text", ["data.train_files=[{prompt_as_text}]"], "data.train_files[0]", "not chat messages"),
    ("val_data_missing", ["data.val_files=[/no/val.parquet]"], "data.val_files[0]", "/no/val.parquet"),
    (
        "sft_data_without_response",
        ["model.warm_start.files=[{sft_no_response}]"],
        "model.warm_start.files[0]",
        "response",
    ),
    (
        "warm_start_val_missing",
        ["model.warm_start.val_files=[/no/sft_val.parquet]"],
        "model.warm_start.val_files[0]",
        "/no/sft_val.parquet",
    ),
    ("resume_missing", ["trainer.resume=/no/such/ckpt"], "trainer.resume", "/no/such/ckpt"),
    ("resume_incomplete", ["trainer.resume={step_3}"], "trainer.resume", "COMPLETE"),
]


@pytest.mark.parametrize("overrides, culprit, text", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_before_anything_starts(overrides, culprit, text, files, capsys, tmp_path):
    # Its own output folder (first: a case may override it): the recipe's default may hold a real run's
    # checkpoints, which resume: auto compares with.
    code = cli.main(["train", RECIPE, f"trainer.output_dir={tmp_path}", *(o.format(**files) for o in overrides)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code == 2, err
    assert f"error: {culprit}" in err or f"{culprit}:" in err, err
    assert text.format(**files) in err, err


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


def test_the_python_api_checks_the_files_too_and_a_passed_reward_stands_in_for_reward_fn(tmp_path):
    import verl

    overrides = ["model.path=/no/such/model", "reward.fn=null", f"trainer.output_dir={tmp_path}"]
    with pytest.raises(verl.ConfigError) as info:
        verl.PPOTrainer(RECIPE, overrides=overrides, reward_fn=lambda **kw: 0.0)
    assert [p.key for p in info.value.problems] == ["model.path"]  # not reward.fn: the function was passed
