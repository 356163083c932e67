"""The wandb (offline), tensorboard and prometheus loggers, read back through each tool's own reader."""

from __future__ import annotations

import glob
import os
import sys
import urllib.request

import pytest
import wandb
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from verl.config.errors import ConfigError
from verl.config.schema import TrackingConfig
from verl.tracking import Tracker
from verl.tracking.prometheus_logger import PrometheusLogger, prometheus_name


def scrape(port: int) -> dict[str, float]:
    """name -> value of every sample line the endpoint serves."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


# --------------------------------------------------------------------------- tensorboard


def test_tensorboard_scalars_read_back(tmp_path):
    with Tracker(TrackingConfig(loggers=["tensorboard"]), log_dir=str(tmp_path)) as tracker:
        tracker.log({"actor/pg_loss": 0.5, "reward/score/mean": 0.25}, step=1)
        tracker.log({"actor/pg_loss": -1.5, "timing/step_s": float("nan")}, step=2)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["actor/pg_loss", "reward/score/mean"]  # NaN never written
    assert [(e.step, e.value) for e in events.Scalars("actor/pg_loss")] == [(1, 0.5), (2, -1.5)]
    assert [(e.step, e.value) for e in events.Scalars("reward/score/mean")] == [(1, 0.25)]


# --------------------------------------------------------------------------- wandb


def test_wandb_offline_writes_a_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # dir=log_dir wins over the environment
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = TrackingConfig(loggers=["wandb"], project="verl_test", experiment="tiny", wandb_mode="offline")
    with Tracker(cfg, run_config={"actor": {"lr": 0.125}}, log_dir=str(tmp_path)) as tracker:
        run = tracker.loggers["wandb"].run
        assert (run.project, run.name, run.settings.mode) == ("verl_test", "tiny", "offline")
        assert run.config["actor"] == {"lr": 0.125}
        tracker.log({"actor/pg_loss": 0.5, "reward/score/mean": 0.25}, step=1)
        tracker.log({"actor/pg_loss": 0.75}, step=2)
    # finish() can return before wandb's service process has written the run's records; teardown waits
    # for it (the same call wandb makes at interpreter exit).
    wandb.teardown()
    (run_dir,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    (record_file,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    with open(record_file, "rb") as f:
        records = f.read()  # protobuf records: keys and JSON values appear as plain bytes
    for written in (b"actor/pg_loss", b"reward/score/mean", b'{"lr":0.125}'):
        assert written in records
    assert not os.path.exists(tmp_path / "elsewhere")


# --------------------------------------------------------------------------- prometheus


def test_prometheus_name():
    assert prometheus_name("actor/pg_loss") == "verl_actor_pg_loss"
    assert prometheus_name("reward/openai/gsm8k/mean") == "verl_reward_openai_gsm8k_mean"
    assert prometheus_name("perf/mfu-%") == "verl_perf_mfu__"


def test_prometheus_serves_gauges_on_a_free_port(tmp_path):
    cfg = TrackingConfig(loggers=["prometheus"], prometheus_port=0)  # 0: the system picks a free port
    with Tracker(cfg, log_dir=str(tmp_path)) as tracker:
        port = tracker.loggers["prometheus"].port
        assert port > 0
        tracker.log({"actor/pg_loss": 0.5, "reward/score/mean": 0.25}, step=3)
        tracker.log({"actor/pg_loss": -1.5, "actor/kl": float("inf")}, step=4)
        samples = scrape(port)
    assert samples["verl_actor_pg_loss"] == -1.5  # a gauge holds the latest value
    assert samples["verl_reward_score_mean"] == 0.25
    assert samples["verl_step"] == 4.0
    assert "verl_actor_kl" not in samples  # inf skipped before it reached the gauge
    # the documented names beside the native ones
    assert samples["verl_ppo_reward_mean"] == 0.25
    assert "verl_ppo_kl_divergence" not in samples  # from actor/kl, which was inf
    assert not any(name.startswith("python_") for name in samples)  # a private registry, no process metrics
    with pytest.raises(OSError):  # closed: nothing listens any more
        scrape(port)


def test_prometheus_exports_the_documented_names(tmp_path):
    cfg = TrackingConfig(loggers=["prometheus"], prometheus_port=0)
    with Tracker(cfg, log_dir=str(tmp_path)) as tracker:
        metrics = {"actor/ppo_kl": 0.02, "reward/score/mean": 0.75, "timing/gen_s": 1.5}
        tracker.log(metrics, step=1)
        samples = scrape(tracker.loggers["prometheus"].port)
    assert samples["verl_ppo_kl_divergence"] == 0.02  # actor/kl absent: the PPO ratio's KL
    assert samples["verl_ppo_reward_mean"] == 0.75
    assert samples["verl_actor_generation_time"] == 1.5
    assert samples["verl_actor_ppo_kl"] == 0.02 and samples["verl_timing_gen_s"] == 1.5  # the native ones too


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback (the host name's, or the default route's), or None."""
    import socket

    candidates = []
    try:
        candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.254.254.254", 9))  # UDP: no packet is sent, the route picks the interface
            candidates.append(s.getsockname()[0])
        except OSError:
            pass
    return next((a for a in candidates if not a.startswith("127.") and a != "0.0.0.0"), None)


