# Pants BUILD-file prelude: the `verl_recipe` macro that turns a recipe file into a runnable target.

# Which package provides each backend a recipe can name (mirrors verl.backends.KNOWN_BACKENDS).
# A tuple of pairs: prelude globals must be hashable.
_BACKEND_SOURCES = (
    ("fsdp", "packages/verl-fsdp/src/verl_fsdp"),
    ("megatron", "packages/verl-megatron/src/verl_megatron"),
    ("hf", "packages/verl-rollout/src/verl_rollout"),
    ("vllm", "packages/verl-rollout/src/verl_rollout"),
    ("sglang", "packages/verl-rollout/src/verl_rollout"),
    ("torch", "packages/verl-kernels/src/verl_kernels"),  # actor.fused_kernel_impl
    ("triton", "packages/verl-kernels/src/verl_kernels"),
)


def verl_recipe(name, backends, description="", **kwargs):
    """`./pants run recipes:NAME [-- --dry-run key=value ...]` trains with recipes/NAME.yaml.

    `backends` lists every backend the recipe file names; the target depends on verl-core plus exactly
    those backend packages (a test checks that the list matches the file).
    """
    sources = dict(_BACKEND_SOURCES)
    unknown = [b for b in backends if b not in sources]
    if unknown:
        raise ValueError(f"verl_recipe({name!r}): unknown backends {unknown}; known: {sorted(sources)}")
    deps = ["packages/verl-core/src/verl"] + sorted({sources[b] for b in backends})
    pex_binary(
        name=name,
        description=description or f"Train with recipes/{name}.yaml",
        entry_point="verl.cli:main",
        args=["train", f"recipes/{name}.yaml"],
        dependencies=deps,
        layout="packed",
        execution_mode="venv",
        tags=["recipe"] + [f"backend:{b}" for b in backends],
        **kwargs,
    )
