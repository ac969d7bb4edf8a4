"""How many nodes each sequence of a batch verifies: from measured forward costs and measured
acceptance, including 0 (plain decoding) when speculation would not pay (READER Appendix F).

A batch of ``B`` sequences verifying ``k`` nodes each is one target forward over ``B x (k + 1)``
rows. With ``a_r`` the probability that the node of rank ``r`` (tree order; the composers emit
nodes best-first) is accepted, a step emits ``E(k) = 1 + sum_{r < k} a_r`` tokens per sequence
in expectation, so the predicted throughput is::

    thr(B, k) = B * E(k) / (T(B, k + 1) + D(B, k))

with ``T(B, n)`` the target forward of ``B x n`` rows (the :class:`CostTable`, measured by
``specgraft profile``, corrected by the forwards the policy sees run:
:meth:`AdaptiveBudget.target_cost`) and ``D`` the drafting time per step (measured online from
the steps run; 0 at ``k = 0``, where no drafter runs). :class:`AdaptiveBudget` picks the ``k`` in
``{0} + budgets`` that maximises it, per batch size, and recomputes when ``B`` changes or every
``refresh`` steps. ``k = 0`` is plain batched decoding, so speculation never makes a batch
slower than the cost table predicts plain decoding to be; and it must predict more than
:data:`SPECULATE_MARGIN` (2%) above plain decoding, since the prediction itself is good to a few
percent only (a near-tie is no reason to pay for a draft).

The acceptance ``a_r`` is counted online per rank, from a prior worth a number of sequence
steps; ``D`` is measured online per batch size, from a prior until the first step. A method
with measured gains (``specgraft/data/budget_gains.json``, :mod:`specgraft.methods.device_budget`)
starts from its own, worth 32 steps (:class:`AdaptiveBudget` says why): rank rates whose sum
reproduces its measured ``E(k)`` at each measured budget, the nodes it fills from its ``N(k)``,
and ``D = D(k) x T(1, 1)`` from its measured drafting time. Before any step, its prediction at
``B = 1`` and a measured budget is therefore the one that derives its default budget
(:func:`~specgraft.methods.device_budget.predicted_tokens_per_s`), and a short unlucky warm-up
cannot switch off a method that pays on average. Other methods start from a generic prior
(``a_r = 0.5 * 0.8**r``, worth 2 steps; drafting free until measured).

Worked example (1.5B fp32 on this CPU): ``T(1, 1) = 0.30 s``, ``T(1, 9) = 0.50 s``; with
``a = [0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.2, 0.1]`` (``E(8) = 4.1``) one sequence gets
``thr(1, 8) = 8.2`` tokens/s against ``thr(1, 0) = 3.3``. At ``B = 8``, ``T(8, 1) = 0.68 s`` and
``T(8, 9) = 2.4 s``: ``thr(8, 8) = 13.7`` against ``thr(8, 0) = 11.8``, so speculation still
pays, but a method with ``a = [0.4, 0.2, 0.1]`` falls back to plain decoding there.

**What the policy measures itself.** Every batched step reports its target forward's shape and
time, and the policy scales the table by the measured ratio per batch size and row count, so a
table measured at another context length, or on a machine whose speed has drifted since, stops
deciding once the real steps are in. A batch that speculates decodes one step plainly at its
first step at a batch size (and once every ``explore`` speculating steps) to measure what it is
comparing against. A sequence whose drafters must first prefill what they have not cached (a
draft model prefilling the prompt at its first proposal) drafts only if its remaining tokens
can pay that prefill back (:meth:`AdaptiveBudget.pays_back`, from the measured seconds per
catch-up token); otherwise it decodes plainly inside the drafting batch. Likewise a request
pays its drafters' optional prefill work (Token Recycling's prompt top-k) only if its tokens
can repay it (:meth:`AdaptiveBudget.prefill_pays`, from the measured seconds per prompt token);
otherwise it starts without it and decodes plainly to its end. And what the steps
produced has the last word: drafting whose realized tokens/s at a batch size falls short of
plain steps' there stops for ``explore`` steps, whatever the prediction says
(:meth:`AdaptiveBudget.observe_step`).

The budget depends only on past steps (costs, acceptance counts) and on how many tokens a
sequence has left, never on the values of the drafts it caps, so it keeps every verifier exact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from specgraft.methods.device_budget import BudgetGains

#: Ranks whose acceptance is tracked (budgets beyond this reuse the last rank's rate).
MAX_RANK = 128

#: Sequence steps a prior built from a method's measured gains is worth (:class:`Acceptance`,
#: ``prior_weight``); the generic prior is worth 2. Why 32: :class:`AdaptiveBudget`.
GAINS_PRIOR_WEIGHT = 32.0
#: Speculation must predict this much more throughput than plain decoding (k = 0) to be chosen.
#: Why: the prediction is good to a few percent only, so a near-tie is no reason to pay for a
#: draft; the derived default budgets use the same 2% (``TIE``). It is a guard, not a fix for a
#: wrong table: the Zen 4 bench-serve run that lost at B = 4 predicted +35% for drafting there
#: (benchmarks/RESULTS.md, issue 12).
SPECULATE_MARGIN = 0.02
#: Weight of a new measurement in the running averages of what the policy measures itself
#: (target forward cost per shape relative to the table, catch-up prefill seconds per token).
COST_EMA = 0.25
#: Expected accepted nodes a sequence's own record is shrunk by towards the pooled estimate
#: (:meth:`AdaptiveBudget.multiplier`): about four draft-tree steps' worth.
SEQUENCE_PRIOR = 8.0
#: Drafting steps at a batch size whose realized throughput is weighed before the policy may
#: stop drafting there because of it; after ``n`` such steps it stops drafting when they
#: produced ``1 + 1 / n`` times fewer tokens a second than plain steps: a large loss stops
#: after 2 steps (2x slower), a 10% one after ~10 (:meth:`AdaptiveBudget.observe_step`).
GUARD_STEPS = 2
#: Weight of a new step in the realized tokens and seconds (:class:`Realized`): the last ~5
#: steps of each kind count most.
REALIZED_EMA = 0.2


@dataclass(frozen=True)
class StepPlan:
    """What one batched step verifies: a cap on every sequence's budget, and optionally one
    sequence that drafts while the rest decode plainly (a *probe*: warm-up or exploration).

    >>> StepPlan(cap=0, probe=8, split=True).probe
    8
    """

    cap: int | None
    """Every sequence's budget cap (0: plain decoding; None: each sequence's own budget)."""
    probe: int = 0
    """> 0 (with ``cap == 0``): one sequence drafts with this budget this step."""
    split: bool = False
    """Run the probing sequence in a forward of its own (cheaper than padding the whole batch to
    its tree when the cost table says so: ``BudgetPolicy.split_pays``)."""


class BudgetPolicy(Protocol):
    def plan(self, batch_size: int, budgets: Sequence[int], keys: Sequence[str] | None = None) -> StepPlan:
        """This step's plan for a batch whose sequences have ``budgets`` of their own (``keys``:
        the sequences' request ids, for a policy that tracks sequences apart)."""

    def speculating(self, batch_size: int, budget: int) -> bool:
        """Whether a sequence (own ``budget``) joining a batch of ``batch_size`` is expected to
        draft; if not it starts without its drafters' optional prefill work
        (``SpecEngine.start(speculative=False)``)."""

    def observe(self, batch_size: int, budget: int, tree_nodes: int, accepted: Sequence[int], draft_s: float, key: str | None = None) -> None:
        """One sequence's step: the budget its drafters had, the nodes they proposed, tree
        indices of the accepted nodes, the drafting time (``key``: the sequence's request id)."""

    def release(self, key: str) -> None:
        """The sequence ``key`` has left the batch."""

    def observe_forward(self, batch_size: int, rows: int, seconds: float) -> None:
        """One target forward of ``batch_size`` sequences x ``rows`` rows took ``seconds``."""

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        """A drafter prefilled ``tokens`` it had not cached (a draft model's catch-up) in ``seconds``."""

    def observe_step(self, batch_size: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A whole batched step: the batch emitted ``tokens`` in ``seconds`` of drafting, target
        forwards and verification (admissions and catch-ups left out); ``drafted`` when any of
        its sequences drafted."""

    def observe_optional_prefill(self, tokens: int, seconds: float) -> None:
        """A sequence started speculatively paid ``seconds`` for its drafters' optional prefill
        work over its ``tokens`` prompt tokens (Token Recycling's prompt top-k)."""

    def prefill_pays(self, batch_size: int, budget: int, tokens: int, remaining: int) -> bool:
        """Whether a sequence joining a batch of ``batch_size`` that is expected to draft
        (:meth:`speculating`) should pay its drafters' optional prefill work over ``tokens``
        prompt tokens, with ``remaining`` tokens to generate; if not it starts plainly."""

    def pays_back(self, batch_size: int, budget: int, tokens: int, remaining: int) -> bool:
        """Whether a sequence with ``remaining`` tokens to generate should draft at ``budget``
        although its drafters must first prefill ``tokens`` they have not cached."""

    def split_pays(self, batch_size: int, drafting: int, budget: int) -> bool:
        """Whether a step in which only ``drafting`` of ``batch_size`` sequences draft (at
        ``budget``) is cheaper as two forwards, those sequences apart from the plain ones,
        than as one forward padding every sequence to their trees."""


class FixedBudget:
    """Every sequence verifies its own budget (no cost model): single-sequence behaviour."""

    def plan(self, batch_size: int, budgets: Sequence[int], keys: Sequence[str] | None = None) -> StepPlan:
        return StepPlan(cap=None)

    def speculating(self, batch_size: int, budget: int) -> bool:
        return True

    def observe(self, batch_size: int, budget: int, tree_nodes: int, accepted: Sequence[int], draft_s: float, key: str | None = None) -> None:
        pass

    def release(self, key: str) -> None:
        pass

    def observe_forward(self, batch_size: int, rows: int, seconds: float) -> None:
        pass

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        pass

    def observe_step(self, batch_size: int, drafted: bool, tokens: int, seconds: float) -> None:
        pass

    def observe_optional_prefill(self, tokens: int, seconds: float) -> None:
        pass

    def prefill_pays(self, batch_size: int, budget: int, tokens: int, remaining: int) -> bool:
        return True

    def pays_back(self, batch_size: int, budget: int, tokens: int, remaining: int) -> bool:
        return True

    def split_pays(self, batch_size: int, drafting: int, budget: int) -> bool:
        return False


@dataclass
class CostTable:
    """Measured seconds of one target forward over ``batch x rows`` new rows (after ``context``
    cached tokens), on one device; interpolated linearly in rows, and in batch size between
    measured sizes (extrapolated from the last two beyond them).

    >>> t = CostTable("m", "cpu", {1: {1: 0.3, 9: 0.5}, 2: {1: 0.35, 9: 0.8}})
    >>> round(t.cost(1, 5), 3), round(t.cost(2, 1), 3), round(t.cost(4, 1), 3)
    (0.4, 0.35, 0.45)
    """

    model: str
    device: str
    # batch size -> rows per sequence -> seconds
    seconds: dict[int, dict[int, float]]
    context: int = 512
    threads: int | None = None
    dtype: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seconds = {int(b): {int(n): float(s) for n, s in row.items()} for b, row in self.seconds.items()}
        if not self.seconds or any(not row for row in self.seconds.values()):
            raise ValueError("a cost table needs at least one measured forward per batch size")

    def _rows_cost(self, batch: int, rows: float) -> float:
        return _interp(self.seconds[batch], rows)

    def cost(self, batch: int, rows: float) -> float:
        """Seconds of one forward of ``batch`` sequences x ``rows`` rows each."""
        sizes = sorted(self.seconds)
        if batch in self.seconds:
            return self._rows_cost(batch, rows)
        return _interp({b: self._rows_cost(b, rows) for b in sizes}, batch)

    def row_cost(self, batch: int = 1, max_rows: int = 16) -> float:
        """Cost of one more verified row per sequence, as a fraction of a one-row forward of
        ``batch`` sequences: the slope of a least-squares line through the measured forwards of
        up to ``max_rows`` rows, over the line's value at one row (what
        :func:`specgraft.tree.paths.cost_aware_subset` reads). A line, not the measured points
        themselves: single measurements wobble by a few percent (the shipped 1.5B CPU table has
        4 rows at 541 ms and 8 at 563 ms), and a per-node decision should not follow the wobble.

        >>> CostTable("m", "cpu", {1: {1: 0.3, 5: 0.4, 9: 0.5}}).row_cost()  # 0.025 s a row / 0.3 s
        0.083333
        """
        rows = sorted({n for row in self.seconds.values() for n in row if n <= max_rows})
        if len(rows) < 2:
            raise ValueError(f"a row cost needs forwards of two or more row counts up to {max_rows}")
        xs = np.array(rows, dtype=np.float64)
        ys = np.array([self.cost(batch, n) for n in rows], dtype=np.float64)
        slope, intercept = np.polyfit(xs, ys, 1)
        return round(max(0.0, float(slope)) / float(intercept + slope), 6)

    def to_json(self) -> dict:
        return {
            "model": self.model, "device": self.device, "context": self.context, "threads": self.threads, "dtype": self.dtype,
            "seconds": {str(b): {str(n): s for n, s in sorted(row.items())} for b, row in sorted(self.seconds.items())},
            "meta": self.meta,
        }

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CostTable":
        try:
            data = json.loads(Path(path).read_text())
            return cls(
                model=data["model"], device=data["device"], seconds=data["seconds"], context=data.get("context", 512),
                threads=data.get("threads"), dtype=data.get("dtype", ""), meta=data.get("meta", {}),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path} is not a specgraft cost table ({e})") from e


def _ema(old: float | None, new: float, weight: float) -> float:
    """A running average: ``new`` alone at first, then ``weight`` of each new value.

    >>> _ema(None, 2.0, 0.25), _ema(2.0, 4.0, 0.25)
    (2.0, 2.5)
    """
    return new if old is None else (1 - weight) * old + weight * new


def _interp(points: dict[int, float], x: float) -> float:
    """Piecewise-linear through ``points``, extended linearly past the last two (and flat below the first)."""
    xs = sorted(points)
    if len(xs) == 1 or x <= xs[0]:
        return points[xs[0]]
    for lo, hi in zip(xs, xs[1:]):
        if x <= hi:
            return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)
    lo, hi = xs[-2], xs[-1]
    return points[hi] + (points[hi] - points[lo]) * (x - hi) / (hi - lo)


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

        >>> from specgraft.methods.device_budget import BudgetGains
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
        self.tokens[drafted] = _ema(self.tokens[drafted], tokens, w)
        self.seconds[drafted] = _ema(self.seconds[drafted], seconds, w)
        self.steps[drafted] += 1
        if drafted:
            w = REALIZED_EMA if self.lasting_steps else 1.0
            self.lasting = [_ema(self.lasting[0], tokens, w), _ema(self.lasting[1], seconds, w)]
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


class AdaptiveBudget:
    """Budget per batch size maximising predicted throughput (module docstring).

    ``budgets`` are the candidate budgets (0 is always a candidate; none above a sequence's
    own budget is used). ``gains`` (or :meth:`for_method`) seeds the policy with a method's
    measured gains; without them it starts from the generic prior and no drafting time.

    **Priors.** With gains, the acceptance prior is :meth:`Acceptance.from_gains` (it
    reproduces the measured ``E(k)`` and ``N(k)``), worth :data:`GAINS_PRIOR_WEIGHT` = 32
    sequence steps, and the drafting time before any is measured is ``D(k) x T(1, 1)`` (the
    gains' drafting time in plain target steps, read against this table's one-row forward;
    linear between measured budgets). At ``B > 1`` the same figure stands: a draft model
    drafts for the whole batch in one forward per depth, so its per-step time grows with
    ``B`` far less than the target's, and the estimate lasts only until the first step is
    measured. Drafting time is then learned online per batch size (an exponential average)
    and **replaces** the prior at once, with no blending: it is measured directly on this
    machine (catch-up prefill excluded) and varies little from step to step, while the prior
    is another machine's ratio; acceptance, which varies by prompt, is what needs a
    weighted prior.

    Why 32. Draft-tree on the shipped 2-core Zen 3 table (1.5B, ``T(1, 1) = 0.382 s``): its
    gains give rank rates ``0.84, 0.76, 0.52, 0.52, 0.13 x 4, 0 ...`` (``E(8) = 4.14``,
    ``N(8) = 7.8``) and ``D = 0.64`` plain steps, 0.246 s, so budget 8 predicts
    ``4.14 / (T(1, 8.8) + 0.246) = 4.14 / 0.833 = 4.97`` tokens/s against plain decoding's
    2.62: break-even is ``E(8) = 2.18``, 38% of the prior's 3.14 accepted nodes. A warm-up of
    16 steps that accepts nothing leaves ``w / (w + 16)`` of the prior: 11% at the generic
    weight of 2 (``E(8) = 1.35``: switched off, as measured on one low-acceptance writing
    prompt although draft-tree pays 1.19x over the prompt set), 67% at 32 (``E(8) = 3.09``,
    3.68 tokens/s: stays at 8). At 32 the 16-step warm-up moves each rate at most a third of
    the way to its sample, so on this table no warm-up alone switches draft-tree off; 53
    steps accepting nothing do (``32 / (32 + n) < 0.38``), and after 300 steps the prior is
    10% of each drafted rank's weight, so sustained poor acceptance decides within a few hundred
    sequence steps (at ``B = 8``, a few dozen batched steps). The price is symmetric: a
    method whose gains put it at 0 (``ptd`` at ``B = 1`` here) needs that many probe steps of
    good acceptance to come back.

    **Probes.** When the choice is 0 nothing is drafted, so nothing would be learned; instead
    one sequence of the batch *probes* (drafts at a positive budget) while the others decode
    plainly, in a forward of its own when the cost table says that is cheaper than padding
    the batch to its tree. It probes at every step of the **warm-up** (until ``warmup``
    sequence steps with a budget were observed: a prior is another run's measurement, or
    generic), then once every ``explore`` steps spent at 0. A probe at batch size 8 on the
    1.5B costs ~1.1 s against a 0.6 s step, so the default ``explore`` of 256 keeps
    exploration near 1% of a batch that stays at 0. Warm-up at batch size 1 is the method's
    own budget: the sequence probes alone.

    Worked example: a fresh ``pld`` policy at ``B = 8`` with the 1.5B table predicts 0 from
    its gains (``E(16) = 1.45`` tokens for a batch padded to 17 rows); sequence 0 probes for
    16 steps (its own budget, own forward), the other 7 decode plainly and start without
    optional prefill work (``speculating`` is False); then every 256th step one sequence
    probes again. A fresh ``draft-tree`` policy predicts budget 8 at ``B = 1`` and 4 at
    ``B = 8`` (15.0 tokens/s against 13.3).
    """

    def __init__(
        self,
        costs: CostTable,
        acceptance: Acceptance | None = None,
        budgets: Sequence[int] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 60),
        refresh: int = 1,
        explore: int = 256,
        warmup: int = 16,
        gains: BudgetGains | None = None,
    ):
        self.costs = costs
        if acceptance is None:
            acceptance = Acceptance.from_gains(gains) if gains is not None else Acceptance()
        self.acceptance = acceptance
        self.budgets = sorted({int(b) for b in budgets if b > 0})
        self.refresh, self.explore, self.warmup = refresh, explore, warmup
        # where the starting acceptance and drafting time come from (``serve`` prints it)
        self.prior = f"measured gains of {gains.method}" if gains is not None else "generic"
        # budget -> drafting seconds per step before any is measured: D(k) plain steps x T(1, 1)
        self.draft_prior: dict[int, float] = {}
        if gains is not None and gains.draft_steps is not None:
            step = costs.cost(1, 1)
            self.draft_prior = {k: d * step for k, d in zip(gains.budgets, gains.draft_steps, strict=True)}
        self.observed = 0
        self.draft_s: dict[int, float] = {}
        # batch size -> rows per sequence -> measured / table cost of the target forward (EMA)
        self.forward_ratio: dict[int, dict[int, float]] = {}
        # seconds per token of a drafter's catch-up prefill (EMA; None until one is measured),
        # and whether this step already let an unmeasured one through (reset by ``plan``)
        self.catch_up_per_token: float | None = None
        self._blind_catch_up = False
        # seconds per prompt token of the drafters' optional prefill work (EMA; None until one
        # speculative start is measured: ``prefill_pays``)
        self.optional_per_token: float | None = None
        self._speculating: dict[int, int] = {}
        # request id -> [accepted nodes, accepted nodes the pooled estimate expected] over its drafting steps
        self._sequences: dict[str, list[float]] = {}
        self._choice: dict[int, int] = {}
        self._since: dict[int, int] = {}
        self._idle: dict[int, int] = {}
        # batch size -> what its steps produced; batch size -> plain steps left of a veto; the
        # request in flight at batch size 1 (last plan), and the one a veto there was measured on
        self.realized: dict[int, Realized] = {}
        self.vetoed: dict[int, int] = {}
        self._alone: str | None = None
        self._vetoed_alone: str | None = None

    @classmethod
    def for_method(cls, costs: CostTable, method: str, **kwargs) -> "AdaptiveBudget":
        """A policy whose priors are ``method``'s measured gains
        (:func:`~specgraft.methods.device_budget.budget_gains`, ablations reading their base
        method's); the generic prior for a method without gains (``ar``, ``reader``, unknown
        names). The gains were measured with one target/draft pair
        (:func:`~specgraft.methods.device_budget.gains_meta`: the 1.5B/0.5B catalog pair);
        with another model, or another preset, depth or top-k, they are still the starting
        point, as a prior: the online counts correct them (class docstring).

        >>> t = CostTable("m", "cpu", {1: {1: 0.3, 9: 0.5}})
        >>> AdaptiveBudget.for_method(t, "graft-fixed").prior, AdaptiveBudget.for_method(t, "ar").prior
        ('measured gains of graft-fixed', 'generic')
        """
        # imported here: device_budget reads CostTable from this module
        from specgraft.methods.device_budget import budget_gains

        return cls(costs, gains=budget_gains(method), **kwargs)

    def predicted(self, batch_size: int, k: int, keys: Sequence[str] | None = None) -> float:
        """Predicted tokens/s of the whole batch at budget ``k``.

        Rows per sequence: one sequence feeds its tree as drafted (``1 + expected_nodes(k)``;
        prompt lookup often drafts fewer nodes than its budget); a batch is padded to its
        largest tree, taken as the full ``1 + k``. With ``keys`` (the sequences in flight),
        each sequence's accepted nodes are the pooled estimate's times its own
        :meth:`multiplier`."""
        accepted = self.acceptance.expected_tokens(k) - 1
        if keys:
            tokens = sum(1 + accepted * self.multiplier(key) for key in keys) * batch_size / len(keys)
        else:
            tokens = batch_size * (1 + accepted)
        return tokens / self._step_cost(batch_size, k)

    def multiplier(self, key: str) -> float:
        """How much of the pooled estimate's accepted nodes this sequence gets: its accepted nodes
        over what the pooled estimate expected at the budgets it drafted with, shrunk towards 1
        by :data:`SEQUENCE_PRIOR` expected nodes (1 for a sequence that has not drafted).

        Acceptance depends on the text far more than on anything else: on the Zen 3 trace of
        ``benchmarks/RESULTS.md`` (issue 12) draft-tree's writing prompts accepted 0.81 nodes a
        step where the pooled estimate, fed by every prompt so far, expected 2.2, and the batch
        drafted at a 40% loss. The budget still depends only on past steps.

        >>> p = AdaptiveBudget(CostTable("m", "cpu", {1: {1: 0.3, 9: 0.5}}), Acceptance(prior=[0.5] * 8, prior_weight=1e9))
        >>> for _ in range(12): p.observe(1, 4, 4, [0], 0.0, key="a")  # 1 accepted a step where 2 were expected
        >>> round(p.multiplier("a"), 3), p.multiplier("b")  # (12 + 8) / (24 + 8)
        (0.625, 1.0)
        """
        acc, expected = self._sequences.get(key, (0.0, 0.0))
        return (acc + SEQUENCE_PRIOR) / (expected + SEQUENCE_PRIOR)

    def _step_cost(self, batch_size: int, k: int) -> float:
        """Predicted seconds of one batched step at budget ``k``: target forward + drafting."""
        draft = 0.0 if k == 0 else self._draft_cost(batch_size, k)
        rows = 1 + (self.acceptance.expected_nodes(k) if batch_size == 1 else k)
        return self.target_cost(batch_size, rows) + draft

    def target_cost(self, batch_size: int, rows: float) -> float:
        """``T(B, n)``: the cost table's forward, corrected by what this policy measured.

        Every batched step reports its target forward (:meth:`observe_forward`); per batch size
        the policy keeps the ratio measured / table for each row count it ran (a running
        average), and scales the table by that ratio, interpolated linearly in rows between
        the row counts measured at this batch size and flat beyond them (1.0 at a batch size
        never run). A table is measured once, at 512 cached tokens, on a machine whose speed
        drifts; the Zen 4 run of ``benchmarks/RESULTS.md`` (issue 12) had a plain ``B = 4``
        step at 0.20 s where its table said 0.32 s, and drafted because of it.

        >>> p = AdaptiveBudget(CostTable("m", "cpu", {4: {1: 0.32, 8: 0.8}}))
        >>> p.observe_forward(4, 1, 0.20); p.observe_forward(4, 8, 0.8)
        >>> round(p.target_cost(4, 1), 3), round(p.target_cost(4, 8), 3), round(p.target_cost(2, 1), 3)
        (0.2, 0.8, 0.32)
        """
        base = self.costs.cost(batch_size, rows)
        seen = self.forward_ratio.get(batch_size)
        if not seen:
            return base
        xs = sorted(seen)
        return base * _interp(seen, min(max(rows, xs[0]), xs[-1]))

    def _draft_cost(self, batch_size: int, k: int) -> float:
        """Drafting seconds per step: measured at this batch size; else the nearest measured
        size's, as is; else, before any measurement, the gains' ``D(k) x T(1, 1)`` (linear
        between measured budgets, flat beyond them) at every batch size (class docstring)."""
        if batch_size in self.draft_s:
            return self.draft_s[batch_size]
        if self.draft_s:
            near = min(self.draft_s, key=lambda b: abs(b - batch_size))
            return self.draft_s[near]
        if self.draft_prior:
            return _interp(self.draft_prior, min(k, max(self.draft_prior)))
        return 0.0

    def best(self, batch_size: int, cap: int, keys: Sequence[str] | None = None) -> int:
        """The budget with the best prediction, but 0 unless that beats plain decoding's by more
        than :data:`SPECULATE_MARGIN`.

        >>> t = CostTable("m", "cpu", {1: {1: 0.3, 2: 0.4, 9: 0.5}})
        >>> near, clear = AdaptiveBudget(t, Acceptance(prior=[0.35, 0.0])), AdaptiveBudget(t, Acceptance(prior=[0.5, 0.0]))
        >>> round(near.predicted(1, 1) / near.predicted(1, 0), 4), near.best(1, 8), clear.best(1, 8)
        (1.0125, 0, 1)
        """
        candidates = [0] + [b for b in self.budgets if b <= cap]
        if cap not in candidates and cap > 0:
            candidates.append(cap)
        k = max(candidates, key=lambda k: (self.predicted(batch_size, k, keys), -k))
        if k > 0 and self.predicted(batch_size, k, keys) <= (1 + SPECULATE_MARGIN) * self.predicted(batch_size, 0, keys):
            return 0
        return k

    def choice(self, batch_size: int, cap: int, keys: Sequence[str] | None = None) -> int:
        """The budget every sequence of the batch gets (recomputed every ``refresh`` steps)."""
        since = self._since.get(batch_size, 0)
        if batch_size not in self._choice or since >= self.refresh:
            self._choice[batch_size] = self.best(batch_size, cap, keys)
            self._since[batch_size] = 0
        self._since[batch_size] = self._since.get(batch_size, 0) + 1
        return min(self._choice[batch_size], cap)

    def plan(self, batch_size: int, budgets: Sequence[int], keys: Sequence[str] | None = None) -> StepPlan:
        self._blind_catch_up = False
        if batch_size == 1 and keys:
            self._alone = keys[0]
        if self.vetoed.get(batch_size, 0) > 0:
            self.vetoed[batch_size] -= 1
            return StepPlan(cap=0)
        cap = max(budgets)
        choice = self.choice(batch_size, cap, keys)
        if choice > 0 and self._measure_plain(batch_size):
            return StepPlan(cap=0)
        if choice > 0 or cap <= 0:
            return StepPlan(cap=choice)
        if self.observed < self.warmup:
            probe = cap
        else:
            self._idle[batch_size] = self._idle.get(batch_size, 0) + 1
            if not self.explore or self._idle[batch_size] < self.explore:
                return StepPlan(cap=0)
            self._idle[batch_size] = 0
            positive = [b for b in self.budgets if b <= cap] or [cap]
            probe = max(positive, key=lambda k: self.predicted(batch_size, k))
        return StepPlan(cap=0, probe=probe, split=self.split_pays(batch_size, 1, probe))

    def _measure_plain(self, batch_size: int) -> bool:
        """Whether a batch that speculates should decode plainly this step to measure what a
        plain step costs: at its first speculating step at this batch size, then once every
        ``explore`` such steps (0: only the first). The mirror of the probes: a policy that
        always drafts would otherwise compare its measured drafting steps with the table's
        plain step only (:meth:`target_cost`)."""
        if 1 not in self.forward_ratio.get(batch_size, {}):
            return True
        n = self._speculating[batch_size] = self._speculating.get(batch_size, 0) + 1
        if self.explore and n >= self.explore:
            self._speculating[batch_size] = 0
            return True
        return False

    def speculating(self, batch_size: int, budget: int) -> bool:
        return budget > 0 and not self.vetoed.get(batch_size, 0) and self.best(batch_size, budget) > 0

    def observe_step(self, batch_size: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A whole step's realized work: ``tokens`` emitted by the batch in ``seconds`` (drafting,
        target forwards, verification; not admissions or catch-up prefills), ``drafted`` when any
        sequence drafted. Once drafting at this batch size has run ``n >= GUARD_STEPS`` steps
        whose tokens a second, times ``1 + 1 / n``, fall short of plain steps' there (measured;
        predicted before any was), the batch decodes plainly for the next ``explore`` steps
        (for good when ``explore`` is 0), without probes. Then the prediction chooses again,
        and drafting must build a fresh record before it can be stopped again. At batch size 1
        the veto also ends when the request it was measured on leaves (:meth:`release`): a batch
        of one is a single sequence, whose drafts' worth belongs to its own text (a writing
        prompt's failed copies say nothing of the next prompt's code), and the next request
        starts as ``generate`` would. At ``B > 1`` it does not: lifting it there once the
        sequences it was measured on had left let draft-tree at ``B = 4`` draft again at every
        turnover of its 32-token requests and lose 13% (``benchmarks/RESULTS.md``, issue 12).
        The prediction decides where the steps have not
        spoken; where they have, they win. The slack ``1 / n`` shrinks as steps come in: one
        step's tokens vary from 1 to the tree's depth, so a small sample must show a large
        loss, and a large loss costs only a few steps (at ``B = 4`` on the Zen 3 a draft-tree
        step took 2.3 s against 0.48 s plain).

        >>> p = AdaptiveBudget(CostTable("m", "cpu", {2: {1: 0.33, 9: 0.7}}), Acceptance(prior=[0.9] * 8, prior_weight=1e9), explore=4)
        >>> p.observe_forward(2, 1, 0.33); p.observe_step(2, False, 2, 0.33)   # one plain step
        >>> p.plan(2, [8, 8]).cap   # predicted: drafting wins by far
        8
        >>> p.observe_step(2, True, 4, 1.0); p.plan(2, [8, 8]).cap   # 4 tokens/s against 6.1: one step is no proof
        8
        >>> p.observe_step(2, True, 4, 1.0)   # two are: 4 x (1 + 1/2) < 6.1
        >>> [p.plan(2, [8, 8]).cap for _ in range(5)], p.speculating(2, 8)
        ([0, 0, 0, 0, 8], True)
        """
        record = self.realized.setdefault(batch_size, Realized())
        record.add(drafted, tokens, seconds)
        n = record.steps[True]
        if not drafted or n < GUARD_STEPS:
            return
        plain = record.rate(False) or self.predicted(batch_size, 0)
        drafting = record.rate(True)
        if drafting is not None and drafting * (1 + 1 / n) < plain:
            self.vetoed[batch_size] = self.explore or 2**62
            record.forget_drafting()
            if batch_size == 1:
                self._vetoed_alone = self._alone

    def observe(self, batch_size: int, budget: int, tree_nodes: int, accepted: Sequence[int], draft_s: float, key: str | None = None) -> None:
        if budget == 0:
            return
        self.observed += 1
        if key is not None:
            seq = self._sequences.setdefault(key, [0.0, 0.0])
            seq[0] += len(accepted)
            seq[1] += self.acceptance.expected_tokens(budget) - 1
        self.acceptance.add(budget, accepted, tree_nodes)
        self.draft_s[batch_size] = _ema(self.draft_s.get(batch_size), draft_s, 0.1)

    def release(self, key: str) -> None:
        """``key`` has left: its acceptance record goes, and a veto at batch size 1 measured on
        it ends (:meth:`observe_step`).

        >>> p = AdaptiveBudget(CostTable("m", "cpu", {1: {1: 0.3, 9: 0.6}}), Acceptance(prior=[0.9] * 8, prior_weight=1e9))
        >>> p.observe_forward(1, 1, 0.3); p.observe_step(1, False, 1, 0.3)   # a plain step measured
        >>> _ = p.plan(1, [8], keys=["a"]); p.observe_step(1, True, 1, 1.0); p.observe_step(1, True, 1, 1.0)
        >>> p.plan(1, [8], keys=["a"]).cap   # vetoed: 1 token/s drafting against 3.3 plain
        0
        >>> p.release("a"); p.plan(1, [8], keys=["b"]).cap   # the next request starts afresh
        8
        """
        self._sequences.pop(key, None)
        if key == self._vetoed_alone:
            self.vetoed.pop(1, None)
            self._vetoed_alone = None

    def observe_forward(self, batch_size: int, rows: int, seconds: float) -> None:
        """A target forward's measured time, as a ratio to the table's (:meth:`target_cost`).
        The ratio is clipped to [0.2, 5]: one forward slowed by something else on the machine
        should not rewrite a table."""
        ratio = min(5.0, max(0.2, seconds / self.costs.cost(batch_size, rows)))
        seen = self.forward_ratio.setdefault(batch_size, {})
        seen[rows] = _ema(seen.get(rows), ratio, COST_EMA)

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        if tokens <= 0:
            return
        self.catch_up_per_token = _ema(self.catch_up_per_token, seconds / tokens, COST_EMA)

    def pays_back(self, batch_size: int, budget: int, tokens: int, remaining: int) -> bool:
        """Whether drafting for a sequence with ``remaining`` tokens left repays the catch-up
        prefill of ``tokens`` its drafters have not cached (a draft model prefilling the prompt
        at its first proposal, or a backlog decoded while the budget was 0). The catch-up stalls
        the whole batch for ``tokens x`` the measured seconds per token; drafting at budget
        ``k`` saves the sequence's share of the batch's steps, ``remaining / B x (T(B, 1) - S /
        E(k))`` with ``S`` the predicted step at ``k`` and ``E(k)`` its tokens per step: the
        gain of the batch drafting over the batch decoding plainly, per sequence. (In a batch
        whose other sequences draft anyway, a sequence left plain still pays the padded step,
        so this undervalues its catch-up; but when every sequence of a new batch must catch up,
        as at each batch size of ``bench-serve``, only this comparison sees that the catch-ups
        together cost more than the batch's small predicted gain.) Before any catch-up is
        measured it answers yes to one sequence a step (the first asked; its catch-up is then
        measured, and the others are weighed with it): a cold batch of ``B`` new requests
        would otherwise pay all ``B`` prompts' prefills before learning what one costs (on the
        Zen 3 a cold draft-tree policy at ``B = 4`` lost 4.7 s with this rule, 10.6 s without
        it). The Zen 4 run of ``benchmarks/RESULTS.md`` (issue 12) paid 1.8 s to prefill a 671-token prompt for a
        request with a few tokens left, the batch waiting; on a Zen 3 four 32-token requests
        starting at ``B = 4`` paid 3.7 s of catch-ups for a predicted gain of 3%.

        >>> p = AdaptiveBudget(CostTable("m", "cpu", {1: {1: 0.3, 9: 0.5}, 4: {1: 0.45, 9: 1.2}}), Acceptance(prior=[0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.2, 0.1]))
        >>> _ = p.plan(4, [8] * 4); [p.pays_back(4, 8, 600, 32) for _ in range(4)]  # nothing measured: one a step
        [True, False, False, False]
        >>> p.observe_catch_up(600, 3.0)  # 5 ms a token: 3 s for 600 tokens
        >>> # B = 4: plain 0.45 s a step, drafting 1.2 s for E(8) = 4.1, i.e. 0.29 s a token; 32 tokens
        >>> # left save 32 / 4 x (0.45 - 0.29) = 1.3 s < 3 s, 128 save 5.0 s; B = 1, 32 left: 32 x (0.3 - 0.5 / 4.1) = 5.7 s
        >>> p.pays_back(1, 8, 600, 32), p.pays_back(4, 8, 600, 32), p.pays_back(4, 8, 600, 128), p.pays_back(4, 8, 10, 32)
        (True, False, True, True)
        """
        if self.catch_up_per_token is None:
            first, self._blind_catch_up = not self._blind_catch_up, True
            return first
        step = self._step_cost(batch_size, budget)
        saving = remaining / batch_size * (self.target_cost(batch_size, 1) - step / self.acceptance.expected_tokens(budget))
        return saving > tokens * self.catch_up_per_token

    def observe_optional_prefill(self, tokens: int, seconds: float) -> None:
        if tokens <= 0:
            return
        self.optional_per_token = _ema(self.optional_per_token, seconds / tokens, COST_EMA)

    def prefill_pays(self, batch_size: int, budget: int, tokens: int, remaining: int) -> bool:
        """Whether a sequence joining a batch of ``batch_size`` should start speculatively,
        paying its drafters' optional prefill work over its ``tokens`` prompt tokens (Token
        Recycling's top-k successors of every prompt token: the whole prompt's logits), or
        start plainly and skip it (``SpecEngine.start(speculative=False)``).

        The work costs ``tokens x`` the measured seconds per token
        (:meth:`observe_optional_prefill`), the batch waiting. A sequence refused it decodes
        plainly for its whole life (``SequenceState.plain_only``), so what the work buys is
        drafting's whole gain over plain decoding for the ``remaining`` tokens, the sequence's
        share of the batch's steps: ``remaining x (1 / plain - 1 / drafting)`` with ``plain``
        and ``drafting`` the batch's tokens/s at this batch size: measured where the steps have
        spoken (plain steps', and drafting's lasting record once it holds :data:`GUARD_STEPS`
        steps: :class:`Realized`), else predicted at the budget :meth:`best` picks; and, as in
        :meth:`best`, drafting must beat plain decoding by :data:`SPECULATE_MARGIN` (a realized
        rate over the last few steps is good to a few percent). Before any such work is
        measured it answers yes (that start measures it).

        Why: on the Zen 3 (``benchmarks/RESULTS.md``, issue 12) ``recycling`` at ``B = 1``
        decoded at ``ar``'s rate on 32-token requests (MAT 1.02-1.07) but paid each prompt's
        top-k at its start (4.5 ms a prompt token, 3.3 s for a 709-token prompt), and came out
        0.973-0.987x batched ``ar`` in four runs. Starting such requests plainly but letting
        them draft was worse (0.96x: without the prompt's successors they accepted nothing);
        without the margin, short prompts whose drafting merely tied plain decoding over the
        last steps still paid it, and drafted at MAT 1.01 (0.966x).

        >>> p = AdaptiveBudget(CostTable("m", "cpu", {1: {1: 0.3, 9: 0.5}}), Acceptance(prior=[0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.2, 0.1]))
        >>> p.prefill_pays(1, 8, 600, 32)   # nothing measured: this start measures it
        True
        >>> p.observe_optional_prefill(600, 1.2)   # 2 ms a prompt token
        >>> # predicted: plain 3.33 tokens/s, drafting 4.1 / 0.5 = 8.2: 32 x (0.3 - 0.122) = 5.7 s > 1.2 s
        >>> p.prefill_pays(1, 8, 600, 32), p.prefill_pays(1, 8, 600, 4)
        (True, False)
        >>> for _ in range(3): p.observe_step(1, False, 1, 0.3); p.observe_step(1, True, 1, 0.32)
        >>> p.prefill_pays(1, 8, 600, 32)   # its drafting steps emitted 3.1 tokens/s against 3.3
        False
        >>> q = AdaptiveBudget(CostTable("m", "cpu", {1: {1: 0.3, 9: 0.5}}))
        >>> q.observe_optional_prefill(10, 0.001)   # cheap work
        >>> for _ in range(3): q.observe_step(1, False, 1, 0.3); q.observe_step(1, True, 1, 0.297)
        >>> q.prefill_pays(1, 8, 10, 1000)   # drafting 1% ahead of plain: a tie, whatever it costs
        False
        """
        if self.optional_per_token is None:
            return True
        record = self.realized.get(batch_size) or Realized()
        k = self.best(batch_size, budget)
        plain = record.rate(False) or self.predicted(batch_size, 0)
        drafting = record.rate(True, lasting=True) if record.lasting_steps >= GUARD_STEPS else None
        drafting = drafting or (self.predicted(batch_size, k) if k > 0 else plain)
        if drafting <= (1 + SPECULATE_MARGIN) * plain:  # a near-tie is no reason to pay (``best``)
            return False
        saving = remaining * (1 / plain - 1 / drafting)
        return saving > tokens * self.optional_per_token

    def split_pays(self, batch_size: int, drafting: int, budget: int) -> bool:
        """``T(B - d, 1) + T(d, 1 + k) < T(B, 1 + k)``: the plain sequences' forward plus the
        drafting ones' costs less than padding all ``B`` to ``1 + k`` rows. A mixed step comes
        from a probe, or from sequences whose catch-up would not pay back (:meth:`pays_back`):
        at ``B = 4`` on the Zen 3 a cold policy lets one sequence catch up and draft while three
        decode plainly, and the padded forward computes 36 rows for 12 real ones.

        >>> p = AdaptiveBudget(CostTable("m", "cpu", {1: {1: 0.3, 9: 0.5}, 3: {1: 0.4, 9: 1.0}, 4: {1: 0.45, 9: 1.2}}))
        >>> p.split_pays(4, 1, 8), p.split_pays(4, 3, 8), p.split_pays(1, 1, 8)   # 0.4 + 0.5 < 1.2; 0.3 + 1.0 > 1.2
        (True, False, False)
        """
        if not 0 < drafting < batch_size:
            return False
        rows = 1 + budget
        return self.target_cost(batch_size - drafting, 1) + self.target_cost(drafting, rows) < self.target_cost(batch_size, rows)

    def table(self, batch_sizes: Sequence[int], cap: int) -> list[dict]:
        """Per batch size: the chosen budget and predicted throughput of it and of plain decoding."""
        rows = []
        for b in batch_sizes:
            k = self.best(b, cap)
            rows.append({"batch": b, "budget": k, "predicted_tok_s": self.predicted(b, k), "plain_tok_s": self.predicted(b, 0)})
        return rows

