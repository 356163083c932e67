"""Run megatron-core 0.16 on a machine without CUDA (CPU tensors, gloo): the one place that knows how.

megatron-core calls CUDA unconditionally in a handful of places. `apply()` routes each of them to the CPU,
and does nothing when CUDA is available (GPU runs use megatron exactly as shipped). What it changes:

1. `torch.cuda` as megatron's modules see it (`CUDA_MODULES`): `current_device()` is the CPU; RNG state,
   `manual_seed`, `synchronize` and `empty_cache` act on the CPU generator or do nothing; streams and events
   (the MoE token dispatcher's side stream) are no-ops, CPU work being ordered already. Megatron's modules
   get a stand-in for the name `torch` in their globals; `torch` itself is untouched for everyone else.
2. Tensor factories those modules call with `device="cuda"` (schedules, grad clipping, masks) build CPU tensors,
   and their `pin_memory=True` (context parallelism's RoPE slice) is dropped.
3. The RNG tracker's `_get_cuda_rng_state` / `_set_cuda_rng_state` read and write the CPU generator, so
   `model_parallel_cuda_manual_seed` and `get_cuda_rng_tracker().fork()` work (forking the CPU stream).
4. `Tensor.type()` checks against 'torch.cuda.FloatTensor' (distributed optimizer, grad clipping) and
   `Tensor.cuda()` (tied-embedding setup across pipeline stages, the context-parallel RoPE slice): inside those functions only
   (`TENSOR_SHIMMED`), a CPU tensor reports its CUDA type name and `.cuda()` leaves it where it is.

5. The MoE token dispatcher's `maybe_move_tensor_to_cpu(..., as_numpy=True)` turns only CUDA tensors into the
   numpy split sizes that `all_to_all_single` takes; on the CPU the split sizes become numpy arrays too.

Each behaviour has a test in tests/megatron/test_cpu_compat.py. (Sequence parallelism needs no patch here: its
norms are the model's own, `verl_megatron.model.TorchNorm`, and gloo has every collective it uses.)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import types
from typing import Any, Callable, Iterator

import torch

# megatron.core modules whose code calls torch.cuda.* or builds tensors on device="cuda" on the paths the
# engine uses (model build, forward/backward, pipeline p2p, DDP buffers, optimizer, grad clipping).
CUDA_MODULES = (
    "megatron.core.parallel_state",
    "megatron.core.utils",
    "megatron.core.rerun_state_machine",
    "megatron.core.tensor_parallel.random",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.utils",
    "megatron.core.tensor_parallel.data",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.models.common.embeddings.rope_utils",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.transformer.module",
    "megatron.core.transformer.utils",
    "megatron.core.transformer.attention",
    "megatron.core.transformer.dot_product_attention",
    "megatron.core.transformer.transformer_layer",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.transformer.moe.router",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.transformer.moe.token_dispatcher",
    "megatron.core.transformer.moe.experts",
    "megatron.core.transformer.moe.moe_layer",
)

# (module, attribute path) of functions that check `tensor.type()` against CUDA names or call `tensor.cuda()`.
TENSOR_SHIMMED = (
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer._build_model_and_main_param_groups"),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer.get_parameter_state_dp_zero"),
    ("megatron.core.optimizer.clip_grads", "clip_grad_by_total_norm_fp32"),
    ("megatron.core.models.common.language_module.language_module", "LanguageModule.setup_embeddings_and_output_layer"),
    ("megatron.core.models.common.embeddings.rope_utils", "get_pos_emb_on_this_cp_rank"),
)

FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "arange", "rand", "randn", "randint", "as_tensor")

_applied = False


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, int)  # a bare CUDA ordinal


def _cpu_factory(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def factory(*args: Any, **kwargs: Any) -> Any:
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        kwargs.pop("pin_memory", None)  # page-locked memory needs a CUDA allocator; it only speeds up copies
        return fn(*args, **kwargs)

    return factory


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _cpu_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_rng_state(state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    torch.set_rng_state(state)


def _to_cpu(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """megatron's moe_utils.maybe_move_tensor_to_cpu for tensors already on the CPU."""
    if as_numpy and torch.is_tensor(tensor):
        return tensor.numpy()
    return tensor


