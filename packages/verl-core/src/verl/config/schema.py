"""The run configuration: one dataclass per recipe section.

OmegaConf checks types and unknown keys against these dataclasses. A field's metadata states what its type
cannot: `one_of(...)` the values it may take, `at_least(n)` its lower bound, `checked(...)` any other rule on
its value alone (`verl.config.fields`); `verl.config.validate` checks those generically and keeps only the checks
across fields (batch sizes that divide, layouts that fit the devices, installed backends). Keys that were removed
are in `REMOVED_KEYS`, each with what replaces it.
Sizes follow one convention: `*_batch_size` counts prompts, `*_per_device` counts samples on one worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from verl.config.fields import (  # noqa: F401  (field_types, strip_optional, is_section: read from here too)
    any_finite,
    at_least,
    checked,
    field_types,
    fraction,
    is_section,
    non_negative,
    one_of,
    positive,
    sampling_temperature,
    size,
    strip_optional,
)
from verl.memory_plan import ACCELERATORS

# reward: the reward model (reward.model) on worker processes, when a pool lists it (else it runs in the driver)
ROLES = ("actor", "rollout", "ref", "critic", "reward")


# Keys that no longer exist: what a recipe that still sets them should do instead.
REMOVED_KEYS = {
    "model.trust_remote_code": "remove it: verl builds Llama, Qwen2 and Qwen3 models with transformers' own classes",
    "rollout.log_prob_micro_batch_size_per_device": "use actor.log_prob_micro_batch_size_per_device (the trainer "
    "computes log-probs with the actor's engine)",
}


@dataclass
class ParallelConfig:
    """How one role splits its model over its workers: world = tp * pp * cp * dp (ep splits dp's experts)."""

    tp: int = size(1)
    pp: int = size(1)
    vpp: Optional[int] = size(None)  # virtual pipeline stages per pp rank (megatron interleaved schedule)
    cp: int = size(1)
    ep: int = size(1)  # megatron, mixture-of-experts models: experts split over ep ranks (carved out of dp*cp*tp/etp)
    etp: Optional[int] = size(None)  # megatron: tensor parallelism inside each expert; None: the same as tp
    dp: Optional[int] = size(None)  # None: derived from the devices of the role's pool
    # megatron: split activations along the sequence outside tensor-parallel regions; None: on when tp > 1
    sequence_parallel: Optional[bool] = None


@dataclass
class OptimConfig:
    lr: float = positive(1e-6)
    weight_decay: float = non_negative(0.01)
    betas: List[float] = checked(
        [0.9, 0.999],
        lambda b: len(b) == 2 and all(0 <= x < 1 for x in b),
        "must be two values in [0, 1), got {v}",
        "set {key}=[0.9,0.999]",
    )
    eps: float = positive(1e-8)
    warmup_steps: int = at_least(0, 0)
    scheduler: str = one_of("constant", "constant", "cosine")
    min_lr_ratio: float = fraction(0.0)
    grad_clip: float = positive(1.0)  # max gradient norm


@dataclass
class LoraConfig:
    """Low-rank adapters (peft) on a role's linear layers, the base weights frozen; rank 0: full training (fsdp)."""

    rank: int = at_least(0, 0)
    alpha: float = positive(16.0)  # adapters scale by alpha / rank
    dropout: float = checked(0.0, lambda p: 0 <= p < 1, "must be in [0, 1), got {v}", "set {key}=0.0")
    # "all-linear" (every linear layer but the output head) or module names, e.g. [q_proj, v_proj]
    target_modules: Any = "all-linear"
    # default: A random (Kaiming), B zero; gaussian: A normal. Both start as the base model exactly, which the
    # reference (the actor with its adapters off) relies on.
    init: str = one_of("default", "default", "gaussian")


@dataclass
class WarmStartConfig:
    """Supervised fine-tuning before RL (cached by these settings): prompt/response parquet files."""

    files: List[str] = MISSING  # parquet with columns prompt (chat messages) and response, or "embedded:arithmetic-sft"
    steps: int = at_least(200, 1)
    batch_size: int = at_least(64, 1)
    max_length: int = at_least(64, 1)  # tokens of prompt + response; longer examples are dropped and counted
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, weight_decay=0.0))
    # megatron MoE: its load-balancing loss while learning from scratch (a random router collapses without it)
    moe_aux_loss_coeff: float = non_negative(0.0)
    # Stop at the first check (every check_every steps) where greedy decoding reproduces at least this share of
    # val_files' responses, `steps` being the most: the run starts RL from the same skill whatever the CPU's
    # arithmetic does to the SFT trajectory. None: exactly `steps` steps.
    until_exact_match: Optional[float] = fraction(None)
    val_files: List[str] = field(default_factory=list)  # prompt/response parquet held out from `files`
    check_every: int = at_least(10, 1)


