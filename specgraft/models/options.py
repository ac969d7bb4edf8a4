"""How a Hugging Face target computes: one frozen record instead of flags flipped on an object.

Every fast path of :class:`~specgraft.models.hf.HFTarget` has a plain twin that builds the same
inputs bit for bit; the tests build a second target with the twin's options and compare. Fields
left ``None`` are decided by the device (see each field).

Example::

    >>> opts = TargetOptions(prefill_chunk=64)
    >>> opts.plain_fast_path, opts.prefill_chunk
    (True, 64)
    >>> twin = opts.replace(plain_fast_path=False)      # the slow path the tests compare with
    >>> twin.plain_fast_path, opts.plain_fast_path
    (False, True)
    >>> TargetOptions(prefill_chunk=0)
    Traceback (most recent call last):
    ...
    ValueError: prefill_chunk must be >= 1, got 0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class TargetOptions:
    prefill_chunk: int | None = None
    """Rows per prefill forward; None: 256 on a CPU (a forward's activations stay in cache), 512 elsewhere."""
    capacity: int = 256
    """Initial rows per cache slot (the cache grows by doubling; ``HFTarget.reserve`` allocates once)."""
    lean: bool | None = None
    """The decoder's forward as one plain loop of the same ops (``models/lean.py``); None: on a CPU, for the models it supports, unless SPECGRAFT_LEAN=0."""
    cuda_graphs: bool | None = None
    """Forwards replayed as CUDA graphs (``models/graphs.py``); None: on a CUDA device unless SPECGRAFT_CUDA_GRAPHS=0."""
    plain_fast_path: bool = True
    """One-row-per-slot forwards build their inputs at once (``TreeInputs._plain_inputs``); False: the general path."""
    batched_tree_inputs: bool = True
    """Tree forwards of slots with equally many pending rows build their inputs at once; False: slot by slot."""
    host_tree_inputs: bool = True
    """One sequence's tree with nothing pending gets its inputs built on the host, sent in two copies; False: built on the device."""

    def __post_init__(self) -> None:
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")

    def replace(self, **changes) -> "TargetOptions":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)
