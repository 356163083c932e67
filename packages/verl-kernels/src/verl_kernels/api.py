"""Public entry points: argument checks, leading-dimension handling and the implementation registry."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from verl_kernels import chunked
from verl_kernels.function import KernelOps, LinearLogprobEntropy, Setup
from verl_kernels.precision import SUPPORTED_DTYPES
from verl_kernels.reference import linear_logprob_entropy_reference


def _triton_ops() -> KernelOps:
    # Imported on first use: the package works without triton installed.
    try:
        from verl_kernels import triton_kernels
    except ImportError as e:
        raise ImportError(
            f"impl='triton' needs the triton package ({e}); install it with `pip install verl-kernels[triton]` "
            "or use impl='chunked'"
        ) from e
    return triton_kernels.OPS


# impl name -> the kernels it runs (None: the naive reference, which autograd differentiates).
# "torch" is the name recipes use (actor.fused_kernel_impl: torch | triton) for the chunked kernels.
IMPLS: dict[str, Callable[[], KernelOps] | None] = {
    "naive": None,
    "chunked": lambda: chunked.OPS,
    "torch": lambda: chunked.OPS,
    "triton": _triton_ops,
}


def kernel_ops(impl: str) -> KernelOps | None:
    """The kernels registered under `impl` (None for "naive"); a clear error for unknown names."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is not a known implementation; choose one of {sorted(IMPLS)}")
    factory = IMPLS[impl]
    return None if factory is None else factory()


def check_inputs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    chunk_tokens: int | None,
    chunk_vocab: int | None,
    weight_name: str = "weight",
) -> None:
    """Raise ValueError naming the argument for every malformed input (shapes, dtypes, devices, settings)."""
    if hidden.dim() < 1:
        raise ValueError("hidden must have shape [..., H]; got a scalar")
    if weight.dim() != 2:
        raise ValueError(f"{weight_name} must have shape [V, H]; got {tuple(weight.shape)}")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"{weight_name} has H={weight.shape[1]} columns but hidden's last dimension is {hidden.shape[-1]}; "
            f"{weight_name} is [V, H] (the output projection, as nn.Linear(H, V).weight stores it)"
        )
    if weight.shape[0] == 0:
        raise ValueError(f"{weight_name} has no vocabulary rows")
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(
            f"labels must have hidden's leading shape {tuple(hidden.shape[:-1])}; got {tuple(labels.shape)}"
        )
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer token ids; got dtype {labels.dtype}")
    if hidden.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"hidden has dtype {hidden.dtype}; supported: {[str(d) for d in SUPPORTED_DTYPES]}")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"{weight_name} has dtype {weight.dtype} but hidden has {hidden.dtype}; cast one of them")
    if not (hidden.device == weight.device == labels.device):
        raise ValueError(
            f"hidden ({hidden.device}), {weight_name} ({weight.device}) and labels ({labels.device}) must be on "
            "one device"
        )
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive finite number; got {temperature!r}")
    for name, value in (("chunk_tokens", chunk_tokens), ("chunk_vocab", chunk_vocab)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive int or None (the device default); got {value!r}")


def run_fused(
    ops: KernelOps,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    setup_kwargs: dict,
    chunk_tokens: int | None,
    chunk_vocab: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten leading dimensions, run the autograd function, restore them."""
    lead = labels.shape
    default_tokens, default_vocab = ops.default_chunks(hidden.device)
    setup = Setup(chunk_tokens=chunk_tokens or default_tokens, chunk_vocab=chunk_vocab or default_vocab, **setup_kwargs)
    logprob, entropy = LinearLogprobEntropy.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1).long(), ops, setup
    )
    return logprob.view(lead), entropy.view(lead)


def linear_logprob_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    impl: str = "chunked",
    entropy_grad: bool = False,
    ignore_index: int = -100,
    chunk_tokens: int | None = None,
    chunk_vocab: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each label and entropy of each row of softmax(hidden @ weight.T / temperature).

    hidden [..., H] and labels [...] (token ids in [0, V), or ignore_index) give logprob [...] and entropy [...],
    float32 (float64 for float64 inputs); rows labelled ignore_index give 0 and 0 and receive no gradient.
    Gradients flow to hidden and weight through the log-probs, and through the entropy only when
    entropy_grad=True (otherwise the entropy is returned detached, for logging). chunk_tokens/chunk_vocab bound
    the logits block the chunked and Triton kernels hold at once (None: a per-device default).
    """
    ops = kernel_ops(impl)
    check_inputs(hidden, weight, labels, temperature, chunk_tokens, chunk_vocab)
    if ops is None:
        if bool(((labels != ignore_index) & ((labels < 0) | (labels >= weight.shape[0]))).any()):
            raise ValueError(f"labels: some label is outside the vocabulary [0, {weight.shape[0]}) of weight")
        return linear_logprob_entropy_reference(hidden, weight, labels.long(), temperature, entropy_grad, ignore_index)
    setup_kwargs = {
        "vocab_start": 0,
        "inv_temp": 1.0 / temperature,
        "entropy_grad": entropy_grad,
        "ignore_index": ignore_index,
        "vocab_hint": f"[0, {weight.shape[0]}) of weight ",
    }
    return run_fused(ops, hidden, weight, labels, setup_kwargs, chunk_tokens, chunk_vocab)