@dataclass
class ModelConfig:
    path: str = MISSING  # Hugging Face folder, or an embedded model such as "embedded:tiny-llama"
    tokenizer_path: Optional[str] = None  # None: the tokenizer saved with the model (model.path)
    dtype: str = one_of("bfloat16", "bfloat16", "float16", "float32")  # on GPU; CPU runs compute in float32
    gradient_checkpointing: bool = False
    # FSDP roles compute the samples of one prompt as one sequence, the prompt once, and pack those sequences
    # without padding (same outputs, fewer tokens; a 4D attention mask, where the model's attention takes one:
    # sdpa or eager; with flash-attention, which takes none, every row's real tokens in one padding-free stream)
    shared_prefix: bool = True
    # the FSDP roles' attention (Hugging Face's attn_implementation); flash_attention_2/3 need CUDA and the
    # flash-attn package, and run packed rows through their variable-length kernels
    attn_implementation: str = one_of("sdpa", "sdpa", "eager", "flash_attention_2", "flash_attention_3")
    override_config: Dict[str, Any] = field(default_factory=dict)
    warm_start: Optional[WarmStartConfig] = None  # SFT before RL


@dataclass
class DataConfig:
    train_files: List[str] = MISSING  # parquet files in verl's RL format, or "embedded:arithmetic"
    val_files: List[str] = field(default_factory=list)
    prompt_key: str = "prompt"
    max_prompt_length: int = at_least(512, 1)
    max_response_length: int = at_least(512, 1)
    train_batch_size: int = at_least(MISSING, 1)  # prompts per step
    val_batch_size: Optional[int] = at_least(None, 1)  # None: the whole validation set at once
    shuffle: bool = True
    filter_overlong_prompts: bool = True
    dataset: Optional[Dict[str, Any]] = None  # {_target_: pkg.Dataset, ...} replaces the parquet dataset


