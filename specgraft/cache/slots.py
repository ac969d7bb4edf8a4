"""A KV cache of preallocated slots: one sequence per slot, each with its own length.

Every attention layer keeps two buffers ``[slots, kv_heads, capacity, head_dim]``. A sequence
owns one slot; its **committed** rows (tokens whose KV is final) are ``0 .. length - 1`` of its
slot, and a forward writes new rows right after its **pending** rows (rows of the current
proposal, not yet accepted or rejected), at that slot's own offset. Nothing is concatenated:
a forward writes ``n`` rows per sequence in place, and :meth:`SlotCache.commit` moves the
accepted rows down to the sequence's end with one gather per layer (no holes), so the next
forward writes after them. Masks and positions are explicit (``models/hf.py``), so the rows
beyond a sequence's end are never seen, whatever they hold, and RoPE needs no model change.

Example, one slot, ``length = 3``: a verify pass writes rows 3..6 (root, three nodes); the
target accepts the root and nodes 1 and 2 (pass rows 0, 2, 3): ``commit(slot, [0, 2, 3])``
copies rows 5, 6 to 4, 5 and sets ``length = 6``. Row 3 (the root) is already in place.

Single-sequence generation is the one-slot case of the same code. Buffers are inference
tensors (made inside ``torch.inference_mode``), so every method that writes them runs in it. Forwards run over a
set of slots; over a contiguous range (``slots = range(a, b)``, e.g. one sequence) keys and
values reach attention as views of the buffers, over any other set (a batch whose members
joined and left at different times) as one gather per layer (``[B, H, kv_len, D]``; on a CPU
that is well under 1% of the weights a forward reads).

:class:`SlotCache` subclasses ``transformers``' ``Cache``: the model calls
``past_key_values.update(keys, values, layer_idx)`` in every attention layer, as for its own
caches; the adapter says where to write beforehand (:meth:`SlotCache.set_write`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


@dataclass
class Write:
    """Where the next forward writes: slots ``slots``, ``rows`` new rows each, the first at
    ``offsets[b]``; attention sees rows ``0 .. kv_len - 1``."""

    slots: list[int]
    # [B] host ints: first row written per slot
    offsets: list[int]
    rows: int
    kv_len: int
    # [B, rows] row of every new row (only when the offsets differ), built once per forward
    row_index: torch.Tensor | None = None
    # [B] the slots as a device tensor (only when they are not a contiguous range), built once
    slot_index: torch.Tensor | None = None

    def new_rows(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[B, rows]`` the cache row of every new row: ``offsets[b] + j``.

        >>> Write([0, 1], [3, 5], 2, 7).new_rows().tolist()
        [[3, 4], [5, 6]]
        """
        return torch.tensor(self.offsets, device=device)[:, None] + torch.arange(self.rows, device=device)[None]

    @property
    def contiguous(self) -> bool:
        """The slots are ``start, start + 1, ...``: buffers are read as views.

        >>> Write([2, 3], [0, 0], 1, 1).contiguous, Write([3, 1], [0, 0], 1, 1).contiguous
        (True, False)
        """
        return self.slots == list(range(self.slots[0], self.slots[0] + len(self.slots)))


