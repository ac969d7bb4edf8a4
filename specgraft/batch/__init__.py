"""Batched generation: many sequences, one target forward per step (continuous batching); the
budget each batch size affords comes from a policy of :mod:`specgraft.budget`."""

from specgraft.batch.engine import BatchEngine, BatchEvent, BatchResult, QueueFull

__all__ = ["BatchEngine", "BatchEvent", "BatchResult", "QueueFull"]
