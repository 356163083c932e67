"""The warm start's SFT run and cache key: a fixed step count as before, or SFT that stops at an exact-match share."""

from __future__ import annotations

from omegaconf import OmegaConf

from tests.support.run_configs import RECIPES
from verl.config.loader import load_config
from verl.trainer.warm_start import warm_start_config, warm_start_dir

BAND = [  # grpo_tiny's own warm start is a fixed 200 steps
    "model.warm_start.until_exact_match=0.3",
    "model.warm_start.val_files=[embedded:arithmetic-sft-val]",
    "model.warm_start.steps=400",
]


def _cfg(*overrides: str, band: bool = True):
    return load_config(RECIPES / "grpo_tiny.yaml", [*(BAND if band else []), *overrides])


def test_a_warm_start_until_an_exact_match_share_validates_and_stops_there(tmp_path):
    cfg = _cfg("model.warm_start.check_every=20")
    sft = warm_start_config(cfg, "/base", str(tmp_path))
    assert sft.trainer.val_every == 20 and not sft.trainer.val_before_train and sft.trainer.total_steps == 400
    assert OmegaConf.to_container(sft.trainer.stop_when) == {
        "metric": "val/exact_match",
        "at_least": 0.3,
        "at_most": None,
    }
    assert list(sft.data.val_files) == ["embedded:arithmetic-sft-val"]
    fixed = warm_start_config(_cfg(band=False), "/base", str(tmp_path))
    assert fixed.trainer.stop_when is None and fixed.trainer.val_every == 0 and list(fixed.data.val_files) == []


def test_the_cache_key_of_a_fixed_warm_start_ignores_the_band_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_CACHE", str(tmp_path))
    base = str(tmp_path / "base")
    fixed = warm_start_dir(_cfg(band=False), base)
    # (a fixed warm start's key is what it was before the band existed: its cached folders stay valid)
    assert warm_start_dir(_cfg("model.warm_start.check_every=50", band=False), base) == fixed
    assert warm_start_dir(_cfg("model.warm_start.val_files=[embedded:arithmetic-sft-val]", band=False), base) == fixed
    band = warm_start_dir(_cfg(), base)
    assert band != fixed
    assert warm_start_dir(_cfg("model.warm_start.until_exact_match=0.4"), base) not in (band, fixed)
    assert warm_start_dir(_cfg("model.warm_start.check_every=20"), base) not in (band, fixed)