@dataclass
class KLControlConfig:
    type: str = "fixed"  # a KL controller name (verl.algos): fixed | adaptive
    kl_coef: float = non_negative(0.001)
    target_kl: float = positive(0.1)
    horizon: int = at_least(10000, 1)


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: drop prompt groups whose samples all scored the same (zero advantage)."""

    enable: bool = False
    metric: str = one_of("seq_reward", "seq_reward")  # compared within a group: each sample's summed token scores
    max_num_gen_batches: int = at_least(0, 0)  # rollout batches to try filling one training batch; 0: no limit


@dataclass
class OverlongBufferConfig:
    """DAPO soft overlong punishment: a linear penalty over the last `len` tokens before max_response_length."""

    enable: bool = False
    len: int = at_least(0, 0)  # buffer length in tokens, 1..data.max_response_length
    penalty_factor: float = non_negative(1.0)  # penalty at max_response_length


@dataclass
class DPOConfig:
    """Preference optimisation (algorithm.name dpo / online_dpo) against the reference model."""

    loss: str = "sigmoid"  # a DPO_LOSSES name (verl.algos.dpo): sigmoid (DPO, cDPO with label_smoothing) | ipo
    beta: float = positive(0.1)  # strength of the pull towards the reference
    label_smoothing: float = checked(
        0.0, lambda e: 0 <= e < 0.5, "must be in [0, 0.5), got {v}", "set {key}=0.0 (or e.g. 0.1 for cDPO)"
    )
    # > 0 adds nll_weight * the chosen response's per-token NLL (RPO; TRL's rpo_alpha): keeps the chosen likelihood
    # up when pairs share most tokens (a right answer against a near miss), where the preference term alone lowers it
    nll_weight: float = checked(0.0, lambda a: a >= 0, "must be >= 0, got {v}", "set {key}=0.0 (off) or e.g. 1.0")


# What algorithm.name selects: the trainer (verl.trainer.registry) and the kind of update.
ALGORITHMS = ("ppo", "grpo", "dpo", "online_dpo", "sft")
PREFERENCE_ALGORITHMS = ("dpo", "online_dpo")


@dataclass
class AlgorithmConfig:
    # ppo | grpo: policy gradient with algorithm.adv_estimator's advantages (PPOTrainer); dpo: preference pairs
    # from data.train_files (DPOTrainer); online_dpo: rollout.n samples per prompt ranked by the reward, the best
    # and the worst as a pair; sft: supervised fine-tuning on data.train_files (SFTTrainer: no rollout, validation
    # loss on data.val_files). None: policy gradient (as ppo/grpo)
    name: Optional[str] = one_of(None, *ALGORITHMS)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    # Registry names (verl.algos), or {_target_: pkg.module.fn, **kwargs}:
    adv_estimator: Any = "grpo"  # gae, grpo, drgrpo, rloo, reinforce_plus_plus(_baseline), remax, opo
    gamma: float = fraction(1.0)
    lam: float = fraction(1.0)
    norm_adv_by_std_in_grpo: bool = True  # False gives Dr.GRPO
    use_kl_in_reward: bool = False
    kl_penalty: Any = "low_var_kl"  # k1 | abs | mse | low_var_kl | full
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)


@dataclass
class ActorConfig:
    backend: str = "fsdp"  # fsdp | megatron
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = at_least(MISSING, 1)  # prompts per optimizer step (times rollout.n samples)
    ppo_micro_batch_size_per_device: int = at_least(1, 1)  # samples per forward/backward on one worker
    # micro-batches cut by tokens (prompt + response, per device) instead of rows; None: by rows
    ppo_max_tokens_per_device: Optional[int] = at_least(None, 1)
    ppo_epochs: int = at_least(1, 1)
    policy_loss: Any = "vanilla"  # registry name: vanilla (PPO clip), dual_clip, gspo, cispo, or {_target_: ...}
    clip_ratio: float = any_finite(0.2)  # its range: algorithm_checks.check_policy_loss (with low/high)
    clip_ratio_low: Optional[float] = any_finite(None)  # None: clip_ratio
    clip_ratio_high: Optional[float] = any_finite(None)  # None: clip_ratio (DAPO clip-higher sets it larger)
    clip_ratio_c: float = checked(3.0, lambda c: c > 1, "the dual-clip bound must be > 1, got {v}", "set {key}=3.0")
    # truncated IS weight min(pi_old/pi_rollout, cap); None: off
    tis_imp_ratio_cap: Optional[float] = checked(
        None, lambda cap: cap > 0, "must be > 0, got {v}", "set it to e.g. 2.0, or null to turn truncated IS off"
    )
    loss_agg_mode: Any = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
    # seq-mean-token-sum-norm divisor; None: the padded response length
    loss_norm_length: Optional[int] = checked(
        None, lambda n: n >= 1, "must be >= 1, got {v}", "set it to data.max_response_length, or null"
    )
    entropy_coeff: float = any_finite(0.0)  # < 0 rewards low entropy
    # with entropy_coeff 0 the entropy is only a metric: measured on every this many steps, the first and the last;
    # 0: never
    entropy_every: int = at_least(10, 0)
    use_kl_loss: bool = False
    kl_loss_coef: float = non_negative(0.001)
    kl_loss_type: Any = "low_var_kl"  # a KL estimator name, as algorithm.kl_penalty
    log_prob_micro_batch_size_per_device: int = at_least(8, 1)  # samples per log-prob forward on one worker
    log_prob_max_tokens_per_device: Optional[int] = at_least(None, 1)  # the log-prob pass cut by tokens
    # auto: an on-policy update (1 epoch, 1 mini-batch, no in-reward KL) takes its old log-probs from its own
    # forward (detached) instead of a pass before it; always: that pass every step
    recompute_old_log_probs: str = one_of("auto", "auto", "always")
    use_fused_kernels: bool = False
    fused_kernel_impl: str = "torch"  # torch | triton (a kernels backend)
    # host memory between phases (verl.utils.offload): the parameters (and megatron's gradient buffers) after the
    # weight sync, so a colocated rollout wakes into the freed memory; the optimizer state except while it steps
    param_offload: bool = False
    optimizer_offload: bool = False
    # LoRA: only adapters train; the reference is this model with its adapters off (no second model)
    lora: LoraConfig = field(default_factory=LoraConfig)
    # megatron MoE: its load-balancing loss per routed layer (megatron's formula, not HF's router_aux_loss_coef), 0: off
    moe_aux_loss_coeff: float = non_negative(0.0)
    # megatron MoE: r2, the update replays the experts the old-log-prob pass took; r3, every actor pass replays the
    # experts the rollout took (hf rollout)
    routing_replay: str = one_of("none", "none", "r2", "r3")
    # a vision-language model: its vision tower kept as loaded (Qwen-VL's holds the merger that projects into the
    # language model too); the language model trains
    freeze_vision_tower: bool = False


@dataclass
class AgentConfig:
    """Multi-turn rollouts (verl.agents): an agent loop per sample, its model turns served by the rollout."""

    # None: one completion per sample (batched, as without agents); a registered loop (single_turn, tool_agent,
    # env_agent) or {_target_: pkg.module.async_loop, **settings}
    loop: Any = None
    tools: List[Any] = field(default_factory=list)  # [{name: calculator}, {_target_: pkg.module.Tool, ...}]
    tool_parser: str = "hermes"  # how tool calls are read from a model turn (verl.agents.parsers): hermes | plain
    max_turns: int = at_least(4, 1)  # model turns per trajectory
    tool_timeout_s: float = positive(10.0)  # per call; a call over it is answered "took longer than ..."
    max_wall_s: Optional[float] = positive(None)  # per trajectory (None: no limit); over it, it ends where it is
    max_in_flight: int = at_least(1024, 1)  # trajectories running at once
    env: Any = None  # env_agent: {_target_: pkg.module.Env, ...} with reset(sample) and step(action)
    # openai_agent: an external agent program talking to the run's OpenAI-compatible endpoint:
    # pkg.module.fn(base_url, api_key, sample) -> answer | None, or a command line [python, agent.py, ...]
    program: Any = None


@dataclass
class RolloutConfig:
    backend: str = "hf"  # hf | vllm | sglang
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # generation layout: tp (and derived dp)
    n: int = at_least(1, 1)  # samples per prompt
    temperature: float = sampling_temperature(1.0)
    top_p: float = checked(
        1.0, lambda p: 0 < p <= 1, "must be in (0, 1], got {v}", "set {key}=1.0 (off) or a value in (0, 1)"
    )
    top_k: int = checked(-1, lambda k: k == -1 or k >= 1, "must be -1 (off) or >= 1, got {v}", "set {key}=-1")
    max_new_tokens: Optional[int] = at_least(None, 1)  # None: data.max_response_length
    gpu_memory_utilization: float = checked(
        0.5,
        lambda f: 0 < f <= 1,
        "must be in (0, 1], got {v}",
        "set {key}=0.5 (the share of GPU memory vLLM/SGLang take)",
    )
    enforce_eager: bool = False
    free_cache_engine: bool = True  # release the KV cache while the actor trains (sleep/wake)
    # With actor.lora, what a rollout with its own weights receives after each update: merged (the base with the
    # adapters merged in; any engine) or adapter (the adapters alone, served by the engine's LoRA support: vllm)
    lora_sync: str = one_of("merged", "merged", "adapter")
    val_temperature: float = sampling_temperature(0.0)  # sampling temperature of validation; 0: greedy
    # samples per held-out prompt at val_sample_temperature, besides the val_temperature one: val/pass@k (k = 1, 2,
    # 4, ... and val_n; the unbiased estimator), val/mean@val_n, val/maj@val_n; 0: none
    val_n: int = at_least(0, 0)
    val_sample_temperature: float = sampling_temperature(1.0)
    # a rollout on a pool of its own receives the actor's weights over a collective group in buckets of this size
    weight_sync_bucket_mb: int = at_least(256, 1)
    # every this many weight syncs, check that the rollout engine holds exactly the weights it was sent (a fingerprint
    # of each parameter on both sides, verl.workers.weight_check); a mismatch stops the run naming the parameter,
    # rank and step; 0: never
    verify_weights_every: int = at_least(1, 0)
    # the rollout service (trainer.mode=async): tokens a request gains per engine turn (a weight update waits at
    # most one turn), and requests per turn on a replica
    service_chunk_tokens: int = at_least(32, 1)
    service_max_batch: int = at_least(256, 1)
    # the rollout service: a replica that fails stops the run (naming it), or is dropped and its requests go to the
    # others (continue; the run stops when none is left)
    on_replica_failure: str = one_of("stop", "stop", "continue")
    agent: AgentConfig = field(default_factory=AgentConfig)


@dataclass
class RefConfig:
    enable: Optional[bool] = None  # None: on when actor.use_kl_loss or algorithm.use_kl_in_reward
    backend: Optional[str] = None  # None: the actor's backend
    parallel: Optional[ParallelConfig] = None  # None: the actor's layout
    log_prob_micro_batch_size_per_device: int = at_least(8, 1)
    log_prob_max_tokens_per_device: Optional[int] = at_least(None, 1)  # the log-prob pass cut by tokens
    param_offload: bool = False  # parameters in host memory except during its log-prob pass


@dataclass
class CriticConfig:
    enable: Optional[bool] = None  # None: on when the advantage estimator needs values (gae)
    backend: str = "fsdp"
    model_path: Optional[str] = None  # None: initialise from model.path with a fresh value head
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: Optional[int] = at_least(None, 1)  # None: actor.ppo_mini_batch_size
    ppo_micro_batch_size_per_device: int = at_least(1, 1)  # samples per forward/backward (and value pass)
    ppo_max_tokens_per_device: Optional[int] = at_least(None, 1)  # the update and value pass cut by tokens
    ppo_epochs: Optional[int] = at_least(None, 1)  # None: actor.ppo_epochs
    # host memory between phases: the parameters and gradient buffers after the update, the optimizer state except
    # while it steps
    param_offload: bool = False
    optimizer_offload: bool = False
    cliprange_value: float = positive(0.5)
    loss_agg_mode: Any = "token-mean"
    lora: LoraConfig = field(default_factory=LoraConfig)  # adapters on the trunk; the value head trains in full


@dataclass
class RewardServerConfig:
    """An HTTP service through which people or other services score the run's samples (verl.api.RewardServer)."""

    host: str = "127.0.0.1"  # loopback; 0.0.0.0 serves every interface
    port: int = checked(
        0, lambda p: 0 <= p <= 65535, "must be a port in [0, 65535] (0: any free port), got {v}", "set {key}=0"
    )
    # the bearer token clients send, read from this environment variable; unset: a random token, written with the
    # server's URL to <trainer.output_dir>/reward_server.json (readable by the user only)
    token_env: str = "VERL_REWARD_TOKEN"
    store: Optional[str] = None  # where samples and accepted scores are kept; None: <trainer.output_dir>/reward_server
    timeout_s: float = positive(600.0)  # how long a batch waits for its scores
    # then: default (the missing score default_score), skip (drop the prompt groups with a missing score), retry
    # (wait again, up to max_retries more times, then stop)
    on_timeout: str = one_of("default", "default", "skip", "retry")
    default_score: float = any_finite(0.0)
    max_retries: int = at_least(3, 0)
    # what clients post: scores (one per sample), or preferences between two samples of a prompt group (each
    # sample then scores its wins minus its losses in its group; a group without a preference is missing)
    feedback: str = one_of("scores", "scores", "preferences")
    max_body_kb: int = at_least(256, 1)  # larger requests are refused (413)
    rate_per_s: float = positive(20.0)  # requests a second per client address (429 above)


