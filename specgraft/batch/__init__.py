"""Batched generation: many sequences, one target forward per step (continuous batching), and
the budget each batch size can afford (``budget.py``)."""

from specgraft.batch.budget import AdaptiveBudget, Acceptance, BudgetPolicy, CostTable, FixedBudget
from specgraft.batch.engine import BatchEngine, BatchEvent, BatchResult, QueueFull

__all__ = ["AdaptiveBudget", "Acceptance", "BatchEngine", "BatchEvent", "BatchResult", "BudgetPolicy", "CostTable", "FixedBudget", "QueueFull"]
