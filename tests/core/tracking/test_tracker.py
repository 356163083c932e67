"""Tracker: logger selection, value cleaning, lifecycle; the console and jsonl loggers' exact output."""

from __future__ import annotations

import io
import json
import logging
import math
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from rich.console import Console

from verl.config.errors import ConfigError
from verl.config.schema import TrackingConfig
from verl.tracking import LOGGERS, Tracker
from verl.tracking import jsonl as jsonl_module
from verl.tracking.console import ConsoleLogger, format_line, format_value


class Recorder:
    """A logger that remembers what it was given (registered under "recorder" by the fixture)."""

    instances: ClassVar[list] = []

    def __init__(self, cfg, *, run_config=None, log_dir=None):
        self.cfg, self.run_config, self.log_dir = cfg, run_config, log_dir
        self.logged, self.closed = [], 0
        Recorder.instances.append(self)

    def log(self, metrics, step):
        self.logged.append((step, dict(metrics)))

    def close(self):
        self.closed += 1


class FailsToStart:
    def __init__(self, cfg, *, run_config=None, log_dir=None):
        raise RuntimeError("no server for you")


@pytest.fixture
def recorder():
    Recorder.instances = []
    LOGGERS.register("recorder")(Recorder)
    LOGGERS.register("fails")(FailsToStart)
    yield Recorder
    LOGGERS.unregister("recorder")
    LOGGERS.unregister("fails")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# --------------------------------------------------------------------------- selection and config


def test_unknown_logger_suggests_the_nearest(tmp_path):
    with pytest.raises(ConfigError) as info:
        Tracker(TrackingConfig(loggers=["console", "tensorbord"]), log_dir=str(tmp_path))
    (problem,) = info.value.problems
    assert problem.key == "tracking.loggers[1]"
    assert "unknown logger 'tensorbord'" in problem.message
    assert "did you mean 'tensorboard'?" in problem.fix


def test_config_may_be_a_dict_or_dictconfig(tmp_path, recorder):
    for cfg in ({"loggers": ["recorder"], "project": "p"}, OmegaConf.create({"loggers": ["recorder"], "project": "p"})):
        with Tracker(cfg, log_dir=str(tmp_path)) as tracker:
            assert isinstance(tracker.cfg, TrackingConfig) and tracker.cfg.project == "p"


def test_unknown_config_key_is_an_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        Tracker({"loggers": ["console"], "wandb_projet": "x"}, log_dir=str(tmp_path))
    assert info.value.problems[0].key == "tracking"
    assert "wandb_projet" in info.value.problems[0].message


def test_each_logger_gets_config_run_config_and_log_dir(tmp_path, recorder):
    run_config = OmegaConf.create({"trainer": {"seed": 3, "out": "${.seed}"}})
    with Tracker(TrackingConfig(loggers=["recorder", "recorder"]), run_config=run_config, log_dir=str(tmp_path)):
        pass
    (instance,) = recorder.instances  # listed twice, started once
    assert instance.run_config == {"trainer": {"seed": 3, "out": 3}}  # plain containers, resolved
    assert type(instance.run_config) is dict
    assert instance.log_dir == str(tmp_path)


def test_a_failed_start_closes_the_loggers_already_started(tmp_path, recorder):
    with pytest.raises(RuntimeError, match="no server for you"):
        Tracker(TrackingConfig(loggers=["recorder", "fails"]), log_dir=str(tmp_path))
    assert recorder.instances[0].closed == 1


# --------------------------------------------------------------------------- values


def test_values_are_converted_and_bad_ones_skipped_with_one_warning_per_key(tmp_path, recorder, caplog):
    metrics = {
        "actor/pg_loss": -0.5,
        "perf/tokens": 12,
        "reward/flag": True,
        "critic/vf": np.float32(0.25),
        "actor/kl": torch.tensor(0.125),
        "actor/one": np.array([2.0]),
        "actor/nan": math.nan,
        "actor/inf": -math.inf,
        "actor/text": "fast",
        "actor/vector": torch.ones(2),
        "actor/none": None,
    }
    tracker = Tracker(TrackingConfig(loggers=["recorder"]), log_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="verl.tracking.tracker"), tracker:
        tracker.log(metrics, step=1)
        tracker.log(metrics, step=np.int64(2))
    (instance,) = recorder.instances
    expected = {
        "actor/pg_loss": -0.5,
        "perf/tokens": 12.0,
        "reward/flag": 1.0,
        "critic/vf": 0.25,
        "actor/kl": 0.125,
        "actor/one": 2.0,
    }
    assert instance.logged == [(1, expected), (2, expected)]
    assert all(type(v) is float for _, logged in instance.logged for v in logged.values())
    skipped = [r.getMessage() for r in caplog.records]
    assert len(skipped) == 5  # nan, inf, text, vector, none: once each over two steps
    assert "metric 'actor/nan' skipped at step 1: nan is not finite" in skipped[0]
    assert "'fast' is a str, not a number" in skipped[2]


def test_step_must_be_an_int(tmp_path, recorder):
    with Tracker(TrackingConfig(loggers=["recorder"]), log_dir=str(tmp_path)) as tracker:
        for bad in (1.0, "1", True):
            with pytest.raises(TypeError, match="step must be an int"):
                tracker.log({"a": 1.0}, step=bad)


def test_close_is_idempotent_and_log_after_close_fails(tmp_path, recorder):
    tracker = Tracker(TrackingConfig(loggers=["recorder"]), log_dir=str(tmp_path))
    tracker.close()
    tracker.close()
    assert recorder.instances[0].closed == 1
    with pytest.raises(RuntimeError, match="after close"):
        tracker.log({"a": 1.0}, step=1)


