"""Backend discovery through entry points and the problems reported for a recipe's backend choice."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from verl.backends import BackendSpec, check_backend, installed_backends

FSDP = BackendSpec("fsdp", "train", "verl-fsdp")
HF = BackendSpec("hf", "rollout", "verl-rollout")


@pytest.fixture
def fresh_discovery():
    installed_backends.cache_clear()
    yield
    installed_backends.cache_clear()


def test_an_installed_distribution_registers_through_its_entry_point(tmp_path, monkeypatch, fresh_discovery):
    # A real (if tiny) installed distribution: a module plus dist-info metadata on sys.path.
    (tmp_path / "acme_engine.py").write_text(
        "from verl.backends import BackendSpec\nSPEC = BackendSpec('acme', 'train', 'acme-engine')\n"
    )
    info = tmp_path / "acme_engine-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-engine\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[verl.backends]\nacme = acme_engine:SPEC\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    found = installed_backends()
    assert found["acme"] == BackendSpec("acme", "train", "acme-engine")
    assert check_backend("actor.backend", "acme", "train") == []
    sys.modules.pop("acme_engine", None)


def test_unknown_backend_suggests_the_closest_name():
    [problem] = check_backend("actor.backend", "fsdq", "train", installed={"fsdp": FSDP})
    assert problem.key == "actor.backend"
    assert "'fsdq'" in problem.message and "did you mean 'fsdp'" in problem.fix


def test_backend_whose_package_is_missing_names_the_package():
    [problem] = check_backend("actor.backend", "megatron", "train", installed={"fsdp": FSDP})
    assert "verl-megatron" in problem.message and problem.fix == "pip install verl-megatron"


def test_rollout_backend_named_for_training_says_which_kind_it_is():
    [problem] = check_backend("actor.backend", "hf", "train", installed={"hf": HF})
    assert "rollout backend" in problem.message


def test_missing_third_party_library_is_an_error_to_run_and_a_warning_to_plan():
    spec = BackendSpec("vllm", "rollout", "verl-rollout", requires=("no_such_module_xyz",), extra="verl-rollout[vllm]")
    [strict] = check_backend("rollout.backend", "vllm", "rollout", installed={"vllm": spec})
    [planning] = check_backend("rollout.backend", "vllm", "rollout", installed={"vllm": spec}, strict=False)
    assert strict.severity == "error" and planning.severity == "warning"
    assert "no_such_module_xyz" in strict.message and strict.fix == "pip install verl-rollout[vllm]"


def test_available_backend_has_no_problems():
    assert check_backend("rollout.backend", "hf", "rollout", installed={"hf": HF}) == []


def test_a_bare_folder_named_like_the_library_does_not_count_as_installed(tmp_path, monkeypatch):
    # A folder without __init__.py imports as a namespace package; it is not the library (a checkout's
    # tests/rollout/vllm/ on sys.path once made vLLM look installed).
    (tmp_path / "no_such_engine_xyz").mkdir()
    (tmp_path / "real_engine_xyz").mkdir()
    (tmp_path / "real_engine_xyz" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = BackendSpec("vllm", "rollout", "verl-rollout", requires=("no_such_engine_xyz", "real_engine_xyz"))
    assert spec.missing_requirements() == ["no_such_engine_xyz"]


def test_discovery_never_imports_a_users_module_named_verl_something(tmp_path, monkeypatch, fresh_discovery):
    without = installed_backends()  # whatever this environment has (the core's tests run without the backends)
    installed_backends.cache_clear()
    marker = tmp_path / "imported"
    run_me = f"open({str(marker)!r}, 'w').close()\n"
    (tmp_path / "verl_my_rewards.py").write_text(run_me)  # a user's module
    (tmp_path / "verl_my_pkg").mkdir()  # and a user's package, even one with a backends module
    (tmp_path / "verl_my_pkg" / "__init__.py").write_text(run_me)
    (tmp_path / "verl_my_pkg" / "backends.py").write_text(run_me + "BACKENDS = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    found = installed_backends()
    assert not marker.exists() and "verl_my_rewards" not in sys.modules and "verl_my_pkg" not in sys.modules
    assert found == without  # the user's modules change nothing; the project's own packages are still found
    if importlib.util.find_spec("verl_fsdp") is not None:  # a source checkout with the backends on the path
        assert "fsdp" in found
