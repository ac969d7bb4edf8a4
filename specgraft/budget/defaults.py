"""Default budgets derived from the device's cost table: each method verifies, per step, the
number of nodes with the best predicted tokens/s on *this* device, so a GPU (where 60 rows cost
about one step) gets a GPU budget and a 2-core CPU (where every row costs ~9% of a step) a CPU
budget, from one rule and without a preset.

For one sequence at budget ``k``, with ``E(k)`` the tokens a step emits, ``N(k)`` the nodes it
verifies on average (prompt lookup proposes only nodes that pass its cut, so ``N(k) <= k``) and
``D(k)`` its drafting time::

    tokens/s(k) = E(k) / (T(1, 1 + N(k)) + D(k))

``T`` is the :class:`~specgraft.budget.costs.CostTable` of the model on the device
(``specgraft profile``; the table the batch engine's :class:`~specgraft.budget.adaptive.AdaptiveBudget`
reads), made non-decreasing in rows (a single measurement can dip: 4 rows measured faster than
2 on one CPU). ``E``, ``N`` and ``D`` were measured once per method at each of a few budgets,
greedily on tuning prompts that no benchmark uses (``benchmarks/measure_budget_gains.py``), and
ship in ``specgraft/data/budget_gains.json``. ``E`` and ``N`` depend on the method and the models,
not on the device; ``D`` is stored as a multiple of the target's plain decode step on the machine
that measured it and read against ``T(1, 1)`` of the table in use (an approximation: it assumes a
draft forward costs the same share of a target forward everywhere; for model-free methods ``D``
is a few milliseconds and hardly matters). The default is the measured budget with the best
prediction, with two guards against the prediction's own error (a few percent, as are the
gains between neighbouring budgets): the fixed default (``DEFAULT_BUDGETS``, tuned by budget
sweeps on real runs) stays unless another budget predicts more than :data:`TIE` above it, and
among the budgets within :data:`TIE` of the best the smallest is taken. Measured on a 2-core
Zen 5, the prediction favoured ``graft-prune`` at budget 4 over 8 by 0.2% where 8 ran 5% faster
(``benchmarks/RESULTS.md``, "Default budgets from the cost table"): without the anchor, such
near-ties would move defaults for nothing.

Measured per budget rather than per tree position: a budget-``k`` tree is not the first ``k``
nodes of a larger one (draft-tree nodes come in topological order, and each drafter picks its
own best nodes for the budget it gets). The gains were measured with the 1.5B/0.5B catalog pair
(int8 draft, the CPU default); for another model they are a prior, not a measurement
(``--budget``, or ``--cost-table none`` for the fixed defaults).

Worked example (``draft-tree``, gains as shipped: ``E = 3.49 / 4.82`` tokens per step at budgets
4 / 8 with ``N = 3.7 / 7.1`` nodes and drafting 0.49 / 0.84 plain steps): on the 2-core Zen 3
table (1 row 382 ms, 4 rows 541 ms, 8 rows 563 ms, 16 rows 815 ms) a step at budget 8 takes
0.89 s (0.57 s verifying, 0.32 s drafting) against 0.73 s at 4 (+21%) for 38% more tokens: 5.4
against 4.8 tokens/s, so 8, the fixed default too. Budget 16 (``E = 5.41``, ``N = 12.2``,
drafting 0.94) predicts 5.0: its extra rows and drafting cost more than its 12% more tokens.

Where the derivation does not apply, the fixed defaults stay (``DEFAULT_BUDGETS``; the preset's
budget for the draft-model methods): no table for this model and device; prompt lookup (``pld``
and the AdaPLD methods, ``registry.PROMPT_LOOKUP_METHODS``), whose per-step cut already decides
its rows and whose cap binds only on long, confident copies that the short tuning prompts
rarely contain (the derived 4 ran 15% slower than 16 on input-guided prompts on the Zen 3); a method without
measured gains (``ar``, READER, whose shape comes from ``specgraft tune``); a draft-model method
run with another preset, depth, top-k, extension or early stop than the gains were measured
with (their meta records the cpu preset's), or with a Graft calibration (its thresholds were
fitted at the preset's budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from specgraft.budget.acceptance import BudgetGains, budget_gains
from specgraft.budget.costs import CostTable

#: The default is the smallest budget whose predicted tokens/s is within this share of the best.
TIE = 0.02


@dataclass(frozen=True)
class DerivedBudget:
    """A method's default budget on one device, and what the cost table predicts for it.

    >>> DerivedBudget("pld", 8, 1.4, 1.2, "m-cpu-t2.json").describe()
    'budget 8 from m-cpu-t2.json (predicted 1.40 tokens/step, 1.20x plain decoding)'
    """

    method: str
    budget: int
    tokens_per_step: float
    """Measured tokens per step at ``budget`` (``E(k)``)."""
    speedup: float
    """Predicted tokens/s over plain decoding's, drafting time left out."""
    table: str
    """The cost table's file name (or its model name when given as an object)."""

    def describe(self) -> str:
        return f"budget {self.budget} from {self.table} (predicted {self.tokens_per_step:.2f} tokens/step, {self.speedup:.2f}x plain decoding)"