def test_prometheus_listens_on_loopback_only_by_default():
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to try")
    exporter = PrometheusLogger(TrackingConfig(prometheus_port=0))
    try:
        exporter.log({"actor/pg_loss": 1.0}, step=1)
        assert scrape(exporter.port)["verl_actor_pg_loss"] == 1.0  # reachable on 127.0.0.1
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{address}:{exporter.port}/metrics", timeout=5)
    finally:
        exporter.close()
    # The address is reachable when the exporter is told to listen everywhere: the refusal above was the binding.
    exposed = PrometheusLogger(TrackingConfig(prometheus_port=0, prometheus_host="0.0.0.0"))
    try:
        with urllib.request.urlopen(f"http://{address}:{exposed.port}/metrics", timeout=5) as response:
            assert b"verl_step" in response.read()
    finally:
        exposed.close()


def test_prometheus_name_clash_keeps_the_first_key(caplog):
    exporter = PrometheusLogger(TrackingConfig(prometheus_port=0))
    try:
        exporter.log({"actor/pg_loss": 1.0, "actor/pg-loss": 2.0, "step": 9.0}, step=1)
        exporter.log({"actor/pg-loss": 3.0}, step=2)
        samples = scrape(exporter.port)
    finally:
        exporter.close()
    assert samples["verl_actor_pg_loss"] == 1.0
    assert samples["verl_step"] == 2.0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("'actor/pg-loss' is not exported" in m for m in messages) == 1  # warned once
    assert sum("'step' is not exported" in m for m in messages) == 1


def test_prometheus_port_in_use_names_the_key():
    first = PrometheusLogger(TrackingConfig(prometheus_port=0))
    try:
        with pytest.raises(ConfigError) as info:
            PrometheusLogger(TrackingConfig(prometheus_port=first.port))
    finally:
        first.close()
    (problem,) = info.value.problems
    assert problem.key == "tracking.prometheus_port"
    assert f"port {first.port}" in problem.message
    assert "0 to let the system pick" in problem.fix


@pytest.mark.parametrize("port", [-1, 70000, "9464"])
def test_prometheus_bad_port(port):
    with pytest.raises(ConfigError, match="expected a port number 0-65535"):
        PrometheusLogger(SimpleCfg(port))


class SimpleCfg:
    def __init__(self, port):
        self.prometheus_port = port


# --------------------------------------------------------------------------- missing packages


@pytest.mark.parametrize(
    ("logger", "module", "extra"),
    [
        ("wandb", "wandb", "wandb"),
        ("tensorboard", "tensorboard", "tensorboard"),
        ("prometheus", "prometheus_client", "prometheus"),
    ],
)
def test_a_missing_package_says_what_to_install(tmp_path, monkeypatch, logger, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import now raises ImportError
    with pytest.raises(ConfigError) as info:
        Tracker(TrackingConfig(loggers=[logger], prometheus_port=0), log_dir=str(tmp_path))
    (problem,) = info.value.problems
    assert problem.key == "tracking.loggers"
    assert f"pip install 'verl-core[{extra}]'" in problem.fix
