"""Devices and dtypes: ``auto`` resolved (a GPU when there is one; float32 on a CPU, bfloat16 on
a GPU), the SDPA backends our forwards use on a GPU."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from specgraft.models.kernels import auto_dtype

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
#: SDPA backends of our forwards on a GPU: every one but cuDNN's. cuDNN attention builds an
#: execution plan for each new (query rows, key length) shape, and a decoding sequence's key
#: length is new at every step: on an H200 (torch 2.11, bf16) the first generation of a prompt
#: spent 3.8 s in attention (5.5 s in all), the same generation repeated (plans cached) 0.08 s.
GPU_SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def attention_backends(device: torch.device) -> contextlib.AbstractContextManager:
    """The SDPA backends our forwards may use on ``device``: on CUDA :data:`GPU_SDPA_BACKENDS`;
    elsewhere torch's own choice (a no-op context).

    >>> attention_backends(torch.device("cpu"))  # doctest: +ELLIPSIS
    <contextlib.nullcontext object at ...>
    """
    return sdpa_kernel(list(GPU_SDPA_BACKENDS)) if device.type == "cuda" else contextlib.nullcontext()


def parse_dtype(name: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """``"bfloat16"``, ``"float32"``, ``"float16"`` or ``"auto"`` (see :func:`kernels.auto_dtype`)."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        name = auto_dtype(str(torch.device(device).type))
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of auto, {', '.join(sorted(DTYPES))}")
    return DTYPES[name]


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"`` (or None) = ``cuda`` when a GPU is available, else ``cpu``; ``ValueError`` for a
    device that does not exist here.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"unknown device {device!r} ({e})") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for, but this torch sees no CUDA GPU")
    return dev


