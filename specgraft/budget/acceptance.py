"""What drafting gains: acceptance by node rank, counted online with a prior; each method's
measured gains per budget (``specgraft/data/budget_gains.json``, written by
``benchmarks/measure_budget_gains.py``); and what a batch's steps realize.

:class:`Acceptance` and :class:`Realized` are the batch policy's estimators
(:mod:`specgraft.budget.adaptive`);
:class:`BudgetGains` is what default budgets are derived from (:mod:`specgraft.budget.defaults`)
and what seeds the policy's prior (:meth:`Acceptance.from_gains`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

#: Ranks whose acceptance is tracked (budgets beyond this reuse the last rank's rate).
MAX_RANK = 128

#: Sequence steps a prior built from a method's measured gains is worth (:class:`Acceptance`,
#: ``prior_weight``); the generic prior is worth 2. Why 32: :class:`AdaptiveBudget`.
GAINS_PRIOR_WEIGHT = 32.0
GAINS_PATH = Path(__file__).resolve().parent.parent / "data" / "budget_gains.json"



@dataclass(frozen=True)
class BudgetGains:
    """A method's measured tokens per step ``E(k)`` and nodes per step ``N(k)`` at budgets ``k``.

    >>> g = BudgetGains("pld", budgets=(1, 4), tokens_per_step=(1.2, 1.3), nodes_per_step=(0.5, 0.9))
    >>> g.budgets[g.tokens_per_step.index(max(g.tokens_per_step))]
    4
    """

    method: str
    budgets: tuple[int, ...]
    tokens_per_step: tuple[float, ...]
    nodes_per_step: tuple[float, ...]
    draft_steps: tuple[float, ...] | None = None
    """Drafting time per step, in plain target decode steps (None: not measured, taken as 0)."""

    def __post_init__(self) -> None:
        n = len(self.budgets)
        lengths = {len(self.tokens_per_step), len(self.nodes_per_step)} | ({len(self.draft_steps)} if self.draft_steps is not None else set())
        if not n or lengths != {n}:
            raise ValueError(f"gains of {self.method}: budgets, tokens, nodes and drafting per step must be equal, non-empty lists")


@lru_cache(maxsize=4)
def _load(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not a budget-gains file ({e})") from e


def gains_meta(path: str | Path = GAINS_PATH) -> dict:
    """What the shipped gains were measured with (models, draft numerics, preset, prompts)."""
    return dict(_load(str(path)).get("meta", {}))


def budget_gains(method: str, source: str | None = None, path: str | Path = GAINS_PATH) -> BudgetGains | None:
    """``method``'s measured gains, or None when none were measured. ``source``: the method whose
    measured row stands for ``method``'s (an ablation reads its family's:
    ``MethodSpec.gains_from``); None: ``method``'s own.

    >>> budget_gains("ar") is None, budget_gains("pld").budgets[0]
    (True, 1)
    >>> budget_gains("graft-root", source="graft").method, budget_gains("graft-root") is None
    ('graft-root', True)
    """
    row = _load(str(path)).get("methods", {}).get(source or method)
    if row is None:
        return None
    steps = row["steps"]
    plain = _load(str(path)).get("meta", {}).get("plain_step_s")
    draft = tuple(d / s / plain for d, s in zip(row["draft_s"], steps)) if plain and "draft_s" in row else None
    return BudgetGains(
        method, tuple(row["budgets"]), tuple(t / s for t, s in zip(row["tokens"], steps)), tuple(n / s for n, s in zip(row["nodes"], steps)), draft
    )


def per_rank(budgets: Sequence[int], totals: Sequence[float], base: float = 0.0) -> list[float]:
    """Per-rank rates whose running sum reproduces ``totals`` measured at ``budgets``:
    ``base + sum_{r < k} rates[r] == totals[i]`` at each ``k = budgets[i]``. The gain between
    consecutive measured budgets ``k_i < k_{i+1}`` is spread evenly over ranks
    ``k_i .. k_{i+1} - 1`` (ranks ``0 .. k_0 - 1`` share ``totals[0] - base``); one more rank
    of 0 follows the largest budget (nothing measured says ranks beyond it pay, and
    :meth:`Acceptance.rate` reuses the last entry for every rank past the list).

    Each rate is clipped to ``[0, 1]`` (a rank is accepted, or filled, at most once a step; a
    total that drops between budgets is measurement noise, not a negative rate). The rates are
    *not* made non-increasing: a budget-``k`` tree is not the first ``k`` nodes of a larger one,
    and the measured totals need not be concave. ``ptd`` emits 1.0 token a step at budgets 1
    and 2 (at 1 it drafts nothing, at 2 nothing it drafts is accepted) and 1.15 at 4; pooling
    its rates into a non-increasing shape would keep ``E(4)`` but predict gains at budgets 1
    and 2 that were measured to be absent, and :class:`AdaptiveBudget` compares budgets by ``E(k)`` itself.

    >>> per_rank([1, 2, 4], [1.75, 2.25, 3.25], base=1.0)  # E(k): 0.75 at rank 0, 0.5 at 1, 1.0 over 2..3
    [0.75, 0.5, 0.5, 0.5, 0.0]
    >>> per_rank([2, 4], [0.0, 3.0])  # nothing filled at budget 2, 3 more nodes over ranks 2..3: at most 1 each
    [0.0, 0.0, 1.0, 1.0, 0.0]
    """
    if not budgets or len(budgets) != len(totals) or list(budgets) != sorted(set(budgets)) or budgets[0] < 1:
        raise ValueError(f"per-rank rates need increasing budgets >= 1 with one total each, got {list(budgets)} and {list(totals)}")
    rates: list[float] = []
    lo, before = 0, base
    for k, total in zip(budgets, totals, strict=True):
        rates += [min(1.0, max(0.0, (total - before) / (k - lo)))] * (k - lo)
        lo, before = k, total
    return rates + [0.0]


@dataclass
class Acceptance:
    """Running counts of acceptance by node rank (tree order), with a prior.

    A step with budget ``k`` is an opportunity at ranks ``0 .. k - 1``, whether or not its
    drafters filled them (a prompt-lookup method that finds no match drafts nothing), so
    ``rate(r)`` is the probability that a node of rank ``r`` exists *and* is accepted:
    ``(accepted at r + prior_weight * prior[r]) / (opportunities at r + prior_weight)``; the
    share of opportunities the drafters filled, ``fill_rate(r)``, likewise from ``nodes_prior``.

    The default prior is generic (``0.5 * 0.8**r``, every rank filled, worth 2 steps);
    :meth:`from_gains` builds a method's own from its measured gains.

    >>> a = Acceptance(prior=[0.5, 0.25], prior_weight=0)
    >>> a.add(budget=2, accepted=[0]); a.add(budget=2, accepted=[0, 1])
    >>> a.rate(0), a.rate(1), a.expected_tokens(2)
    (1.0, 0.5, 2.5)
    """

    prior: list[float] = field(default_factory=lambda: [0.5 * 0.8**r for r in range(16)])
    """Acceptance rate per rank before any step (the last entry stands for every later rank)."""
    prior_weight: float = 2.0
    """Sequence steps the priors are worth."""
    nodes_prior: list[float] = field(default_factory=lambda: [1.0])
    """Share of steps whose drafters fill each rank, before any step (default: every rank)."""
    verified: list[int] = field(default_factory=lambda: [0] * MAX_RANK)
    accepted: list[int] = field(default_factory=lambda: [0] * MAX_RANK)
    filled: list[int] = field(default_factory=lambda: [0] * MAX_RANK)
    """Opportunities at each rank that the drafters filled with a node."""

    @classmethod
    def from_gains(cls, gains: BudgetGains, weight: float = GAINS_PRIOR_WEIGHT) -> "Acceptance":
        """A prior that reproduces ``gains``' measured tokens per step ``E(k)`` and nodes per
        step ``N(k)`` at its measured budgets (:func:`per_rank`), worth ``weight`` steps.

        >>> a = Acceptance.from_gains(BudgetGains("x", (1, 2, 4), (1.75, 2.25, 3.25), (1.0, 1.5, 2.5)))
        >>> a.expected_tokens(2), a.expected_tokens(4), a.expected_nodes(4), a.expected_tokens(8)
        (2.25, 3.25, 2.5, 3.25)
        """
        return cls(
            prior=per_rank(gains.budgets, gains.tokens_per_step, base=1.0), prior_weight=weight,
            nodes_prior=per_rank(gains.budgets, gains.nodes_per_step),
        )

    def add(self, budget: int, accepted: Sequence[int], tree_nodes: int | None = None) -> None:
        """One step with ``budget`` (``tree_nodes`` of them filled; default all)."""
        filled = budget if tree_nodes is None else tree_nodes
        for r in range(min(budget, MAX_RANK)):
            self.verified[r] += 1
            self.filled[r] += r < filled
        for r in accepted:
            if r < MAX_RANK:
                self.accepted[r] += 1

    def _blend(self, counts: list[int], prior: list[float], r: int) -> float:
        """``(counts[r] + prior_weight * prior[r]) / (verified[r] + prior_weight)``."""
        r = min(r, MAX_RANK - 1)
        p = prior[min(r, len(prior) - 1)] if prior else 0.0
        n = self.verified[r] + self.prior_weight
        return (counts[r] + self.prior_weight * p) / n if n > 0 else p

    def fill_rate(self, r: int) -> float:
        return self._blend(self.filled, self.nodes_prior, r)

    def rate(self, r: int) -> float:
        return self._blend(self.accepted, self.prior, r)

    def expected_nodes(self, k: int) -> float:
        """Nodes a step with budget ``k`` proposes on average."""
        return sum(self.fill_rate(r) for r in range(k))

    def expected_tokens(self, k: int) -> float:
        """``E(k) = 1 + sum_{r < k} rate(r)``: tokens per step with ``k`` nodes (bonus included)."""
        return 1.0 + sum(self.rate(r) for r in range(k))


#: Weight of a new step in the realized tokens and seconds (:class:`Realized`): the last ~5
#: steps of each kind count most.
REALIZED_EMA = 0.2

def ema(old: float | None, new: float, weight: float) -> float:
    """A running average: ``new`` alone at first, then ``weight`` of each new value.

    >>> ema(None, 2.0, 0.25), ema(2.0, 4.0, 0.25)
    (2.0, 2.5)
    """
    return new if old is None else (1 - weight) * old + weight * new


@dataclass
class Realized:
    """What the steps at one batch size produced, drafting steps and plain steps apart: running
    (exponentially weighted) tokens emitted and seconds taken per step, whose ratio is the
    realized tokens/s of each kind.

    The policy's prediction is a model (cost table x acceptance x drafting time), and it can be
    wrong by more than the few percent a batch gains from drafting: on the Zen 3 of
    ``benchmarks/RESULTS.md`` (issue 12) draft-tree at ``B = 2`` predicted 6.3-7.7 tokens/s for
    budget 8 where its drafting steps produced 4.9 and its plain steps 5.9 (short requests, a
    draft model's early stops and prompts that accept less than the gains it was measured on).
    :class:`AdaptiveBudget` lets these records overrule it (:meth:`AdaptiveBudget.observe_step`).

    The guard's drafting record starts afresh after a veto (:meth:`forget_drafting`); a second,
    *lasting* record of the same steps does not, and says what drafting has produced here
    lately whatever the guard decided (:meth:`AdaptiveBudget.prefill_pays` weighs with it).

    >>> r = Realized()
    >>> for _ in range(6): r.add(True, 3, 1.0)
    >>> r.add(False, 2, 0.33)
    >>> round(r.rate(True), 2), round(r.rate(False), 2), r.steps[True]
    (3.0, 6.06, 6)
    >>> r.forget_drafting(); r.rate(True), round(r.rate(True, lasting=True), 2), r.lasting_steps
    (None, 3.0, 6)
    """

    tokens: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    seconds: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    steps: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    # the drafting steps again, never forgotten: [tokens, seconds] (EMA) and their count
    lasting: list[float] = field(default_factory=lambda: [0.0, 0.0])
    lasting_steps: int = 0

    def add(self, drafted: bool, tokens: int, seconds: float) -> None:
        w = REALIZED_EMA if self.steps[drafted] else 1.0
        self.tokens[drafted] = ema(self.tokens[drafted], tokens, w)
        self.seconds[drafted] = ema(self.seconds[drafted], seconds, w)
        self.steps[drafted] += 1
        if drafted:
            w = REALIZED_EMA if self.lasting_steps else 1.0
            self.lasting = [ema(self.lasting[0], tokens, w), ema(self.lasting[1], seconds, w)]
            self.lasting_steps += 1

    def forget_drafting(self) -> None:
        """Drop the guard's drafting record (the plain one and the lasting one stay): drafting
        starts a fresh one."""
        self.tokens[True], self.seconds[True], self.steps[True] = 0.0, 0.0, 0

    def rate(self, drafted: bool, lasting: bool = False) -> float | None:
        """Realized tokens/s of drafting (True) or plain (False) steps; None before any.
        ``lasting``: drafting's lasting record (plain steps have only one)."""
        if lasting and drafted:
            tokens, seconds, steps = self.lasting[0], self.lasting[1], self.lasting_steps
        else:
            tokens, seconds, steps = self.tokens[drafted], self.seconds[drafted], self.steps[drafted]
        if not steps or seconds <= 0:
            return None
        return tokens / seconds