def verify_cost(costs: CostTable, rows: float) -> float:
    """``T(1, rows)`` made non-decreasing in rows: never below a smaller row count's measurement.

    >>> t = CostTable("m", "cpu", {1: {1: 0.30, 2: 0.36, 4: 0.33, 8: 0.50}})
    >>> verify_cost(t, 4), verify_cost(t, 3), round(verify_cost(t, 6), 3)
    (0.36, 0.36, 0.415)
    """
    measured = sorted(costs.seconds.get(1, {}))
    floor = max((costs.cost(1, n) for n in measured if n <= rows), default=0.0)
    return max(costs.cost(1, rows), floor)


def predicted_tokens_per_s(costs: CostTable, gains: BudgetGains) -> list[float]:
    """Predicted single-sequence tokens/s at each measured budget (module docstring)."""
    step = costs.cost(1, 1)
    draft = gains.draft_steps or (0.0,) * len(gains.budgets)
    return [e / (verify_cost(costs, 1 + n) + d * step) for e, n, d in zip(gains.tokens_per_step, gains.nodes_per_step, draft)]


def choose(budgets: Sequence[int], rates: Sequence[float], tie: float = TIE, anchor: int | None = None) -> int:
    """Index of the budget to use: ``anchor`` (the fixed default) when it is measured and its
    rate is within ``tie`` of the best rate; else the smallest budget within ``tie`` of the best.

    >>> choose([1, 4, 16], [2.0, 2.5, 2.51]), choose([1, 4, 16], [2.0, 2.5, 2.6])
    (1, 2)
    >>> choose([1, 4, 16], [2.0, 2.5, 2.51], anchor=16), choose([1, 4, 16], [2.0, 2.6, 2.5], anchor=16)
    (2, 1)
    """
    best = max(rates)
    if anchor in budgets and rates[list(budgets).index(anchor)] >= best * (1 - tie):
        return list(budgets).index(anchor)
    return min((i for i, r in enumerate(rates) if r >= best * (1 - tie)), key=budgets.__getitem__)


def derive_budget(
    method: str, costs: CostTable, gains: BudgetGains | None = None, table: str | None = None, anchor: int | None = None
) -> DerivedBudget | None:
    """The default budget of ``method`` on ``costs``'s device, or None without measured gains;
    ``anchor``: the method's fixed default, kept unless another budget predicts more than
    :data:`TIE` above it.

    >>> g = BudgetGains("x", (1, 2, 4, 8, 16), (1.5, 1.8, 2.1, 2.3, 2.5), (1, 2, 4, 8, 16))
    >>> cpu = CostTable("m", "cpu", {1: {1: 0.30, 3: 0.33, 5: 0.40, 9: 0.55, 17: 0.85}})
    >>> derive_budget("x", cpu, g).budget
    2
    >>> derive_budget("x", CostTable("m", "cuda", {1: {1: 0.020, 17: 0.021}}), g).budget  # rows nearly free
    16
    >>> slow_draft = BudgetGains("x", g.budgets, g.tokens_per_step, g.nodes_per_step, draft_steps=(2.0,) * 5)
    >>> derive_budget("x", cpu, slow_draft).budget  # rows are cheap beside two steps of drafting
    4
    """
    gains = gains if gains is not None else budget_gains(method)
    if gains is None:
        return None
    rates = predicted_tokens_per_s(costs, gains)
    i = choose(gains.budgets, rates, anchor=anchor)
    plain = 1.0 / costs.cost(1, 1)
    return DerivedBudget(method, gains.budgets[i], gains.tokens_per_step[i], rates[i] / plain, table or costs.model)