class CpuStream:
    """A CUDA stream (or event) on the CPU: work is already ordered, so waits and records do nothing."""

    def wait_stream(self, other: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> "CpuStream":
        return self

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


_CPU_STREAM = CpuStream()


class CpuCuda(types.ModuleType):
    """`torch.cuda` as megatron's modules see it on a CPU machine; anything not listed is the real one."""

    def __init__(self) -> None:
        super().__init__("torch.cuda")
        self.current_device = lambda: torch.device("cpu")
        self.get_rng_state = _cpu_rng_state
        self.set_rng_state = _set_cpu_rng_state
        self.manual_seed = torch.manual_seed
        self.synchronize = _noop
        self.empty_cache = _noop
        # The MoE token dispatcher overlaps its device-to-host copies on a side stream.
        self.Stream = lambda *args, **kwargs: CpuStream()
        self.Event = lambda *args, **kwargs: CpuStream()
        self.current_stream = lambda *args, **kwargs: _CPU_STREAM
        self.stream = lambda stream=None: contextlib.nullcontext()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class CpuTorch(types.ModuleType):
    """`torch` as megatron's modules see it on a CPU machine: the real module with `cuda` and the tensor
    factories replaced (a copy of torch's namespace, so attribute lookups stay as fast as on torch)."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.__dict__.update({k: v for k, v in vars(torch).items() if not k.startswith("__")})
        self.cuda = CpuCuda()
        for name in FACTORIES:
            setattr(self, name, _cpu_factory(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:  # attributes torch creates lazily
        return getattr(torch, name)


@contextlib.contextmanager
def cpu_tensors_as_cuda() -> Iterator[None]:
    """While active, `t.type()` of a CPU tensor names its CUDA type and `t.cuda()` returns `t` unchanged."""
    original_type, original_cuda = torch.Tensor.type, torch.Tensor.cuda

    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or self.device.type != "cpu":  # a conversion, or not a CPU tensor: as torch does
            return original_type(self, *args, **kwargs)
        return original_type(self).replace("torch.", "torch.cuda.", 1)

    def cuda_(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self

    torch.Tensor.type, torch.Tensor.cuda = type_, cuda_
    try:
        yield
    finally:
        torch.Tensor.type, torch.Tensor.cuda = original_type, original_cuda


def _shim_tensor_methods(owner: Any, attr: str) -> None:
    """Wrap owner.attr (a function, method, staticmethod or classmethod) in cpu_tensors_as_cuda()."""
    raw = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    fn = raw.__func__ if kind else raw

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with cpu_tensors_as_cuda():
            return fn(*args, **kwargs)

    wrapped.__verl_cpu_compat__ = True
    setattr(owner, attr, kind(wrapped) if kind else wrapped)
    if not isinstance(owner, type):  # a module function: megatron modules that imported it by name get it too
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("megatron.") and getattr(module, attr, None) is fn:
                setattr(module, attr, wrapped)


def _resolve(module: str, path: str) -> tuple[Any, str]:
    owner: Any = importlib.import_module(module)
    *parents, attr = path.split(".")
    for name in parents:
        owner = getattr(owner, name)
    return owner, attr


def needed() -> bool:
    """Whether this process needs the layer: no usable CUDA device."""
    return not torch.cuda.is_available()


def applied() -> bool:
    return _applied


def apply(force: bool = False) -> bool:
    """Route megatron-core's CUDA calls to the CPU when CUDA is absent (or `force`); idempotent.

    Returns whether the layer is in effect. Call it before building megatron models or groups.
    """
    global _applied
    if _applied:
        return True
    if not (force or needed()):
        return False
    cpu_torch = CpuTorch()
    for name in CUDA_MODULES:
        module = importlib.import_module(name)
        if getattr(module, "torch", None) is torch:
            module.torch = cpu_torch
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    random._get_cuda_rng_state = _cpu_rng_state
    random._set_cuda_rng_state = _set_cpu_rng_state
    for name in ("megatron.core.transformer.moe.moe_utils", "megatron.core.transformer.moe.token_dispatcher"):
        importlib.import_module(name).maybe_move_tensor_to_cpu = _to_cpu
    for module, path in TENSOR_SHIMMED:
        owner, attr = _resolve(module, path)
        raw = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        if not getattr(getattr(raw, "__func__", raw), "__verl_cpu_compat__", False):
            _shim_tensor_methods(owner, attr)
    _applied = True
    return True