@dataclass
class RewardConfig:
    fn: Any = None  # a registered reward function name, or {_target_: pkg.module.fn, **kwargs}
    # A sample whose reward function raises or returns no number: stop the run naming it (raise), or give it
    # error_score, count it (reward/fn_errors) and warn (score).
    on_error: str = one_of("raise", "raise", "score")
    error_score: float = any_finite(0.0)
    model: Optional[Dict[str, Any]] = None  # a reward model: {_target_: pkg.Model, **kwargs}
    server: Optional[RewardServerConfig] = None  # scores from external clients over HTTP (added to the others)
    # each source's weight in the sum of the configured sources (fn: reward.fn or a reward_fn passed in code,
    # model, server); a source not named weighs 1
    weights: Dict[str, float] = checked(
        {},
        lambda w: set(w) <= {"fn", "model", "server"},
        "names sources fn, model and server only, got {v}",
        "write e.g. {key}={{fn: 1.0, model: 0.5}}",
    )
    # [low, high] applied to scores; NaN/inf are counted and clamped
    clamp: Optional[List[float]] = checked(
        None,
        lambda c: len(c) == 2 and c[0] <= c[1],
        "must be [low, high] with low <= high, got {v}",
        "set {key}=[-1,1]",
    )


@dataclass
class PoolConfig:
    """A set of devices whose roles share them (colocated: the hybrid engine)."""

    name: str = MISSING
    roles: List[str] = MISSING
    devices: Optional[int] = size(None)  # None: every device not taken by the pools before it


