"""What CPU this is: its name, identity (vendor, family, model, widest vector unit), feature flags
and the kind the shipped cost tables are filed under. Linux reads ``/proc/cpuinfo``; elsewhere the
answers are empty or None.

The benchmark records :func:`cpu_model` and :func:`cpu_id` beside every result (this project's
CPU hosts all read "AMD EPYC" and were Zen 3, 4 and 5 parts), the cost tables the same plus
:func:`cpu_kind`, and the loaders pick kernels and dtypes by :func:`cpu_flags`.

>>> cpu_kind() in (None, "avx512")
True
"""

from __future__ import annotations

import functools
import os  # noqa: F401 (the doctests use it)
import platform
from pathlib import Path
from typing import Any

__all__ = ["VECTOR_ISAS", "cpu_flags", "cpu_id", "cpu_kind", "cpu_model"]


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


#: Vector extensions, widest first, by their ``/proc/cpuinfo`` flag.
VECTOR_ISAS = (("amx_tile", "amx"), ("avx512_bf16", "avx512-bf16"), ("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx"))


def cpu_id(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, Any]:
    r"""Vendor, family, model, stepping and the widest vector extension of the first processor in
    ``cpuinfo`` (empty where it cannot be read, e.g. not Linux).

    >>> import tempfile
    >>> text = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nstepping\t: 1\nflags\t\t: fpu avx avx2 fma\n"
    >>> with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    ...     _ = f.write(text)
    >>> cpu_id(f.name)
    {'vendor': 'AuthenticAMD', 'family': 25, 'model': 1, 'stepping': 1, 'vector': 'avx2'}
    >>> os.unlink(f.name)
    """
    fields = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping"}
    out: dict[str, Any] = {}
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block only
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in fields:
            out[fields[key]] = int(value) if value.isdigit() else value
        elif key == "flags":
            flags = set(value.split())
            out["vector"] = next((name for flag, name in VECTOR_ISAS if flag in flags), None)
    return out



@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``, first processor); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()



def cpu_kind() -> str | None:
    """``"avx512"`` on a CPU with AVX-512 (``avx512f`` in ``/proc/cpuinfo``), else None: the two
    kinds of x86 CPU whose shipped cost tables differ (wider vectors make extra rows cheaper)."""
    return "avx512" if "avx512f" in cpu_flags() else None


@functools.lru_cache(maxsize=1)
def llamacpp_amx() -> bool:
    """Whether the installed llama.cpp runs AMX kernels: built with them (its system info says
    ``AMX_INT8 = 1``, as ``specgraft.models.llamacpp_build`` builds it on a CPU with AMX) and
    this CPU has AMX. False without llama-cpp-python."""
    if "amx_int8" not in cpu_flags():
        return False
    try:
        import llama_cpp
    except ImportError:
        return False
    return "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode(errors="replace")


@functools.lru_cache(maxsize=1)
def llamacpp_amx_rows() -> bool:
    """Whether the installed llama.cpp is an AMX build with specgraft's small-batch kernels
    (``python -m specgraft.models.llamacpp_build --install`` adds them): its CPU library exports
    ``specgraft_amx_rows_limit``."""
    if not llamacpp_amx():
        return False
    import ctypes

    import llama_cpp.llama_cpp as api

    try:
        return hasattr(ctypes.CDLL(str(Path(api._lib._name).with_name("libggml-cpu.so"))), "specgraft_amx_rows_limit")
    except (OSError, AttributeError):
        return False


def cost_kinds(device: str) -> list[str]:
    """The CPU kinds whose shipped cost tables suit ``device`` (a target's ``cost_device``), best
    first. An AMX build of llama.cpp costs rows differently from its AVX-512 kernels (8+ rows
    cheaper, 2-4 dearer), and one with the small-batch kernels differently again (2-15 rows
    cheaper): ``amx-rows``, then ``amx``, then the ``avx512`` tables."""
    kind = cpu_kind()
    kinds = [kind] if kind else []
    if device == "llamacpp" and llamacpp_amx():
        kinds[:0] = ["amx-rows", "amx"] if llamacpp_amx_rows() else ["amx"]
    return kinds