class SlotLayer(CacheLayerMixin):
    """One decoder layer's keys and values in every slot (buffers owned here, sized by the cache)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, cache: "SlotCache"):
        super().__init__()
        self.cache = cache
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # [slots, kv_heads, capacity, head_dim]
        shape = (self.cache.num_slots, key_states.shape[1], self.cache.capacity)
        self.keys = key_states.new_zeros(*shape, key_states.shape[-1])
        self.values = value_states.new_zeros(*shape, value_states.shape[-1])
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, H, n, D]`` new rows where :class:`Write` says; return ``[B, H, kv_len, D]`` views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        w = self.cache.write
        if w is None:
            raise RuntimeError("SlotCache.update outside a forward prepared by set_write")
        device = self.keys.device
        if w.row_index is None and (len(set(w.offsets)) > 1 or not w.contiguous):
            w.row_index = w.new_rows(device)
        if not w.contiguous:
            # [B] any slots: advanced indices write [B, n, H, D] and gather [B, H, kv_len, D]
            if w.slot_index is None:
                w.slot_index = torch.tensor(w.slots, device=device)
            slot = w.slot_index
            self.keys[slot[:, None], :, w.row_index] = key_states.transpose(1, 2)
            self.values[slot[:, None], :, w.row_index] = value_states.transpose(1, 2)
            return self.keys[slot, :, : w.kv_len], self.values[slot, :, : w.kv_len]
        start, stop = w.slots[0], w.slots[0] + len(w.slots)
        if w.row_index is None:
            off = w.offsets[0]
            self.keys[start:stop, :, off : off + w.rows] = key_states
            self.values[start:stop, :, off : off + w.rows] = value_states
        else:
            # [B, n] slot and row of every new row; advanced indices around a slice put their
            # dimensions first: [B, n, H, D]
            slot = torch.arange(start, stop, device=device)[:, None]
            self.keys[slot, :, w.row_index] = key_states.transpose(1, 2)
            self.values[slot, :, w.row_index] = value_states.transpose(1, 2)
        return self.keys[start:stop, :, : w.kv_len], self.values[start:stop, :, : w.kv_len]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # masks are always passed explicitly (models/hf.py); this answers what update returns
        w = self.cache.write
        return (w.kv_len if w is not None else self.get_seq_length() + query_length), 0

    def get_seq_length(self) -> int:
        return max(self.cache.lengths, default=0)

    def get_max_length(self) -> int:
        return self.cache.capacity

    def resize(self, num_slots: int, capacity: int) -> None:
        """Grow the buffers to ``[num_slots, H, capacity, D]``, keeping what they hold."""
        if not self.is_initialized:
            return
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(num_slots, old.shape[1], capacity, old.shape[-1])
            new[: old.shape[0], :, : old.shape[2]] = old
            setattr(self, name, new)

    def move_rows(self, slot: int, src: torch.Tensor, dst_start: int) -> None:
        """Rows ``src`` of ``slot`` to ``dst_start .. dst_start + len(src) - 1`` (``src`` ascending,
        each at or after its target, so the gather is read before anything is overwritten)."""
        if not self.is_initialized:
            return
        m = len(src)
        self.keys[slot, :, dst_start : dst_start + m] = self.keys[slot].index_select(1, src)
        self.values[slot, :, dst_start : dst_start + m] = self.values[slot].index_select(1, src)


class SlotCache(Cache):
    """Per-slot committed lengths and pending rows over one :class:`SlotLayer` per decoder layer.

    Bookkeeping (lengths, pending rows, free slots) is plain host data: the adapter reads it to
    build masks and positions, and nothing here needs a device sync.

    >>> cache = SlotCache(num_layers=2, capacity=16)
    >>> s = cache.allocate()
    >>> cache.lengths[s], cache.pending[s]
    (0, 0)
    """

    def __init__(self, num_layers: int, capacity: int = 256, num_slots: int = 1):
        if capacity < 1 or num_slots < 1:
            raise ValueError(f"capacity and num_slots must be >= 1, got {capacity}, {num_slots}")
        self.capacity = capacity
        self.num_slots = num_slots
        self.lengths = [0] * num_slots
        self.pending = [0] * num_slots
        self.free = list(range(num_slots - 1, -1, -1))
        self.write: Write | None = None
        # bumped whenever the buffers are reallocated (more slots or rows): whatever holds their
        # addresses (a captured CUDA graph, ``models/graphs.py``) must not use the old ones
        self.version = 0
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])

    # -- slots ---------------------------------------------------------------------------

    def allocate(self) -> int:
        """A free slot (empty), growing the cache by doubling its slots when none is free."""
        if not self.free:
            self._resize(self.num_slots * 2, self.capacity)
        slot = self.free.pop()
        self.lengths[slot] = self.pending[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        self._check(slot)
        self.lengths[slot] = self.pending[slot] = 0
        self.free.append(slot)

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows per slot (doubling, so growing one step at a time stays cheap)."""
        if rows > self.capacity:
            capacity = self.capacity
            while capacity < rows:
                capacity *= 2
            self._resize(self.num_slots, capacity)

    @torch.inference_mode()
    def _resize(self, num_slots: int, capacity: int) -> None:
        for layer in self.layers:
            layer.resize(num_slots, capacity)
        added = num_slots - self.num_slots
        self.lengths += [0] * added
        self.pending += [0] * added
        self.free = list(range(num_slots - 1, self.num_slots - 1, -1)) + self.free
        self.num_slots, self.capacity = num_slots, capacity
        self.version += 1

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or slot in self.free:
            raise ValueError(f"slot {slot} is not an allocated slot of this cache")

    # -- forwards ------------------------------------------------------------------------

    def set_write(self, slots: Sequence[int], rows: int) -> Write:
        """Prepare a forward of ``rows`` new rows in each of ``slots`` (distinct; after their pending rows)."""
        slots = [int(s) for s in slots]
        if not slots or len(set(slots)) != len(slots):
            raise ValueError(f"a forward needs distinct slots, got {slots}")
        for s in slots:
            self._check(s)
        offsets = [self.lengths[s] + self.pending[s] for s in slots]
        self.reserve(max(offsets) + rows)
        self.write = Write(slots=slots, offsets=offsets, rows=rows, kv_len=max(offsets) + rows)
        return self.write

    def end_write(self, pending_rows: Sequence[int]) -> None:
        """After the forward: each slot of the write holds ``pending_rows[b]`` more pending rows."""
        w = self.write
        assert w is not None and len(pending_rows) == len(w.offsets)
        for slot, n in zip(w.slots, pending_rows):
            self.pending[slot] += n
        self.write = None

    @torch.inference_mode()
    def commit(self, slot: int, keep_rows: Sequence[int]) -> None:
        """Keep the pending rows ``keep_rows`` of ``slot`` (ascending; row 0 = the first pending
        row), in that order, at the end of its committed rows; drop the other pending rows."""
        self._check(slot)
        m = len(keep_rows)
        if any(not 0 <= r < self.pending[slot] for r in keep_rows) or any(a >= b for a, b in zip(keep_rows, keep_rows[1:])):
            raise ValueError(f"rows {list(keep_rows)} are not ascending rows of the {self.pending[slot]} pending ones")
        length = self.lengths[slot]
        if any(r != i for i, r in enumerate(keep_rows)):
            device = self.layers[0].keys.device if self.layers[0].is_initialized else "cpu"
            src = torch.tensor(keep_rows, dtype=torch.long, device=device) + length
            for layer in self.layers:
                layer.move_rows(slot, src, length)
        self.lengths[slot] = length + m
        self.pending[slot] = 0

    def discard(self, slot: int) -> None:
        """Drop the pending rows of ``slot``."""
        self._check(slot)
        self.pending[slot] = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths, default=0)
