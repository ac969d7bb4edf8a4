"""Faster CPU kernels, wrapped around plain modules (the model code never knows).

A verify pass feeds 2-32 rows through every linear layer, and on CPU those small-M GEMMs are
where a tree method's time goes (92-94% of a forward of Qwen2.5-Coder-1.5B here). Measured on
the 2-core AMD EPYC (AVX2, fp32) this project runs on, for a ``[M, 1536] x [1536, 8960]``
product: MKL (``F.linear``) 4.0 / 7.5 / 11 / 16 ms for M = 1 / 2 / 4 / 8; oneDNN on the plain
weight 1.7 / 3.8 / 5.5 / 5.0 ms; oneDNN on a weight *reordered once* into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``) 1.9 / 2.0 / 3.4 / 3.5 ms, so the plain-weight
paths repack the weight on every call. For the whole 1.5B model (200 cached tokens, medians):

=====  ============  ==============  ==================
rows   oneDNN plain  oneDNN packed   packed / one row
=====  ============  ==============  ==================
1      0.34 s        0.28-0.30 s     1.0
2      0.52 s        0.30 s          1.05
4      0.59 s        0.39 s          1.35
8      0.67 s        0.48 s          1.65
16     0.93 s        0.68 s          2.35
32     1.19 s        1.01 s          3.5
=====  ============  ==============  ==================

so :class:`OneDNNLinear` keeps the reordered copy and uses it for every input size (one row
included: 302 vs 309 ms interleaved in one process; prefill-sized inputs are also faster).
It keeps *only* the reordered copy: the plain weight is freed, and ``weight`` unpacks it on
demand (exactly: the reorder only moves values). The one exception is a weight another module
also uses (an output embedding tied to the input embedding): that plain copy stays, because
the embedding gathers its rows. So an fp32 model on CPU takes about its own size in memory, not
twice it (measured per catalog model in the README's CPU section). Weights are assumed frozen
(inference); pass ``fast_kernels=False`` to :func:`specgraft.models.loading.load_causal_lm` to keep
plain ``nn.Linear``. ``nn.Linear`` is the plain twin and ``tests/unit/models/test_kernels.py`` checks both
agree. Applied to the model object itself, so every method and every peer (Hugging Face
``generate``) measured on it runs the same kernels.

**Small inputs padded** (``min_rows``). On some CPUs oneDNN's packed kernel is slower for 1-2
input rows than for 4: on a 2-core AMD EPYC Zen 4 (AVX-512) a whole 1.5B forward over 1 / 2 / 4
/ 8 new rows took 238 / 298 / 196 / 258 ms (interleaved, 300 cached tokens), and padding every
linear's input of fewer than 4 rows with zero rows to 4 (the extra outputs dropped) made 1- and
2-row forwards 17-19% faster (292 -> 244 ms and 326 -> 265 ms, in a slower hour of the same
machine), with logits within 1.5e-5 of the unpadded ones; over 8 tuning prompts at 64 tokens `ar` ran 1.17x
faster and `pld` 1.13x (`benchmarks/experiments/cpu-kernels/measure_small_input_rows.py`). On the Zen 3 above the opposite holds
(4 rows cost more than 1), so padding is per machine: :func:`small_input_rows` reads it from
the model's cost table (``specgraft profile``: pad to the cheapest row count up to 4 when it
beats one row by more than 5%), and :class:`~specgraft.api.SpecDecoder` applies it with
:func:`set_min_rows`; without a table nothing is padded. Every row's output comes from the
same kernel whatever the other rows hold, so a padded row equals that row in a genuine 4-row
input (``tests/unit/models/test_kernels.py``).

It also chooses the default dtype (:func:`auto_dtype`): float32 on every CPU, where it is the
exact dtype and bf16 buys no decoding speed; bf16 on GPUs.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn


#: Batch-size hint for oneDNN's weight reorder; 32 measured best across 1-512 rows here.
PACK_HINT_ROWS = 32


def onednn_available() -> bool:
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class OneDNNLinear(nn.Module):
    """``nn.Linear`` computed by oneDNN on a weight reordered once into oneDNN's blocked layout.

    ``packed`` (an opaque ``torch._mkldnn`` tensor) is the only copy of the weight it keeps,
    unless ``tied``: then the plain weight, which another module shares, stays registered as
    ``weight``. Otherwise ``weight`` is read-only and unpacked on each read (a new ``[out, in]``
    tensor equal to the original). ``bias`` is the replaced module's. ``state_dict`` holds
    ``weight`` and ``bias`` either way, so saving and loading see an ``nn.Linear``.

    Example::

        lin = nn.Linear(48, 80)
        fast = OneDNNLinear(lin)
        fast(torch.randn(2, 5, 48)).shape     # torch.Size([2, 5, 80]), = lin's output
        torch.equal(fast.weight, lin.weight)  # True, unpacked from fast.packed
    """

    def __init__(self, linear: nn.Linear, tied: bool = False):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.bias = linear.bias
        if tied:
            # set directly: the ``weight`` property would shadow register_parameter's name check
            self._parameters["weight"] = linear.weight
        self.packed = pack_linear_weight(linear.weight)
        self.min_rows = 1  # inputs of fewer rows are padded to this many (module docstring)

    @property
    def weight(self) -> torch.Tensor:
        shared = self._parameters.get("weight")
        return shared if shared is not None else self.packed.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        # (B * T, C) -> (B * T, out)
        flat = x.reshape(-1, shape[-1])
        m = flat.shape[0]
        padded = 0 < m < self.min_rows
        if padded:
            flat = torch.cat([flat, flat.new_zeros(self.min_rows - m, shape[-1])])
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return (y[:m] if padded else y).reshape(*shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if "weight" not in self._parameters:
            destination[prefix + "weight"] = self.weight

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        key = prefix + "weight"
        if "weight" not in self._parameters:
            if key in state_dict:
                self.packed = pack_linear_weight(state_dict[key])
                state_dict = {k: v for k, v in state_dict.items() if k != key}
            elif strict:
                missing_keys.append(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)


def small_input_rows(costs, margin: float = 0.05, most: int = 4) -> int:
    """The row count to pad smaller inputs to, from a cost table's one-sequence forwards: the
    cheapest measured count up to ``most`` when it beats one row by more than ``margin``, else 1.

    >>> from specgraft.budget.costs import CostTable
    >>> small_input_rows(CostTable("m", "cpu", {1: {1: 0.352, 2: 0.385, 4: 0.309, 8: 0.353}}))  # Zen 4
    4
    >>> small_input_rows(CostTable("m", "cpu", {1: {1: 0.382, 4: 0.541, 8: 0.563}}))  # Zen 3
    1
    """
    rows = {n: t for n, t in costs.seconds.get(1, {}).items() if 1 <= n <= most}
    if 1 not in rows:
        return 1
    best = min(rows, key=lambda n: (rows[n], n))
    return best if rows[best] < (1 - margin) * rows[1] else 1


def set_min_rows(model: nn.Module, rows: int) -> int:
    """Pad every :class:`OneDNNLinear` input of ``model`` with fewer than ``rows`` rows to
    ``rows`` (1 = never); returns how many linears were set."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    n = 0
    for module in model.modules():
        if isinstance(module, OneDNNLinear):
            module.min_rows = rows
            n += 1
    return n


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` reordered into oneDNN's blocked layout for :class:`OneDNNLinear`."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(torch.float32), PACK_HINT_ROWS)


def shared_parameters(model: nn.Module) -> set[int]:
    """``id`` of every parameter that more than one module of ``model`` registers (tied weights)."""
    counts = Counter(id(p) for module in model.modules() for p in module.parameters(recurse=False))
    return {key for key, n in counts.items() if n > 1}


def use_onednn_linears(model: nn.Module) -> int:
    """Swap ``nn.Linear`` children (fp32, CPU) for :class:`OneDNNLinear`; returns how many.

    Only exact ``nn.Linear`` modules are swapped: quantized linears (``models/quant.py``) and
    other subclasses keep their own kernels. The plain weight of a swapped linear is freed
    unless another module shares it (tied embeddings).
    """
    if not onednn_available():
        return 0
    tied = shared_parameters(model)
    # (parent, name) pairs, not the linears: each plain weight is freed as soon as it is packed,
    # so loading never holds two copies of more than one layer
    places = [
        (module, name)
        for module in model.modules()
        for name, child in module.named_children()
        if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu"
    ]
    for module, name in places:
        linear = getattr(module, name)
        setattr(module, name, OneDNNLinear(linear, tied=id(linear.weight) in tied))
        del linear
    return len(places)


def auto_dtype(device: str = "cpu") -> str:
    """``float32`` on every CPU, ``bfloat16`` on GPUs.

    float32 is the dtype in which every method's output equals plain decoding token for token.
    In bf16 a forward of several rows and one of a single row round differently, so near-tied
    tokens can flip (``specgraft generate --compare`` measures it); on a CPU bf16 also buys
    no decoding speed, even with native bf16 (memory-bound), so a CPU never pays that price by
    default. On a GPU bf16 halves the weights' memory traffic, and stays the default there.

    >>> auto_dtype("cpu"), auto_dtype("cuda")
    ('float32', 'bfloat16')
    """
    return "float32" if device == "cpu" else "bfloat16"
