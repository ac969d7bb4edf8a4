"""Sibling projections fused into one linear: ``q/k/v_proj`` and ``gate/up_proj``.

In each decoder layer of the catalog models (Qwen2, Llama) three linears read the same input,
the attention's ``q_proj``, ``k_proj`` and ``v_proj``, and two read another, the MLP's
``gate_proj`` and ``up_proj``. Called apart they cost five GEMM calls a layer, each with its
fixed overhead and, for the int8 draft, its own quantization of the same activations; the
narrow key and value projections (896 -> 128 in the 0.5B) are mostly overhead. vLLM builds
these layers fused (``QKVParallelLinear``, ``MergedColumnParallelLinear``); this module does the
same to a loaded Hugging Face model without rewriting its attention or MLP code.

:func:`fuse_projections` concatenates each group's weights (and biases) into one ``nn.Linear``
registered on the parent module as ``qkv_proj`` or ``gate_up_proj``, and puts a
:class:`ProjectionSlice` in each member's place. The first member called computes the fused
output; the others, called with *the same tensor object* (Hugging Face passes one
``hidden_states`` to each), take their columns of it. The group drops the input and output once
its last member has read them, so nothing outlives the layer's forward. A member called with
another input (code that calls ``k_proj`` alone) still gets the right answer: the fused output
is computed for that input. (Assumed, as in Hugging Face's layers: the input is not modified in
place between the group's member calls.)

Numerics. The fused linear is an ordinary ``nn.Linear``, so the loaders' kernels apply to it as
to any other (``models/kernels.py`` prepacks it for oneDNN in fp32; ``models/quant.py`` quantizes
it for the int8 draft). Each output column is the same dot product as before:

- int8: weights keep one scale per output channel, and the activations of one call share one
  scale, the same for the fused call as for each member's (same input), with int32 accumulation:
  the fused outputs equal the separate ones bit for bit (``tests/unit/models/test_fusion.py``).
- fp32: each output is the same dot product over the same inputs, but a kernel may split the
  reduction differently for another output width, so in general outputs could differ by
  rounding; the 1.5B target's logits measured equal to the plain layout's bit for bit at 1-16 rows
  (oneDNN, Zen 3). Greedy exactness is against plain decoding with the *same* loaded model, fused
  as well; ``fuse=False`` in :func:`specgraft.models.loading.load_causal_lm` keeps the plain layout.

Measured (AMD EPYC Zen 3, 2 threads, 600 cached tokens, 16 alternating repeats;
``benchmarks/experiments/cpu-kernels/measure_fusion.py``): the fp32 1.5B target's forwards 4-9% cheaper at 1 / 4 / 16
rows and 2% at 8, the int8 0.5B draft's 5-7% at 1-4 rows. On an NVIDIA H100 (bf16, random
weights of the same shapes, 512 cached tokens, 20 alternating repeats; ``benchmarks/tools/gpu_check.sh``,
stage ``fusion``) the 1.5B's forwards 4-6% cheaper at 1-64 rows and the 0.5B's 1-4% at 1-8 rows,
logits equal bit for bit. So loaders fuse by default on any device (``fast_kernels``);
``fuse=False`` keeps the plain layout.

Example::

    layer = model.model.layers[0]
    fuse_projections(model)                 # 2 groups a layer
    layer.self_attn.qkv_proj                # nn.Linear(896, 1152): q 896 + k 128 + v 128
    layer.self_attn.k_proj(x)               # = the unfused k_proj(x), via the fused output
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from specgraft.models.kernels import shared_parameters

#: Groups of sibling linears (same input) by member names, and the fused linear's name.
GROUPS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("q_proj", "k_proj", "v_proj"), "qkv_proj"),
    (("gate_proj", "up_proj"), "gate_up_proj"),
)


class _Group:
    """Shared by a group's slices (a plain object, so the parent module is not registered twice):
    where the fused linear lives, and per thread the last input it ran on, its output and how
    many members have read it (per thread: two threads may run forwards of one model)."""

    __slots__ = ("owner", "name", "members", "pending")

    def __init__(self, owner: nn.Module, name: str, members: int):
        self.owner, self.name, self.members = owner, name, members
        # thread id -> [input, output, reads]; a dict (not threading.local) so models deep-copy
        self.pending: dict[int, list] = {}

    def fused(self) -> nn.Module:
        # looked up at call time: quantization or the oneDNN swap replace the parent's child
        return getattr(self.owner, self.name)

    def output_for(self, x: torch.Tensor) -> torch.Tensor:
        me = threading.get_ident()
        entry = self.pending.get(me)
        if entry is None or entry[0] is not x:
            entry = self.pending[me] = [x, self.fused()(x), 0]
        entry[2] += 1
        if entry[2] >= self.members:  # every member has its slice: let the tensors go
            del self.pending[me]
        return entry[1]


class ProjectionSlice(nn.Module):
    """One member of a fused group: columns ``[start, stop)`` of the fused linear's output.

    >>> parent = nn.Module(); parent.q_proj, parent.k_proj = nn.Linear(4, 3), nn.Linear(4, 2)
    >>> x = torch.randn(5, 4); q, k = parent.q_proj(x), parent.k_proj(x)
    >>> _fuse_group(parent, ("q_proj", "k_proj"), "qk_proj")
    True
    >>> parent.k_proj, torch.allclose(parent.q_proj(x), q), torch.allclose(parent.k_proj(x), k)
    (ProjectionSlice(qk_proj[3:5]), True, True)
    """

    def __init__(self, group: _Group, start: int, stop: int, in_features: int):
        super().__init__()
        self._group = group
        self.start, self.stop = start, stop
        self.in_features, self.out_features = in_features, stop - start

    @property
    def weight(self) -> torch.Tensor:
        """This member's rows of the fused weight (unpacked or dequantized as the kernel allows)."""
        w = self._group.fused().weight
        w = w() if callable(w) else w  # quantized linears expose weight() as a method
        return w[self.start : self.stop]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._group.output_for(x)[..., self.start : self.stop]

    def extra_repr(self) -> str:
        return f"{self._group.name}[{self.start}:{self.stop}]"


