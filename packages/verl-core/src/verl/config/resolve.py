"""A config as a run takes it: loaded (from a recipe path, a dict of sections or a loaded config), validated and
planned as `verl train` does it, files included. What every trainer and `RLTrainer` start from."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from verl.config.errors import ConfigError
from verl.config.loader import load_config
from verl.config.plan import Plan
from verl.config.run_checks import check_run
from verl.config.schema import VerlConfig
from verl.config.user_code import add_user_code_paths
from verl.config.validate import errors, validate_and_plan

logger = logging.getLogger(__name__)


def resolve_config(config: Any, overrides: Sequence[str] = (), reward_given: bool = False) -> Tuple[DictConfig, Plan]:
    """A config (a loaded DictConfig, a recipe path, or a plain dict of sections) checked as `verl train` checks
    it, files included: ConfigError listing every problem at once; warnings are logged. Returns the config and
    its plan. `reward_given`: the caller passes a reward function, so the config need not name one."""
    if isinstance(config, VerlConfig):
        config = OmegaConf.structured(config)
    if isinstance(config, DictConfig) and OmegaConf.get_type(config) is not VerlConfig:
        config = OmegaConf.to_container(config)  # an untyped DictConfig: checked like a dict
    if isinstance(config, (str, os.PathLike)):
        add_user_code_paths(config)  # code beside the recipe imports, here and in workers
    if isinstance(config, (str, os.PathLike, Mapping)) and not isinstance(config, DictConfig):
        config = load_config(config, overrides)
    elif overrides:
        raise ValueError("overrides apply to a recipe path or a dict; merge them into a loaded config yourself")
    plan, problems = validate_and_plan(config, strict=True)
    problems += check_run(config, [r for r in ("critic",) if plan is not None and plan.has(r)], True, reward_given)
    for problem in problems:
        if problem.severity != "error":
            logger.warning("%s", problem.format())
    if errors(problems):
        raise ConfigError(errors(problems))
    return config, plan
