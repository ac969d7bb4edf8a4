"""Cheaper numerics for a draft model: ``int8``, ``bf16``, ``fp16`` or ``none``.

Drafting need not be exact: the target verifies every drafted token, so a draft model in
cheaper numerics changes only how many tokens are accepted (MAT), never the output. This
module is applied to draft models only (``models/loading.py``); the target is never quantized.

- ``none``: the draft in its load dtype (the target's, ``GraftOptions.draft_dtype``).
- ``bf16`` / ``fp16``: the draft loaded in that dtype. On CPUs without native bf16 (AVX2) both are
  emulated and slower than fp32 (``benchmarks/README.md``); on a GPU bf16 is the natural choice.
- ``int8``: every ``nn.Linear`` (lm_head included) quantized dynamically: int8 weights (one scale
  per output channel), activations quantized per call with a per-tensor scale, int32
  accumulation (fbgemm/oneDNN's ``quantized::linear_dynamic``). CPU only.
- ``auto``: ``int8`` on CPU (``none`` where torch has no quantized engine), ``bf16`` on a GPU
  (:data:`AUTO`). On this project's AVX2 CPU an int8 draft forward costs 2.4x less than fp32
  (62.8 against 153 ms for the 0.5B in the calibration runs); it loses 3-7% of MAT (graft-prune
  3.1-3.5%, draft-tree 6.5%), and ``graft-prune`` is 25% faster end to end with it (1.40x against
  1.12x ``ar`` timed in one process; ``benchmarks/RESULTS.md``). The issue's rule was "the
  fastest numerics losing under ~3% of MAT"; MAT is only a proxy for speed here (outputs are the
  target's whatever the draft computes in), and the measured speed decides, so int8 is the CPU
  default. bf16 and fp16 are emulated on AVX2 and slower from two rows on; a GPU computes bf16
  natively.

Which int8 API, on torch 2.13: ``torch.ao.quantization.quantize_dynamic``. torchao (0.18, the
package PyTorch points to in the deprecation notice of ``torch.ao.quantization``) was tried
first: ``quantize_(model, Int8DynamicActivationInt8WeightConfig())`` and
``Int8WeightOnlyConfig()`` install and run with torch 2.13 on this CPU, but in eager mode a
``[rows, 896] x [896, 4864]`` linear (the 0.5B's MLP) took 15 / 23 / 34 ms (dynamic) and
12 / 21 / 25 ms (weight-only) for 1 / 2 / 4 rows against 2.8 / 1.4 / 8.2 ms for
``quantize_dynamic`` and 11 / 3.8 / 5.8 ms for the prepacked fp32 linear (same process,
interleaved, on a loaded 2-core machine): torchao's eager CPU path is a decomposed int matmul
meant to be fused by ``torch.compile`` (``torchao.kernel.intmm._int_scaled_matmul_cpu``), so it
would make the draft slower than fp32. ``quantize_dynamic`` still ships (deprecated, with
warnings that this module silences) and calls fbgemm/oneDNN's fused int8 GEMM; revisit when
torchao's eager x86 path does.

Composition with the oneDNN swap (``models/kernels.py``): quantization replaces ``nn.Linear``
modules by ``torch.ao.nn.quantized.dynamic.Linear`` before the swap, and the swap only touches
exact ``nn.Linear`` modules, so a quantized linear is never re-swapped or upcast; whatever is
left in fp32 (none in the catalog models) still gets the prepacked kernel.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

#: Draft numerics by name (``--draft-quant``).
DRAFT_QUANTS = ("auto", "none", "int8", "bf16", "fp16")
#: What ``auto`` resolves to, per device type (module docstring: why int8 on CPU).
AUTO = {"cpu": "int8", "cuda": "bf16"}
_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def check_draft_quant(name: str) -> str:
    """``name`` if it is one of :data:`DRAFT_QUANTS`, else ``ValueError`` naming it.

    >>> check_draft_quant("int8")
    'int8'
    >>> check_draft_quant("int4")
    Traceback (most recent call last):
    ValueError: unknown draft quantization 'int4'; choose one of auto, none, int8, bf16, fp16
    """
    if name not in DRAFT_QUANTS:
        raise ValueError(f"unknown draft quantization {name!r}; choose one of {', '.join(DRAFT_QUANTS)}")
    return name


def int8_available() -> bool:
    """Whether this torch build has a quantized CPU engine for ``quantized::linear_dynamic``
    (fbgemm/x86 on x86 CPUs, qnnpack on ARM)."""
    return any(e != "none" for e in torch.backends.quantized.supported_engines)


def resolve_draft_quant(name: str, device: str | torch.device = "cpu") -> str:
    """``name`` with ``auto`` resolved for ``device``; ``ValueError`` for ``int8`` off the CPU.

    >>> resolve_draft_quant("auto", "cpu"), resolve_draft_quant("auto", "cuda"), resolve_draft_quant("none", "cpu")
    ('int8', 'bf16', 'none')
    """
    kind = torch.device(device).type
    name = check_draft_quant(name)
    if name == "auto":
        name = AUTO.get(kind, "none")
        if name == "int8" and not int8_available():
            name = "none"
    if name == "int8" and kind != "cpu":
        raise ValueError(f"draft quantization int8 runs on CPU only (device {kind!r}); use bf16 or none")
    return name


def draft_load_dtype(quant: str, dtype: str | torch.dtype) -> str | torch.dtype:
    """The dtype a draft model with resolved numerics ``quant`` is loaded in (``dtype``: the
    draft's dtype without quantization). int8 quantizes from float32.

    >>> draft_load_dtype("bf16", "float32"), draft_load_dtype("int8", "auto"), draft_load_dtype("none", "auto")
    ('bfloat16', 'float32', 'auto')
    """
    if quant == "int8":
        return "float32"
    return _DTYPES.get(quant, dtype)


def quantize_int8_dynamic(model: nn.Module) -> int:
    """Replace every fp32 ``nn.Linear`` of ``model`` (on CPU, in place) by a dynamically quantized
    int8 linear; returns how many. Plain ``nn.Linear`` modules only: call before the oneDNN swap."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        # torch.ao.quantization and quantized tensors warn that they are deprecated; this is
        # still their only fused int8 x86 path on torch 2.13 (module docstring)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*", category=UserWarning)
        quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
    return sum(isinstance(m, DynamicLinear) for m in model.modules())


def draft_numerics(model: nn.Module) -> str:
    """What a loaded draft model computes in: ``int8`` if its linears are quantized, else the
    dtype of its parameters (``float32``, ``bfloat16``, ...), as a run's resolved config records it."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    if any(isinstance(m, DynamicLinear) for m in model.modules()):
        return "int8"
    return str(next(model.parameters()).dtype).removeprefix("torch.")
