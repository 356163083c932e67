"""The model a run starts from: model.path, materialised if embedded, then SFT-warm-started if asked.

A warm start is cached by its settings (base model, data, steps, optimiser), so a second run skips it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verl.embedded.arithmetic import resolve_data_files
from verl.embedded.cache import cache_root, cached_dir, is_embedded, settings_hash
from verl.embedded.models import resolve_model_path
from verl.trainer.sft import SFTConfig, run_sft


def prepare_model(cfg: Any) -> str:
    """A Hugging Face folder to start the run from."""
    base = resolve_model_path(cfg.model.path)
    ws = cfg.model.warm_start
    if ws is None:
        return base
    settings = {"base": os.path.abspath(base), **OmegaConf.to_container(ws, resolve=True)}
    settings["data"] = [_file_identity(f) for f in ws.files]  # new data, new warm start (a name stays the same)
    if cfg.model.tokenizer_path:  # (only when set: the cache keys of earlier runs stay valid)
        settings["tokenizer"] = os.path.abspath(cfg.model.tokenizer_path)
    final = cache_root() / "warm-start" / f"{Path(base).name}-sft-{settings_hash(settings)}"

    def write(folder: Path) -> None:
        print(f"verl: SFT warm start of {cfg.model.path} ({ws.steps} steps) -> {final}", flush=True)
        run_sft(
            SFTConfig(
                model_path=base,
                tokenizer_path=cfg.model.tokenizer_path,
                files=list(ws.files),
                output_dir=str(folder),
                steps=ws.steps,
                batch_size=ws.batch_size,
                max_length=ws.max_length,
                backend=cfg.actor.backend,
                device=cfg.placement.device,
                # one device: in-process unless the run asked for Ray (then it is started already)
                controller="ray" if cfg.trainer.controller == "ray" else "local",
                seed=cfg.trainer.seed,
                optim=OmegaConf.to_object(ws.optim),
            )
        )

    return str(cached_dir(final, write))


def _file_identity(name: str) -> list:
    """What identifies a data file's content: an embedded set's cached path (its settings are hashed into it), or a
    file's path, size and modification time."""
    (path,) = resolve_data_files([name])
    if is_embedded(name):
        return [os.path.basename(path)]
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]