@dataclass
class PlacementConfig:
    nnodes: int = size(1)
    devices_per_node: int = size(1)  # GPUs per node, or worker processes per node on CPU
    device: str = one_of("cpu", "cpu", "cuda")
    # Memory of one device, for the memory plan (verl.memory_plan): validate and train refuse a layout whose
    # estimated peak does not fit, before anything starts. None: the accelerator's; neither: not checked.
    device_memory_gb: Optional[float] = positive(None)
    accelerator: Optional[str] = one_of(None, *ACCELERATORS)  # a known device: its memory
    # CPU: torch threads of each worker process; None: OMP_NUM_THREADS when set, else the node's cores / its workers
    threads_per_worker: Optional[int] = at_least(None, 1)
    pools: List[PoolConfig] = field(
        default_factory=lambda: [PoolConfig(name="hybrid", roles=["actor", "rollout", "ref", "critic"])]
    )


@dataclass
class PlannerConfig:
    """The throughput model's assumptions (verl.throughput_model) for `verl plan --suggest`; None: the
    accelerator's (placement.accelerator)."""

    peak_tflops: Optional[float] = positive(None)  # dense bf16 TFLOP/s of one device
    hbm_gbps: Optional[float] = positive(None)  # device memory bandwidth, GB/s
    node_link_gbps: Optional[float] = positive(None)  # GB/s per device between devices of a node (NVLink)
    network_gbps: Optional[float] = positive(None)  # GB/s per device between nodes
    mfu: Optional[float] = checked(None, lambda v: 0 < v <= 1, "must be in (0, 1], got {v}", "set {key}=0.4")


