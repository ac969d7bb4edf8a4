"""Cheaper numerics for a draft model: ``int8``, ``bf16``, ``fp16`` or ``none``.

Drafting need not be exact: the target verifies every drafted token, so a draft model in
cheaper numerics changes only how many tokens are accepted (MAT), never the output. This
module is applied to draft models only (``models/loading.py``); the target is never quantized.

- ``none``: the draft in its load dtype (the target's, ``GraftOptions.draft_dtype``).
- ``bf16`` / ``fp16``: the draft loaded in that dtype. On CPUs without native bf16 (AVX2) both are
  emulated and slower than fp32 (``benchmarks/README.md``); on a GPU bf16 is the natural choice.
- ``int8``: every ``nn.Linear`` (lm_head included) quantized dynamically: int8 weights (one scale
  per output channel), activations quantized per call, int32 accumulation (fbgemm/oneDNN's
  ``quantized::linear_dynamic``), with the rows of a long input grouped by scale
  (:class:`RowGroupedDynamicLinear`, below). CPU only.
- ``int8-tensor``: the same int8 linears with one activation scale per call whatever its rows
  (torch.ao's ``quantize_dynamic`` as it ships; the ``int8`` of before row groups), kept for
  comparisons.
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

Why rows are grouped by scale: the fused op quantizes its whole input with one scale, and a
draft prefills its prompt in one forward whose first tokens (the attention sinks: Qwen2.5's first
one or two positions, above all at the MLP's down projection) carry activations one to three
orders of magnitude above the rest, so every other row of the prompt is quantized with a few of
its 7 bits. Teacher-forced over the 12 short answers of ``benchmarks/RESULTS.md`` (309
positions, one row per forward after the prefill), the 0.5B int8 draft's top-1 against the 1.5B
target's next token was 67.3% with one scale per call (``int8-tensor``), 74.1% with row groups
(fp32 draft: 75.4%; *Row-grouped int8 activations* in RESULTS), and ``draft-tree`` took 100-102
steps instead of 114. Quantizing every row apart would call the op once per row; a per-token
int8 GEMM in eager mode (``torch._int_mm``: 164 ms for 80 x 896 x 4864 against 3 ms for the
fused op) or torchao's decomposed path (above) is far slower. Grouping keeps the fused op: the
rows over :data:`GROUP_RATIO` times the median row's magnitude leave the bulk and get calls of
their own (:func:`scale_groups`), so a linear makes one call, or two where a sink is in its
input; a prefill costs ~5% more (4.45 s against 4.25 s for the 12 prompts of 38-133 tokens;
the linears of a 480-token prefill ~8%). Inputs under :data:`GROUP_MIN_ROWS` rows (tree layers
and catch-up feeds, whose rows are ordinary tokens) take one call as before: the grouping test
alone would cost ~10% of a 3-row forward.

Composition with the oneDNN swap (``models/kernels.py``): quantization replaces ``nn.Linear``
modules by ``torch.ao.nn.quantized.dynamic.Linear`` before the swap, and the swap only touches
exact ``nn.Linear`` modules, so a quantized linear is never re-swapped or upcast; whatever is
left in fp32 (none in the catalog models) still gets the prepacked kernel.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

#: Draft numerics by name (``--draft-quant``); ``q4_0`` and ``q8_0`` requantize a GGUF draft
#: model on the llama.cpp backend (``models/gguf_requant.py``), the others are the torch backend's.
DRAFT_QUANTS = ("auto", "none", "int8", "int8-tensor", "bf16", "fp16", "q4_0", "q8_0")
#: The names only the llama.cpp backend takes.
GGUF_ONLY_QUANTS = ("q4_0", "q8_0")
#: The int8 numerics (both draft in int8; ``draft_numerics`` reports either as ``int8``).
INT8_QUANTS = ("int8", "int8-tensor")
#: Inputs with at least this many rows are quantized in scale groups (module docstring).
GROUP_MIN_ROWS = 16
#: A row whose largest magnitude is over this many times the median row's is quantized apart
#: from the bulk (with the outliers of its band: :func:`scale_groups`).
GROUP_RATIO = 8.0
#: What ``auto`` resolves to, per device type (module docstring: why int8 on CPU).
AUTO = {"cpu": "int8", "cuda": "bf16"}
_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def check_draft_quant(name: str) -> str:
    """``name`` if it is one of :data:`DRAFT_QUANTS`, else ``ValueError`` naming it.

    >>> check_draft_quant("int8")
    'int8'
    >>> check_draft_quant("int4")
    Traceback (most recent call last):
    ValueError: unknown draft quantization 'int4'; choose one of auto, none, int8, int8-tensor, bf16, fp16, q4_0, q8_0
    """
    if name not in DRAFT_QUANTS:
        raise ValueError(f"unknown draft quantization {name!r}; choose one of {', '.join(DRAFT_QUANTS)}")
    return name


def int8_available() -> bool:
    """Whether this torch build has a quantized CPU engine for ``quantized::linear_dynamic``
    (fbgemm/x86 on x86 CPUs, qnnpack on ARM)."""
    return any(e != "none" for e in torch.backends.quantized.supported_engines)


def resolve_draft_quant(name: str, device: str | torch.device = "cpu") -> str:
    """``name`` with ``auto`` resolved for ``device``; ``ValueError`` for ``int8`` off the CPU and
    for the llama.cpp backend's GGUF requantizations.

    >>> resolve_draft_quant("auto", "cpu"), resolve_draft_quant("auto", "cuda"), resolve_draft_quant("none", "cpu")
    ('int8', 'bf16', 'none')
    >>> resolve_draft_quant("q4_0", "cpu")
    Traceback (most recent call last):
    ValueError: draft quantization q4_0 requantizes a GGUF draft model on the llama.cpp backend (--backend llamacpp); here use auto, none, int8, int8-tensor, bf16 or fp16
    """
    kind = torch.device(device).type
    name = check_draft_quant(name)
    if name in GGUF_ONLY_QUANTS:
        torch_names = [q for q in DRAFT_QUANTS if q not in GGUF_ONLY_QUANTS]
        raise ValueError(
            f"draft quantization {name} requantizes a GGUF draft model on the llama.cpp backend (--backend llamacpp); "
            f"here use {', '.join(torch_names[:-1])} or {torch_names[-1]}"
        )
    if name == "auto":
        name = AUTO.get(kind, "none")
        if name == "int8" and not int8_available():
            name = "none"
    if name in INT8_QUANTS and kind != "cpu":
        raise ValueError(f"draft quantization {name} runs on CPU only (device {kind!r}); use bf16 or none")
    return name


def draft_load_dtype(quant: str, dtype: str | torch.dtype) -> str | torch.dtype:
    """The dtype a draft model with resolved numerics ``quant`` is loaded in (``dtype``: the
    draft's dtype without quantization). int8 quantizes from float32.

    >>> draft_load_dtype("bf16", "float32"), draft_load_dtype("int8", "auto"), draft_load_dtype("none", "auto")
    ('bfloat16', 'float32', 'auto')
    """
    if quant in INT8_QUANTS:
        return "float32"
    return _DTYPES.get(quant, dtype)


def _linear_dynamic(x: torch.Tensor, packed) -> torch.Tensor:
    """torch.ao's dynamic int8 linear as ``DynamicLinear.forward`` calls it (qint8 weights, version
    4: activations in 7 bits, ``reduce_range``, so that AVX2's int16 accumulation cannot overflow)."""
    return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=True)


