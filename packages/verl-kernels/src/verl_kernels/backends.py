"""What this package registers under the `verl.backends` entry-point group (kept import-light)."""

from verl.backends import BackendSpec

TORCH = BackendSpec(name="torch", kind="kernels", package="verl-kernels")
TRITON = BackendSpec(
    name="triton", kind="kernels", package="verl-kernels", requires=("triton",), extra="verl-kernels[triton]"
)
BACKENDS = (TORCH, TRITON)