@dataclass
class TrackingConfig:
    # console | jsonl | wandb | tensorboard | prometheus
    loggers: List[str] = field(default_factory=lambda: ["console"])
    project: str = "verl"
    experiment: str = "run"
    wandb_mode: str = one_of("online", "online", "offline", "disabled")
    log_dir: Optional[str] = None  # None: <trainer.output_dir>/logs
    # with the jsonl logger: <log_dir>/curves.png of reward, held-out accuracy and tokens/s when the run ends
    # (needs matplotlib: pip install 'verl-core[plot]')
    curves: bool = True
    prometheus_host: str = "127.0.0.1"  # the address the exporter listens on; 0.0.0.0: every interface
    prometheus_port: int = checked(
        9464, lambda p: 0 <= p <= 65535, "must be a port in [0, 65535] (0: any free port), got {v}", "set {key}=9464"
    )


@dataclass
class CheckpointConfig:
    save_every: int = at_least(0, 0)  # steps; 0: only at the end (save_last)
    save_last: bool = True  # a checkpoint of the last step (to resume or extend the run from); false: none at the end
    keep_last: int = at_least(2, 1)
    dir: Optional[str] = None  # None: <trainer.output_dir>/checkpoints
    save_hf: bool = False  # at the end of the run, also write the actor as a Hugging Face folder: <output_dir>/hf