def scale_groups(row_max: torch.Tensor, ratio: float = GROUP_RATIO) -> list[torch.Tensor]:
    """Row indices in scale groups: the bulk (every row whose largest magnitude is at most
    ``ratio`` times the median row's) first, then the outliers, grouped by the band
    ``[median * ratio^k, median * ratio^(k+1))`` they fall in, in increasing order. One group (all
    rows) when nothing stands out.

    ``row_max``: ``[rows]``, each row's ``max |x|``. The bulk stays one call of the fused op
    whatever its spread: splitting it costs more than it returns (bands of fixed edges cut a
    prompt's ordinary rows in two and made a 480-token prefill's linears 20% dearer).

    >>> [g.tolist() for g in scale_groups(torch.tensor([900.0, 3.0, 5.0, 2.5, 70.0, 4.0]))]
    [[1, 2, 3, 5], [4], [0]]
    >>> [g.tolist() for g in scale_groups(torch.tensor([3.0, 5.0, 0.5]))]
    [[0, 1, 2]]
    """
    median = row_max.median()
    outlier = row_max > ratio * median
    if not bool(outlier.any()):
        return [torch.arange(len(row_max))]
    rows = outlier.nonzero().squeeze(1)
    band = torch.floor(torch.log(row_max[rows] / median) / math.log(ratio))
    values, inverse = torch.unique(band, return_inverse=True)
    return [(~outlier).nonzero().squeeze(1), *(rows[inverse == j] for j in range(len(values)))]


