"""What this package registers under the `verl.backends` entry-point group (kept import-light)."""

from verl.backends import BackendSpec

MEGATRON = BackendSpec(
    name="megatron",
    kind="train",
    package="verl-megatron",
    requires=("megatron.core", "transformers"),
    engine="verl_megatron.engine:MegatronEngine",
    model_info="verl_megatron.model_info:describe",
    exporter="verl_megatron.export:export_checkpoint",
    memory_model="verl_megatron.memory_model:MEMORY_MODEL",
)
BACKENDS = (MEGATRON,)
