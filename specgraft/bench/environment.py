"""What a result was measured on: package versions, threads, CPU model, dtype.

>>> sorted(environment("bfloat16"))[:3]
['cpu_count', 'cpu_model', 'dtype']
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("specgraft", "torch", "transformers", "tokenizers", "accelerate", "numpy")


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The first ``model name`` of ``/proc/cpuinfo``, else ``platform.processor()``."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def environment(dtype: str) -> dict[str, Any]:
    import torch

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "dtype": dtype,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "packages": package_versions(),
    }
