"""Faster CPU kernels, wrapped around plain modules (the model code never knows).

On CPUs where MKL's small-M fp32 GEMM is slow (seen on a 2-core AMD EPYC with AVX2: a
``[M, 1536] x [1536, 8960]`` product took 2.7 ms for M = 1 but 8.3 ms for M = 4), oneDNN's
linear is 2-2.5x faster for the 2-32 rows of a tree verify pass and a little faster for one
row. :func:`use_onednn_linears` swaps every ``nn.Linear`` of a model for :class:`OneDNNLinear`,
which shares the same weight tensors; ``nn.Linear`` is the plain twin and a test checks that
both give the same outputs. Applied to the model object itself, so every method and every
peer (Hugging Face ``generate``) measured on it runs the same kernels.

It also chooses a dtype: bf16 is only fast where the CPU computes in bf16 natively
(AVX512-BF16 or AMX); on AVX2 machines it is emulated and slower than fp32 at every size.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import nn


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class OneDNNLinear(nn.Module):
    """``nn.Linear`` computed by oneDNN; shares ``weight`` and ``bias`` with the module it replaces."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        # (B * T, C) -> (B * T, out)
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), self.weight, self.bias, "none", [], "")
        return y.reshape(*shape[:-1], self.out_features)


def use_onednn_linears(model: nn.Module) -> int:
    """Swap ``nn.Linear`` children (fp32, CPU) for :class:`OneDNNLinear`; returns how many."""
    if not onednn_available():
        return 0
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
                setattr(module, name, OneDNNLinear(child))
                swapped += 1
    return swapped


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """True where the CPU advertises AVX512-BF16 or AMX-BF16 (Linux ``/proc/cpuinfo``)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def auto_dtype(device: str = "cpu") -> str:
    """``bfloat16`` on GPUs and on CPUs with native bf16, ``float32`` elsewhere."""
    if device != "cpu":
        return "bfloat16"
    return "bfloat16" if cpu_has_native_bf16() else "float32"
