"""curves.png: the run's reward, held-out accuracy and throughput, drawn from its metrics.jsonl."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from verl.tracking.curves import _series, write_curves
from verl.tracking.jsonl import JsonlLogger

PNG = b"\x89PNG\r\n\x1a\n"


def _write_metrics(path) -> None:
    rows = [{"step": 0, "val/accuracy": 0.25}]
    rows += [{"step": s, "reward/score/mean": s / 10, "perf/tokens_per_s": 1000.0 + s} for s in range(1, 6)]
    rows[-1]["val/accuracy"] = 0.5
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "rew')  # a line cut by a kill


def test_the_curves_are_the_logged_series(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write_metrics(metrics)
    series = dict(_series(str(metrics)))
    assert series["held-out accuracy"] == [(0, 0.25), (5, 0.5)]
    assert series["reward (mean score)"] == [(s, s / 10) for s in range(1, 6)]
    assert len(series["throughput (tokens/s)"]) == 5
    out = write_curves(str(metrics))
    assert out == str(tmp_path / "curves.png")
    data = (tmp_path / "curves.png").read_bytes()
    assert data.startswith(PNG) and len(data) > 5000  # three drawn panels, not an empty canvas


def test_the_jsonl_logger_draws_them_when_it_closes(tmp_path):
    logger = JsonlLogger(None, log_dir=str(tmp_path))
    logger.log({"reward/score/mean": 0.5}, step=1)
    logger.close()
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG)
    off = JsonlLogger(SimpleNamespace(curves=False), log_dir=str(tmp_path / "off"))
    off.log({"reward/score/mean": 0.5}, step=1)
    off.close()
    assert not (tmp_path / "off" / "curves.png").exists()


def test_without_matplotlib_nothing_is_drawn_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    metrics = tmp_path / "metrics.jsonl"
    _write_metrics(metrics)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with caplog.at_level("INFO"):
        assert write_curves(str(metrics)) is None
    assert "pip install 'verl-core[plot]'" in caplog.text
    assert not (tmp_path / "curves.png").exists()


def test_a_drawing_that_fails_is_a_warning_not_a_failed_run(tmp_path, monkeypatch, caplog):
    import verl.tracking.jsonl as jsonl

    def broken(path):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(jsonl, "write_curves", broken)
    logger = JsonlLogger(None, log_dir=str(tmp_path))
    logger.log({"reward/score/mean": 0.5}, step=1)
    logger.close()  # does not raise
    assert "curves.png was not written: RuntimeError: no fonts" in caplog.text
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1  # the metrics are all there