@dataclass
class ProfileConfig:
    """A trace of steps first..last (inclusive): the driver's stages per step, and Ray's timeline under Ray."""

    steps: List[int] = checked(
        [],
        lambda s: len(s) == 2 and 1 <= s[0] <= s[1],
        "must be [first, last] with 1 <= first <= last, got {v}",
        "set {key}=[2,3]",
    )
    dir: Optional[str] = None  # None: <trainer.output_dir>/profile


@dataclass
class StopWhenConfig:
    """End the run at the first validation where `metric` is at least `at_least` (or at most `at_most`)."""

    metric: str = MISSING  # a validation metric: val/accuracy (RL), val/exact_match or val/loss (SFT), ...
    at_least: Optional[float] = any_finite(None)
    at_most: Optional[float] = any_finite(None)


@dataclass
class TrainerConfig:
    total_steps: Optional[int] = at_least(None, 1)  # None: total_epochs over the training data
    total_epochs: int = at_least(1, 1)
    seed: int = at_least(1, 0)
    output_dir: str = "outputs/${tracking.project}/${tracking.experiment}"
    val_every: int = at_least(0, 0)  # steps; 0: off
    val_before_train: bool = True
    log_every: int = at_least(1, 1)
    resume: str = "auto"  # auto | disable | <checkpoint dir>
    # auto: in-process workers for a one-device run (no Ray start-up), Ray actors otherwise; ray; local (in-process,
    # for debugging with breakpoint())
    controller: str = one_of("auto", "auto", "ray", "local")
    plugins: List[str] = field(default_factory=list)  # modules imported first: custom registry entries
    # place each step's prompt groups on the actor's data-parallel ranks by token count (a no-op at DP 1). Off by
    # default: today's engines compute padded or packed rows whose cost follows their shape, not their tokens
    # (benchmarks/results/balance_ranks_cpu.md); it pays with variable-length attention
    balance_ranks: bool = False
    # what balance_ranks evens out: tokens, or tokens plus each sequence's attention (its query-key pairs, weighted
    # ~1/(6 hidden) of a token's dense cost: what long sequences add)
    balance_cost: str = one_of("tokens", "tokens", "attention")
    # sync: every step generates, then trains (the rollout waits for the update, the actor for generation).
    # one_step_off: the rollout, on a pool of its own, generates step k+1's batch with the weights of step k-1's
    # update while the actor trains on step k (samples one update old; old log-probs recomputed by the actor).
    # async: the rollout service runs up to max_staleness batches ahead; new weights reach it between two of its
    # turns and samples midway continue under them (partial rollouts)
    mode: str = one_of("sync", "sync", "one_step_off", "async")
    # async: a sample trains on a policy at most this many updates newer than the oldest that sampled its tokens
    max_staleness: int = at_least(1, 0)
    # async: a sample over max_staleness (a replica that missed weight updates; the admission rule keeps the others
    # inside it) has its prompt group generated again under the current policy (regenerate), or left out of the
    # step (drop: the step trains on the other groups, as many as whole data-parallel shares allow)
    on_stale: str = one_of("regenerate", "regenerate", "drop")
    profile: Optional[ProfileConfig] = None  # a trace of a range of steps (verl.trainer.profile)
    stop_when: Optional[StopWhenConfig] = None  # early stopping on a validation metric (checked when validating)


@dataclass
class VerlConfig:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
