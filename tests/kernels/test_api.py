"""The public API: the implementation registry and clear errors for malformed input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import verl_kernels
from verl_kernels import IMPLS, linear_logprob_entropy, vocab_parallel_linear_logprob_entropy


def inputs(n=4, h=3, v=5, dtype=torch.float32):
    return torch.randn(n, h, dtype=dtype), torch.randn(v, h, dtype=dtype), torch.randint(0, v, (n,))


def test_registry_names():
    assert set(IMPLS) == {"naive", "chunked", "torch", "triton"}


def test_unknown_impl_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"impl='cuda'.*\['chunked', 'naive', 'torch', 'triton'\]"):
        linear_logprob_entropy(*inputs(), impl="cuda")


def test_torch_is_the_chunked_kernels():
    # Recipes name the torch kernels "torch" (actor.fused_kernel_impl); it must be the chunked path.
    h, w, y = inputs(9, 4, 11)
    a = linear_logprob_entropy(h, w, y, impl="torch", chunk_vocab=3)
    b = linear_logprob_entropy(h, w, y, impl="chunked", chunk_vocab=3)
    assert all(torch.equal(x, z) for x, z in zip(a, b))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda h, w, y: (h, w[:, :2], y), r"weight has H=2 columns but hidden's last dimension is 3"),
        (lambda h, w, y: (h, w.reshape(-1), y), r"weight must have shape \[V, H\]"),
        (lambda h, w, y: (h, w[:0], y), r"weight has no vocabulary rows"),
        (lambda h, w, y: (h, w, y[:3]), r"labels must have hidden's leading shape \(4,\); got \(3,\)"),
        (lambda h, w, y: (h, w, y.float()), r"labels must be integer token ids"),
        (lambda h, w, y: (h, w.double(), y), r"weight has dtype torch.float64 but hidden has torch.float32"),
        (lambda h, w, y: (h.int(), w.int(), y), r"hidden has dtype torch.int32; supported"),
        (lambda h, w, y: (h[0, 0], w, y), r"hidden must have shape \[\.\.\., H\]"),
    ],
)
@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_malformed_inputs_name_the_argument(change, message, impl):
    with pytest.raises(ValueError, match=message):
        linear_logprob_entropy(*change(*inputs()), impl=impl)


@pytest.mark.parametrize("impl", ["naive", "chunked"])
@pytest.mark.parametrize("bad", [5, 17, -1])
def test_labels_outside_the_vocabulary(impl, bad):
    h, w, y = inputs()
    y[2] = bad
    with pytest.raises(ValueError, match=r"labels: .*outside the vocabulary \[0, 5\)"):
        linear_logprob_entropy(h, w, y, impl=impl)


def test_ignore_index_can_be_changed():
    h, w, y = inputs()
    y[1] = -1
    lp, ent = linear_logprob_entropy(h, w, y, ignore_index=-1)
    assert lp[1] == 0 and ent[1] == 0
    with pytest.raises(ValueError, match="outside the vocabulary"):
        linear_logprob_entropy(h, w, y)  # -1 is not the default ignore_index


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("inf"), float("nan"), "1"])
def test_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature must be a positive finite number"):
        linear_logprob_entropy(*inputs(), temperature=temperature)


@pytest.mark.parametrize("name", ["chunk_tokens", "chunk_vocab"])
@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_bad_chunk_sizes(name, value):
    with pytest.raises(ValueError, match=f"{name} must be a positive int or None"):
        linear_logprob_entropy(*inputs(), **{name: value})


def test_vocab_parallel_needs_torch_distributed():
    h, w, y = inputs()
    with pytest.raises(ValueError, match="needs torch.distributed initialised"):
        vocab_parallel_linear_logprob_entropy(h, w, y, vocab_start=0, group=None)


def _run_clean(code: str) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter with this test process's import path, without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=120
    )


def test_package_imports_without_triton():
    # A None entry in sys.modules makes `import triton` fail, as on a machine without it.
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, verl_kernels\n"
        "h, w, y = torch.randn(3, 2), torch.randn(4, 2), torch.tensor([0, 1, 3])\n"
        "verl_kernels.linear_logprob_entropy(h, w, y)\n"
        "try:\n"
        "    verl_kernels.linear_logprob_entropy(h, w, y, impl='triton')\n"
        "except ImportError as e:\n"
        "    print('ERR', e)\n"
    )
    out = _run_clean(code)
    assert out.returncode == 0, out.stderr
    assert "ERR impl='triton' needs the triton package" in out.stdout and "verl-kernels[triton]" in out.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error for CPU tensors without a GPU")
def test_triton_on_cpu_without_interpreter_is_a_clear_error():
    code = (
        "import torch, verl_kernels\n"
        "h, w, y = torch.randn(3, 2), torch.randn(4, 2), torch.tensor([0, 1, 3])\n"
        "try:\n"
        "    verl_kernels.linear_logprob_entropy(h, w, y, impl='triton')\n"
        "except ValueError as e:\n"
        "    print('ERR', e)\n"
    )
    out = _run_clean(code)
    assert out.returncode == 0, out.stderr
    assert "ERR impl='triton' needs CUDA tensors (got cpu)" in out.stdout and "TRITON_INTERPRET=1" in out.stdout


def test_public_names():
    assert set(verl_kernels.__all__) == {
        "IMPLS",
        "linear_logprob_entropy",
        "linear_logprob_entropy_reference",
        "vocab_parallel_linear_logprob_entropy",
    }
