"""The KV cache: preallocated per-sequence slots, commit by an in-place gather (``slots.py``)."""

from specgraft.cache.slots import SlotCache

__all__ = ["SlotCache"]
