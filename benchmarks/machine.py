"""The machine a benchmark ran on, for its results file."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_line() -> str:
    """CPU, cores, Python and torch: the first facts of every results file."""
    import os

    import torch

    return f"{cpu_name()}, {os.cpu_count()} cores; Python {platform.python_version()}, torch {torch.__version__}"


def write_report(out: str, lines: list[str]) -> None:
    """Write a markdown results file (its folder made if needed) and print it."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# bf16 dense tensor-core peaks (TFLOP/s, no sparsity) by device name, the most specific name first: what MFU is
# measured against. A name not listed needs --peak-tflops.
PEAK_BF16_TFLOPS = (
    ("GH200", 989.4),
    ("H200", 989.4),
    ("H100 PCIe", 756.5),
    ("H100 NVL", 835.5),
    ("H100", 989.4),  # SXM
    ("H800", 989.4),
    ("H20", 148.0),
    ("B200", 2250.0),
    ("B100", 1750.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.1),
    ("L40", 181.0),
    ("L4", 121.0),
)


def peak_bf16_tflops(device_name: str) -> float | None:
    """The bf16 dense peak of a device by its name (torch.cuda.get_device_name), None when it is not listed."""
    import re

    for key, tflops in PEAK_BF16_TFLOPS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name):
            return tflops
    return None


def device_slug(device_name: str) -> str:
    """The device part of a GPU results file's name: "NVIDIA H200" -> "h200"."""
    import re

    slug = re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")
    return slug.removeprefix("nvidia_") or "gpu"


def gpu_line() -> str:
    """GPU, count, memory, driver and CUDA, then CPU, Python and torch: the first facts of a GPU results file."""
    import os
    import subprocess

    import torch

    props = torch.cuda.get_device_properties(0)
    driver = "?"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "?"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return (
        f"{torch.cuda.device_count()} x {props.name} ({props.total_memory / 2**30:.0f} GiB, "
        f"{props.multi_processor_count} SMs), driver {driver}, CUDA {torch.version.cuda}; {cpu_name()}, "
        f"{os.cpu_count()} cores; Python {platform.python_version()}, torch {torch.__version__}"
    )
