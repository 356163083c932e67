"""The model a run starts from: model.path, materialised if embedded, then SFT-warm-started if asked.

A warm start is an SFT run (`SFTTrainer`) on one device of the run's kind with the run's actor backend, cached
by its settings (base model, data, steps, optimiser), so a second run skips it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

from verl.config.placement import to_dict
from verl.config.schema import VerlConfig
from verl.data.sources import is_prepared, prepared_file, resolve_data_files
from verl.embedded.cache import cache_root, cached_dir, is_embedded, settings_hash
from verl.embedded.models import resolve_model_path


def prepare_model(cfg: VerlConfig) -> str:
    """A Hugging Face folder to start the run from."""
    base = resolve_model_path(cfg.model.path)
    ws = cfg.model.warm_start
    if ws is None:
        return base
    final = warm_start_dir(cfg, base)

    def write(folder: Path) -> None:
        from verl.trainer.sft_trainer import SFTTrainer  # (the trainers import this module)
        from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

        until = "" if ws.until_exact_match is None else f", or until greedy exact match >= {ws.until_exact_match}"
        print(f"verl: SFT warm start of {cfg.model.path} ({ws.steps} steps{until}) -> {final}", flush=True)
        with tempfile.TemporaryDirectory(prefix="run-", dir=folder.parent) as run_dir:
            trainer = SFTTrainer(warm_start_config(cfg, base, run_dir))
            try:
                summary = trainer.fit()
                if ws.until_exact_match is not None:
                    at = trainer.val_history[-1] if trainer.val_history else {}
                    reached = at.get("val/exact_match", 0.0) >= ws.until_exact_match
                    print(
                        f"verl: warm start {'reached' if reached else 'did not reach'} greedy exact match "
                        f"{ws.until_exact_match} ({at.get('val/exact_match', float('nan')):.3f} at step "
                        f"{summary['steps']} of at most {ws.steps})",
                        flush=True,
                    )
                trainer.workers.actor_rollout.call(ActorRolloutRefWorker.export_hf, str(folder))
            finally:
                trainer.close()

    return str(cached_dir(final, write))


def warm_start_dir(cfg: VerlConfig, base: str) -> Path:
    """Where the warm start of `base` with cfg.model.warm_start's settings is cached."""
    ws = cfg.model.warm_start
    settings = {"base": os.path.abspath(base), **to_dict(ws)}
    # (settings at their defaults are left out of the key: the cache entries of earlier runs stay valid)
    if not ws.moe_aux_loss_coeff:
        settings.pop("moe_aux_loss_coeff")
    if ws.until_exact_match is None:
        for key in ("until_exact_match", "val_files", "check_every"):
            settings.pop(key)
    else:
        settings["val_files"] = [_file_identity(f) for f in ws.val_files]
    settings["data"] = [_file_identity(f) for f in ws.files]  # new data, new warm start (a name stays the same)
    if cfg.model.tokenizer_path:
        settings["tokenizer"] = os.path.abspath(cfg.model.tokenizer_path)
    return cache_root() / "warm-start" / f"{Path(base).name}-sft-{settings_hash(settings)}"


def warm_start_config(cfg: VerlConfig, base: str, output_dir: str) -> DictConfig:
    """The SFT run of model.warm_start: its files, steps, batch and optimiser, the run's actor backend, seed and
    model settings, one device (in-process unless the run asked for Ray, which is then started already), no
    checkpoints; its log every 50 steps on the console. With until_exact_match, it validates on val_files every
    check_every steps and stops at the first validation that reaches it."""
    ws = cfg.model.warm_start
    until = ws.until_exact_match is not None
    run = {
        "trainer": {
            "total_steps": ws.steps,
            "seed": cfg.trainer.seed,
            "controller": "ray" if cfg.trainer.controller == "ray" else "local",
            "output_dir": output_dir,
            "resume": "disable",
            "val_before_train": False,
            "log_every": 50,
            "val_every": ws.check_every if until else 0,
            "stop_when": {"metric": "val/exact_match", "at_least": ws.until_exact_match} if until else None,
        },
        # SFTTrainer's examples hold up to max_prompt_length + max_response_length tokens: ws.max_length in all
        "data": {
            "train_files": list(ws.files),
            "val_files": list(ws.val_files) if until else [],
            "max_prompt_length": ws.max_length - 1,
            "max_response_length": 1,
            "train_batch_size": ws.batch_size,
        },
        "model": {
            "path": base,
            "tokenizer_path": cfg.model.tokenizer_path,
            "dtype": cfg.model.dtype,
            "override_config": OmegaConf.to_container(cfg.model.override_config),
        },
        "algorithm": {"name": "sft"},
        "actor": {
            "backend": cfg.actor.backend,
            "ppo_mini_batch_size": ws.batch_size,
            "ppo_micro_batch_size_per_device": ws.batch_size,
            "optim": OmegaConf.to_container(ws.optim),
            "moe_aux_loss_coeff": ws.moe_aux_loss_coeff,
        },
        "placement": {
            "devices_per_node": 1,
            "device": cfg.placement.device,
            "pools": [{"name": "warm_start", "roles": ["actor"]}],
        },
        "checkpoint": {"save_last": False},
        "tracking": {"loggers": ["console"], "curves": False},
    }
    return cast(DictConfig, OmegaConf.merge(OmegaConf.structured(VerlConfig), run))


def _file_identity(name: str) -> list:
    """What identifies a data file's content: an embedded set's cached path (its settings are hashed into it), or a
    file's path, size and modification time."""
    if is_prepared(name):  # (its cache folder's name hashes its settings: nothing to prepare to name it)
        return [prepared_file(name).parent.name]
    (path,) = resolve_data_files([name])
    if is_embedded(name):
        return [os.path.basename(path)]
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]