# --------------------------------------------------------------------------- jsonl


def test_jsonl_writes_one_object_per_step_and_appends(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl_module, "time", SimpleNamespace(time=lambda: 1700000000.5))
    log_dir = tmp_path / "logs"  # created on demand
    with Tracker(TrackingConfig(loggers=["jsonl"]), log_dir=str(log_dir)) as tracker:
        tracker.log({"reward/score/mean": 0.5, "actor/pg_loss": -0.25, "step": 99.0}, step=1)
        tracker.log({"reward/score/mean": 0.75, "actor/kl": math.nan}, step=2)
        # flushed at once: the file is complete while the run is still going
        assert (log_dir / "metrics.jsonl").read_text().count("\n") == 2
    with Tracker(TrackingConfig(loggers=["jsonl"]), log_dir=str(log_dir)) as tracker:  # a resumed run
        tracker.log({"reward/score/mean": 1.0}, step=3)
    lines = (log_dir / "metrics.jsonl").read_text().splitlines()
    assert lines == [
        # a metric called "step" cannot overwrite the step
        '{"step": 1, "time": 1700000000.5, "reward/score/mean": 0.5, "actor/pg_loss": -0.25}',
        '{"step": 2, "time": 1700000000.5, "reward/score/mean": 0.75}',  # NaN skipped
        '{"step": 3, "time": 1700000000.5, "reward/score/mean": 1.0}',
    ]


def test_a_resumed_run_drops_the_steps_logged_after_its_checkpoint(tmp_path):
    """Killed after logging step 5 with its last checkpoint at step 3: the resumed run reruns steps 4 and 5, and
    each step appears once (a half-written last line from the kill is dropped too)."""
    log_dir = tmp_path / "logs"
    with Tracker(TrackingConfig(loggers=["jsonl"]), log_dir=str(log_dir)) as tracker:
        for step in range(1, 6):
            tracker.log({"reward/score/mean": step / 10}, step=step)
    with open(log_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "rew')  # the kill landed mid-write
    with Tracker(TrackingConfig(loggers=["jsonl"]), log_dir=str(log_dir)) as tracker:
        tracker.resume_at(3)
        for step in (4, 5):
            tracker.log({"reward/score/mean": step}, step=step)
    records = read_jsonl(log_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["reward/score/mean"] for r in records] == [0.1, 0.2, 0.3, 4.0, 5.0]


def test_a_run_killed_before_its_first_checkpoint_starts_its_log_over(tmp_path):
    """No checkpoint to resume from: the run starts again at step 0 (its validation too), so nothing the killed
    attempt logged stays."""
    log_dir = tmp_path / "logs"
    with Tracker(TrackingConfig(loggers=["jsonl"]), log_dir=str(log_dir)) as tracker:
        for step in (0, 1, 2):
            tracker.log({"reward/score/mean": step}, step=step)
    with Tracker(TrackingConfig(loggers=["jsonl"]), log_dir=str(log_dir)) as tracker:
        tracker.resume_at(-1)
        for step in (0, 1):
            tracker.log({"reward/score/mean": 10 + step}, step=step)
    records = read_jsonl(log_dir / "metrics.jsonl")
    assert [(r["step"], r["reward/score/mean"]) for r in records] == [(0, 10), (1, 11)]


# --------------------------------------------------------------------------- console


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3.0, "3"),
        (-12.0, "-12"),
        (0.75, "0.75"),
        (0.0012345, "0.001234"),
        (1234.56, "1235"),
        (1e7, "1e+07"),
        (math.nan, "nan"),
        (-math.inf, "-inf"),
    ],
)
def test_format_value(value, text):
    assert format_value(value) == text


def test_console_line_shows_the_headline_keys_in_order():
    metrics = {
        "timing/step_s": 3.41,
        "perf/tokens_per_s": 1234.5,
        "actor/pg_loss": -0.034,
        "actor/ppo_kl": 0.0012,
        "reward/score/mean": 0.75,
        "critic/vf_loss": 0.2,
        "actor/entropy": 1.1,
    }
    assert format_line(metrics, 3) == (
        "step 3 | reward 0.75 | kl 0.0012 | pg_loss -0.034 | tok/s 1234 | step_s 3.41 | +2 more"
    )


def test_console_line_prefers_reference_kl_and_lists_val_metrics():
    metrics = {"actor/kl": 0.5, "actor/ppo_kl": 0.01, "val/reward/score/mean": 0.9, "val/accuracy": 0.8}
    assert format_line(metrics, 10) == "step 10 | kl 0.5 | val/accuracy 0.8 | val/reward/score/mean 0.9 | +1 more"
    assert format_line({}, 0) == "step 0"


def test_console_logger_prints_one_line_per_step():
    out = io.StringIO()
    logger = ConsoleLogger(console=Console(file=out, width=60, highlight=False))
    logger.log({"reward/score/mean": 0.5, "actor/pg_loss": 1.25, "timing/step_s": 2.0, "a/b": 1.0}, step=7)
    logger.log({"reward/score/mean": 0.625}, step=8)
    # soft wrap: a line longer than the console width is not broken
    assert out.getvalue() == "step 7 | reward 0.5 | pg_loss 1.25 | step_s 2 | +1 more\nstep 8 | reward 0.625\n"


def test_tracker_console_writes_to_stdout(tmp_path, capsys):
    with Tracker(TrackingConfig(loggers=["console"]), log_dir=str(tmp_path)) as tracker:
        tracker.log({"reward/score/mean": 0.5}, step=1)
    assert capsys.readouterr().out == "step 1 | reward 0.5\n"
