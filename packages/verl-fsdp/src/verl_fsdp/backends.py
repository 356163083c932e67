"""What this package registers under the `verl.backends` entry-point group (kept import-light)."""

from verl.backends import BackendSpec

FSDP = BackendSpec(
    name="fsdp",
    kind="train",
    package="verl-fsdp",
    requires=("transformers",),
    engine="verl_fsdp.engine:FSDPEngine",
    exporter="verl_fsdp.export:export_checkpoint",
    memory_model="verl_fsdp.memory_model:MEMORY_MODEL",
)
BACKENDS = (FSDP,)