class RowGroupedDynamicLinear(DynamicLinear):
    """torch.ao's dynamic int8 linear, with the rows of inputs of :data:`GROUP_MIN_ROWS` rows or
    more quantized in scale groups (:func:`scale_groups`; module docstring: why).

    Each group is one call of the fused op on its rows, so a row's result is exactly what the op
    gives that group alone; inputs with fewer rows, or with no outlier row, take one call (the
    plain module's result, bit for bit). Shapes: ``x [..., in_features]`` ->
    ``[..., out_features]``, rows = the product of the leading dimensions.

    >>> torch.manual_seed(0) and None
    >>> linear = RowGroupedDynamicLinear.from_float(_with_qconfig(nn.Linear(64, 32)))
    >>> x = torch.randn(20, 64); x[0] *= 1000  # one attention-sink-like row
    >>> exact = x @ linear.weight().dequantize().T + linear.bias()
    >>> grouped = (linear(x) - exact)[1:].abs().max()
    >>> one_scale = (_linear_dynamic(x, linear._packed_params._packed_params) - exact)[1:].abs().max()
    >>> bool(grouped * 20 < one_scale)
    True
    """

    def __init__(self, in_features: int, out_features: int, bias_: bool = True, dtype: torch.dtype = torch.qint8) -> None:
        if dtype != torch.qint8:
            raise ValueError(f"row groups are for int8 weights (qint8), not {dtype}")
        super().__init__(in_features, out_features, bias_, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the short path is every decode and tree forward: no more Python than it needs (going
        # through the plain module's forward cost ~20 us a call more, ~5% of a one-row draft
        # forward; this path is ~3 us a call cheaper than torch.ao's module)
        packed = self._packed_params._packed_params
        if x.numel() < GROUP_MIN_ROWS * self.in_features:
            return _linear_dynamic(x, packed)
        rows = x.reshape(-1, x.shape[-1])
        groups = scale_groups(rows.abs().amax(-1), GROUP_RATIO)
        if len(groups) == 1:
            return _linear_dynamic(x, packed)
        out = rows.new_empty(rows.shape[0], self.out_features)
        for index in groups:
            out.index_copy_(0, index, _linear_dynamic(rows.index_select(0, index), packed))
        return out.reshape(*x.shape[:-1], self.out_features)


def _with_qconfig(linear: nn.Linear) -> nn.Linear:
    """``linear`` with the per-channel dynamic qconfig that ``from_float`` reads."""
    from torch.ao.quantization import per_channel_dynamic_qconfig

    linear.qconfig = per_channel_dynamic_qconfig
    return linear


def quantize_int8_dynamic(model: nn.Module, row_groups: bool = True) -> int:
    """Replace every fp32 ``nn.Linear`` of ``model`` (on CPU, in place) by a dynamically quantized
    int8 linear (:class:`RowGroupedDynamicLinear`, or torch.ao's per-call scale with
    ``row_groups=False``); returns how many. Plain ``nn.Linear`` modules only: call before the
    oneDNN swap."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    mapping = {nn.Linear: RowGroupedDynamicLinear if row_groups else DynamicLinear}
    with _quiet():
        quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, mapping=mapping, inplace=True)
    return sum(isinstance(m, DynamicLinear) for m in model.modules())


class Int8Head:
    """An int8 copy of an output embedding ``[V, H]`` (one symmetric scale per vocabulary row,
    activations quantized per call, ``quantized::linear_dynamic``), for logits that only *choose
    drafts* (AdaPLD's branch tokens at a prompt anchor): never for verification, which always
    uses the target's own head. One row through Qwen2.5-1.5B's 151,936 x 1,536 head costs
    ~6 ms against ~22 ms for the fp32 head on a 2-core Zen 5 (the row reads the whole matrix; a
    quarter of the bytes in int8); the copy takes ``V * H`` bytes (+230 MiB resident).

    Built in ~3.8 s for that head (fbgemm's packing, with ``torch.backends.quantized.engine``
    as it is: ``x86``). Packing with oneDNN takes 2.0 s but keeps the unpacked int8 weight too
    (+452 MiB resident): 1.8 s more once at load costs less than 222 MiB more for as long as
    the model stays loaded.

    >>> head = Int8Head(torch.randn(50, 16))
    >>> head(torch.randn(2, 16)).shape
    torch.Size([2, 50])
    """

    def __init__(self, weight: torch.Tensor):
        if not int8_available():
            raise ValueError("this torch build has no quantized CPU engine for an int8 head")
        w = weight.detach().to("cpu", torch.float32)
        # per_channel_dynamic_qconfig's symmetric qint8 scales: the row's largest magnitude / 127.5
        scale = (w.abs().amax(dim=1) / 127.5).clamp_min(1e-12).double()
        with _quiet():
            q = torch.quantize_per_channel(w, scale, torch.zeros(len(w), dtype=torch.long), 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, None)
        self.out_features = len(w)

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, H]`` -> ``[n, V]`` float32 logits (approximate)."""
        return _linear_dynamic(hidden.to("cpu", torch.float32), self.packed)


@contextlib.contextmanager
def _quiet():
    """torch.ao.quantization and quantized tensors warn that they are deprecated; this is still
    their only fused int8 x86 path on torch 2.13 (module docstring)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*", category=UserWarning)
        yield


def draft_numerics(model: nn.Module) -> str:
    """What a loaded draft model computes in: ``int8`` if its linears are quantized (with or
    without row groups), else the dtype of its parameters (``float32``, ``bfloat16``, ...), as a
    run's resolved config records it."""
    if any(isinstance(m, DynamicLinear) for m in model.modules()):
        return "int8"
    return str(next(model.parameters()).dtype).removeprefix("torch.")