def _fuse_group(parent: nn.Module, names: tuple[str, ...], fused_name: str) -> bool:
    """Fuse ``parent``'s linears ``names`` into ``parent.<fused_name>`` if they are all plain
    ``nn.Linear`` modules on one input size, dtype and device, with biases all or none."""
    linears = [getattr(parent, n, None) for n in names]
    if hasattr(parent, fused_name) or not all(type(lin) is nn.Linear for lin in linears):
        return False
    first = linears[0]
    if any(
        lin.in_features != first.in_features
        or lin.weight.dtype != first.weight.dtype
        or lin.weight.device != first.weight.device
        or (lin.bias is None) != (first.bias is None)
        for lin in linears
    ):
        return False
    widths = [lin.out_features for lin in linears]
    fused = nn.Linear(first.in_features, sum(widths), bias=first.bias is not None, device="meta")
    with torch.no_grad():
        fused.weight = nn.Parameter(torch.cat([lin.weight for lin in linears]), requires_grad=False)
        if first.bias is not None:
            fused.bias = nn.Parameter(torch.cat([lin.bias for lin in linears]), requires_grad=False)
    setattr(parent, fused_name, fused)
    group = _Group(parent, fused_name, len(names))
    start = 0
    for name, width in zip(names, widths):
        setattr(parent, name, ProjectionSlice(group, start, start + width, first.in_features))
        start += width
    return True


def fuse_by_default(fuse: bool | None, device: torch.device | str, fast_kernels: bool = True) -> bool:
    """Whether a loader fuses: ``fuse`` when given, else with the fast kernels, on any device
    (measured faster on a Zen 3 CPU and an H100: module docstring). ``device`` is kept so a
    device where fusing does not pay can be told apart here.

    >>> fuse_by_default(None, "cpu"), fuse_by_default(None, "cuda"), fuse_by_default(None, "cpu", fast_kernels=False), fuse_by_default(False, "cuda")
    (True, True, False, False)
    """
    return fast_kernels if fuse is None else fuse


def fuse_projections(model: nn.Module) -> int:
    """Fuse every group of :data:`GROUPS` found in ``model`` (module docstring); returns how many
    groups were fused. Modules whose members are not plain ``nn.Linear`` (already quantized or
    swapped) or differ in input size, dtype, device or bias are left as they are, as are weights
    shared with another module (tied), which concatenation would untie."""
    tied = shared_parameters(model)
    n = 0
    for parent in list(model.modules()):
        for names, fused_name in GROUPS:
            members = [getattr(parent, name, None) for name in names]
            if any(isinstance(m, nn.Linear) and id(m.weight) in tied for m in members):
                continue
            n += _fuse_group(parent, names, fused_name)
    return n


def fused_groups(model: nn.Module) -> int:
    """How many fused groups ``model`` holds (0 for a plain model)."""
    firsts = [names[0] for names, _ in GROUPS]
    return sum(isinstance(getattr(m, name, None), ProjectionSlice) for m in model.modules() for name in firsts)
