"""What this package registers under the `verl.backends` entry-point group (kept import-light)."""

from verl.backends import BackendSpec

MEGATRON = BackendSpec(
    name="megatron",
    kind="train",
    package="verl-megatron",
    requires=("megatron.core", "transformers"),
    engine="verl_megatron.engine:MegatronEngine",
)
BACKENDS = (MEGATRON,)
