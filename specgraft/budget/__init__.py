"""Budgets: how many tree nodes a step verifies, decided in one place from measured costs and gains.

- :mod:`~specgraft.budget.costs`: the cost table of a model on a device (``specgraft profile``)
  and where to find it; :mod:`~specgraft.budget.profile` measures one.
- :mod:`~specgraft.budget.acceptance`: acceptance by rank counted online, each method's measured
  gains per budget, what a batch's steps realize.
- :mod:`~specgraft.budget.defaults`: a method's default budget on a device (one sequence).
- :mod:`~specgraft.budget.policy` and :mod:`~specgraft.budget.adaptive`: the batch engine's budget
  per step and batch size (fixed, tuned per batch size offline, or the throughput-maximising
  adaptive policy).

Importing this package imports no torch (the profiler does, when imported itself).
"""

from specgraft.budget.acceptance import Acceptance, BudgetGains, Realized, budget_gains, gains_meta
from specgraft.budget.adaptive import AdaptiveBudget
from specgraft.budget.costs import CostTable, find_cost_table, resolve_cost_table, resolve_row_cost, table_name
from specgraft.budget.defaults import DerivedBudget, derive_budget
from specgraft.budget.policy import BudgetPolicy, FixedBudget, StepPlan, TunedBudget

__all__ = [
    "Acceptance",
    "AdaptiveBudget",
    "BudgetGains",
    "BudgetPolicy",
    "CostTable",
    "DerivedBudget",
    "FixedBudget",
    "Realized",
    "StepPlan",
    "TunedBudget",
    "budget_gains",
    "derive_budget",
    "find_cost_table",
    "gains_meta",
    "resolve_cost_table",
    "resolve_row_cost",
    "table_name",
]
