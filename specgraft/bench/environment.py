"""What a result was measured on: package versions, threads, CPU model and generation, the
source revision, dtype.

The CPU's marketing name alone does not say which machine a figure came from (this project's
CPU hosts all read "AMD EPYC", and were Zen 3, Zen 4 and Zen 5 parts with different vector
units), so the vendor, family, model and widest vector extension are recorded beside it; and
the git revision of the code that ran (with a flag when it had uncommitted changes), so a
result can be tied to the code that produced it.

>>> sorted(environment("bfloat16"))[:4]
['cpu', 'cpu_count', 'cpu_model', 'dtype']
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# re-exported: the CPU's identity lives in ``specgraft.machine`` (the cost tables read it too)
from specgraft.machine import VECTOR_ISAS, cpu_id, cpu_model  # noqa: F401

PACKAGES = ("specgraft", "torch", "transformers", "tokenizers", "accelerate", "numpy")


def source_revision(path: str | Path | None = None) -> str | None:
    """The git commit of the checkout holding ``path`` (default: this package's source, and only
    when the checkout is the package's own: a copy installed into a virtual environment that
    happens to sit inside some repository is not that repository's code), with ``+dirty`` when
    its tracked files have uncommitted changes; None outside a git checkout or without git."""
    package = Path(__file__).resolve().parents[1]  # .../specgraft
    where = Path(path) if path is not None else package

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    if path is None and git("rev-parse", "--show-toplevel") not in (str(package.parent), None):
        return None
    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return commit + ("+dirty" if dirty else "")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def environment(dtype: str, extra_packages: tuple[str, ...] = ()) -> dict[str, Any]:
    """Where a run measures; ``extra_packages``: more versions to record (``llama_cpp_python``
    for a run with llama.cpp)."""
    import torch

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu": cpu_id(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "dtype": dtype,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "packages": package_versions(PACKAGES + tuple(extra_packages)),
        "specgraft_revision": source_revision(),
    }
