"""The backend interface: what a training engine and a rollout engine must do.

Role workers (`verl.workers`) are written once against these protocols; verl-fsdp and verl-megatron
implement `TrainEngine`, verl-rollout's hf/vllm/sglang implement `RolloutEngine`. The core never imports a
backend: `load_engine` finds the class through the backend's `BackendSpec.engine` entry.

Batch layout shared by every engine (one row per sample):
  input_ids [B, P+R]     prompt (left-padded) followed by the response (right-padded)
  attention_mask [B, P+R], position_ids [B, P+R]
  responses [B, R], response_mask [B, R]   (1 on generated tokens, up to and including eos)
Per-token outputs are aligned with `responses`: out[:, t] belongs to responses[:, t].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterable,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Tuple,
)

import torch

from verl.backends import BackendSpec, installed_backends
from verl.config.schema import RolloutConfig
from verl.protocol import DataProto

Metrics = Dict[str, float]
# loss_fn(outputs, micro_batch) -> (loss, metrics): outputs holds "log_probs"/"entropy" (policy) or "values" (critic).
LossFn = Callable[[Dict[str, torch.Tensor], DataProto], Tuple[torch.Tensor, Metrics]]
Weights = Iterable[Tuple[str, torch.Tensor]]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Shard(NamedTuple):
    """One rank's block of a tensor, in Hugging Face names (`weight_shards`): the ranks' blocks, joined along `dim`
    in rank order, are the whole tensor. `sizes`: every rank's extent along `dim` (the same list on every rank);
    empty: the rows torch.chunk gives each rank (FSDP's dim-0 shards)."""

    name: str
    part: torch.Tensor
    shape: Tuple[int, ...]  # the whole tensor's
    dim: int = 0
    sizes: Sequence[int] = ()


@dataclass
class EngineConfig:
    """What a worker asks of a train engine, gathered from the role's config section."""

    model_path: str  # a Hugging Face folder
    tokenizer_path: Optional[str] = None  # where the tokenizer files come from for exports; None: model_path
    kind: str = "causal_lm"  # causal_lm (actor, reference) | value (critic: a scalar head per token)
    optim: Optional[Any] = None  # verl.config.schema.OptimConfig; None: inference only (the reference)
    total_steps: int = 1  # optimizer steps the LR schedule spans
    device: str = "cpu"
    dtype: str = "bfloat16"  # parameter/compute dtype on GPU; CPU always computes in float32
    gradient_checkpointing: bool = False
    param_offload: bool = False  # parameters in host memory between phases (release_memory() sends them)
    optimizer_offload: bool = False  # optimizer state in host memory except while it steps, saves or loads
    use_fused_kernels: bool = False
    shared_prefix: bool = True  # rows with the same prompt computed as one sequence (verl.utils.shared_prefix)
    attn_implementation: str = "sdpa"  # Hugging Face's, for engines that run HF modules (fsdp)
    lora: Optional[Any] = None  # verl.config.schema.LoraConfig with rank >= 1: train adapters only; None: full
    fused_kernel_impl: str = "torch"
    seed: int = 1
    parallel: Optional[Any] = None  # the role's Layout from the plan, or a ParallelConfig (backends that split use it)
    moe_aux_loss_coeff: float = 0.0  # a mixture of experts' load-balancing loss (megatron's formula); 0: off
    freeze_vision_tower: bool = False  # a vision-language model's vision tower (and projector) not trained
    override_config: Dict[str, Any] = field(default_factory=dict)

    def compute_dtype(self) -> torch.dtype:
        """`dtype` on GPU; float32 on CPU (bf16 matmuls there are slow and would blur the parity tests)."""
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype '{self.dtype}' is not one of {', '.join(DTYPES)}")
        return torch.float32 if self.device == "cpu" else DTYPES[self.dtype]

    def torch_device(self) -> torch.device:
        """Where the engine computes: the CPU, or the CUDA device this process was given."""
        return torch.device("cpu") if self.device == "cpu" else torch.device("cuda", torch.cuda.current_device())

    def hf_config(self) -> Any:
        """The model's Hugging Face config with model.override_config applied (each key an existing attribute)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.model_path)
        for key, value in self.override_config.items():
            if not hasattr(config, key):
                raise ValueError(f"model.override_config.{key}: {type(config).__name__} has no attribute '{key}'")
            setattr(config, key, value)
        return config


def eos_and_pad(tokenizer: Any) -> Tuple[List[int], int]:
    """The tokenizer's eos ids, as a list, and its pad id (the first eos id when it has none): the one place they are
    normalised."""
    eos = tokenizer.eos_token_id
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return eos_ids, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]


# A mixture of experts' routes, [B, S, routed layers, k] int16 in the batch layout (-1: not computed), recorded by one
# pass and replayed by later ones (actor.routing_replay).
ROUTED_EXPERTS = "routed_experts"


@dataclass(frozen=True)
class RolloutSettings:
    """What a rollout engine is built from besides its config section (`rollout`): the run's lengths, its token ids,
    and where and how it computes (`verl.workers.build_engines.rollout_settings` makes them from the run)."""

    max_new_tokens: int  # the run's response length: every generate call's responses are this wide (or narrower)
    eos_ids: Tuple[int, ...]  # a response ends at the first of these (none: it runs to its length)
    pad_id: int  # what pads prompts on the left and responses on the right
    max_prompt_length: int = 0  # the longest prompt (0: the engine's own limit)
    device: str = "cpu"
    dtype: str = "bfloat16"  # what a serving engine computes in on GPU (the CPU ones compute in float32)
    seed: int = 1
    lora_rank: int = 0  # the rank of the adapters it will be sent (rollout.lora_sync: adapter); 0: full weights
    routes: bool = False  # also return the experts each token went to (ROUTED_EXPERTS; actor.routing_replay=r3)

    def __post_init__(self) -> None:
        object.__setattr__(self, "eos_ids", tuple(int(i) for i in self.eos_ids))

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, **fields: Any) -> "RolloutSettings":
        """The settings with `tokenizer`'s eos and pad ids (`eos_and_pad`)."""
        eos_ids, pad_id = eos_and_pad(tokenizer)
        return cls(eos_ids=tuple(eos_ids), pad_id=pad_id, **fields)


class TrainEngine(Protocol):
    """A model being trained (or only evaluated, for the reference) on this worker's shard of the role.

    The parts every engine shares (micro-batch accumulation, the skip policy for a non-finite gradient, the LR
    schedule, the extra checkpoint state) live once in `verl.engine_skeleton`. An engine that splits the model
    (megatron) may also offer `weights(gen_tp=g)`: this rank's shard for a rollout with tensor parallelism g.
    """

    @property
    def model(self) -> Any:
        """The model as the engine trains it: one Hugging Face module (fsdp; what `gathered` unshards), or the
        backend's own form (megatron's model chunks)."""

    # ---- optional capabilities: every engine declares them, None / 0 where it has none (no hasattr probing)
    @property
    def gathered(self) -> Optional[Callable[[], ContextManager[torch.nn.Module]]]:
        """A context that holds the engine's `model` (one Hugging Face module in this process) unsharded while it is
        entered: a colocated hf rollout generates on it in place (FSDP). None where the model is not one HF module
        (megatron's chunks); the rollout then keeps its own copy and takes `weights()`."""

    def sync_received_bytes(self) -> int:
        """Bytes that reached this rank from other ranks while the last `weights()` pass assembled full tensors
        (tensor-parallel gathers, pipeline broadcasts), reported with each weight sync; 0 where none is counted."""

    def weight_shards(self) -> Optional[Iterator[Shard]]:
        """This rank's block of every tensor (a `Shard` each, in the same order on every rank; an empty block where
        the rank holds none), for a rollout on a pool of its own that then receives from every rank with nothing
        gathered (verl.workers.weight_transfer.send_weight_shards); collective. None where the engine cannot (LoRA's
        merged weights, a mixture of experts' fused experts): rank 0 then sends `weights()`."""

    def infer(
        self, batch: DataProto, *, micro_batch_size: int, temperature: float = 1.0, entropy: bool = False
    ) -> DataProto:
        """Per-token log_probs (and entropy) of `responses`, or per-token `values` for a value model. An engine
        that cuts micro-batches by tokens (fsdp) also takes `max_tokens`; the workers pass it only when set."""

    def train_step(
        self,
        batch: DataProto,
        loss_fn: LossFn,
        *,
        micro_batch_size: int,
        temperature: float = 1.0,
        entropy: bool = False,
        entropy_grad: bool = True,
    ) -> Metrics:
        """One optimizer step over `batch` with gradient accumulation over micro-batches; returns the loss's metrics
        (averaged as engine_skeleton.Accumulator weighs micro-batches) with grad_norm, lr and, when a non-finite
        gradient skipped the update, skipped_steps=1. `max_tokens` as in `infer`.
        entropy: compute `entropy` for the loss; entropy_grad: whether its gradient is needed (fused kernels)."""

    def weights(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """Full (unsharded) parameters one tensor at a time, in Hugging Face names; collective on all ranks.
        With LoRA adapters, the base with the adapters merged in."""

    def lora_adapter(self) -> Optional[Tuple[Dict[str, Any], Weights]]:
        """With LoRA adapters: (their peft adapter_config as a dict, the adapter tensors, full, under peft's saved
        names), for a rollout that loads adapters (`RolloutEngine.load_adapter`); collective. None without LoRA."""

    def data_parallel_info(self) -> Tuple[int, int, bool]:
        """(dp_rank, dp_size, collect): which slice of a batch this rank takes, and whether its outputs are
        gathered (one rank per data-parallel replica returns results; TP/PP peers compute the same rows)."""

    def save_checkpoint(self, path: str) -> None:
        """The backend's model/optimizer state in its own format, plus `engine_skeleton.save_extra`; collective."""

    def load_checkpoint(self, path: str) -> None: ...

    def export_hf(self, path: str) -> None:
        """Write a Hugging Face folder (safetensors, config, tokenizer); collective, rank 0 writes."""

    def held_bytes(self) -> Dict[str, int]:
        """This rank's state counted from its tensors: {"params", "grads", "optimizer"} in bytes (the backend's
        memory model estimates the same before launch)."""

    def release_memory(self) -> None:
        """Send the parameters to host memory when `param_offload` asks (the next call that needs them brings them
        back) and return cached device blocks, so another phase on these devices (generation) gets the memory."""


class RolloutEngine(Protocol):
    """Generates responses for prompts; its weights follow the actor's after every update."""

    @classmethod
    def build(
        cls, cfg: RolloutConfig, *, model_path: str, settings: RolloutSettings, actor: Optional[TrainEngine] = None
    ) -> Any:
        """The engine for the `rollout` config section `cfg`, beside the colocated actor engine (None when the
        worker holds none). An engine takes what it uses from `settings`."""

    def generate(
        self, prompts: DataProto, *, n: int, temperature: Optional[float] = None, max_new_tokens: int = 0
    ) -> DataProto:
        """Sample at `temperature` (None: the recipe's rollout.temperature; 0: greedy), at most `max_new_tokens`
        per sample (0: the run's response length; the rollout service generates in chunks of fewer).

        prompts: input_ids/attention_mask/position_ids [B, P]. Returns B*n rows (samples of one prompt
        adjacent) with input_ids, attention_mask, position_ids, prompts, responses, response_mask and
        rollout_log_probs; non-tensor columns are repeated alongside."""

    def update_weights(self, weights: Weights) -> int:
        """Load new weights in place; returns the bytes received (0 when the weights are shared)."""

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


class AdapterRolloutEngine(RolloutEngine, Protocol):
    """A rollout engine with LoRA support (vllm): rollout.lora_sync=adapter sends it the adapters alone."""

    def load_adapter(self, config: Dict[str, Any], weights: Weights) -> int:
        """Serve the actor's LoRA adapters (peft format) on the base weights it holds, replacing the last ones;
        returns the bytes received."""


class CheckedRolloutEngine(RolloutEngine, Protocol):
    """A rollout engine whose weights can be checked after a sync (verl.workers.weight_check; hf, vllm)."""

    def fingerprint_key(self, name: str) -> Any:
        """verl.workers.weight_check.Target: the parameter checkpoint tensor `name` (or an adapter tensor) is loaded
        into, its dtype and scale; None when the engine holds none for it (a head tied to the input embedding).
        KeyError when no parameter can take it."""

    def weight_fingerprints(self) -> Optional[Dict[str, Optional[Tuple[int, int]]]]:
        """This rank's fingerprint of each parameter (its shard of a tensor-parallel one; None for one held in a
        form that cannot be read back); None when there is nothing to check (the actor's own module, shared)."""


class SteppedRolloutEngine(RolloutEngine, Protocol):
    """A rollout engine with a scheduler of its own (vllm): it offers request-level stepping, and the rollout
    service then lets it batch continuously instead of calling `generate` in turns (verl.workers.rollout_server)."""

    def add_request(self, request_id: str, prompt: List[int], *, temperature: float, max_tokens: int) -> None:
        """Start generating for one request (token ids, no padding); its tokens come from `step_requests`."""

    def step_requests(self) -> List[Tuple[str, List[int], List[float], bool]]:
        """One scheduler step: (request id, new tokens, their log-probs, finished) for each request that gained
        tokens or finished."""

    def abort_requests(self, request_ids: List[str]) -> None:
        """Stop generating for these requests (unknown or finished ones are ignored)."""


def load_engine(backend: str, kind: str) -> Any:
    """The engine class of an installed backend (e.g. ("fsdp", "train")), with an install hint if absent."""
    spec: BackendSpec | None = installed_backends().get(backend)
    if spec is None or spec.kind != kind:
        raise ValueError(f"no installed {kind} backend named '{backend}'; `verl info` lists what is installed")
    return spec.load("engine")
