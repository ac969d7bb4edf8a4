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
with measured gains (``specgraft/data/budget_gains.json``, :mod:`specgraft.budget.defaults`)
starts from its own, worth 32 steps (:class:`AdaptiveBudget` says why): rank rates whose sum
reproduces its measured ``E(k)`` at each measured budget, the nodes it fills from its ``N(k)``,
and ``D = D(k) x T(1, 1)`` from its measured drafting time. Before any step, its prediction at
``B = 1`` and a measured budget is therefore the one that derives its default budget
(:func:`~specgraft.budget.defaults.predicted_tokens_per_s`), and a short unlucky warm-up
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

from typing import Sequence

from specgraft.budget.acceptance import Acceptance, BudgetGains, Realized, ema, budget_gains
from specgraft.budget.costs import CostTable, interpolate
from specgraft.budget.policy import StepPlan

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
    def for_method(cls, costs: CostTable, method: str, gains_from: str | None = None, **kwargs) -> "AdaptiveBudget":
        """A policy whose priors are ``method``'s measured gains
        (:func:`~specgraft.budget.acceptance.budget_gains`; ``gains_from``: the method whose gains
        stand for it, ``MethodSpec.gains_from``, as an ablation reads its base method's); the
        generic prior for a method without gains (``ar``, ``reader``, unknown names). The gains were measured with one target/draft pair
        (:func:`~specgraft.budget.acceptance.gains_meta`: the 1.5B/0.5B catalog pair);
        with another model, or another preset, depth or top-k, they are still the starting
        point, as a prior: the online counts correct them (class docstring).

        >>> t = CostTable("m", "cpu", {1: {1: 0.3, 9: 0.5}})
        >>> AdaptiveBudget.for_method(t, "graft-fixed", "graft").prior, AdaptiveBudget.for_method(t, "ar").prior
        ('measured gains of graft-fixed', 'generic')
        """
        return cls(costs, gains=budget_gains(method, gains_from), **kwargs)

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
        return base * interpolate(seen, min(max(rows, xs[0]), xs[-1]))

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
            return interpolate(self.draft_prior, min(k, max(self.draft_prior)))
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
        self.draft_s[batch_size] = ema(self.draft_s.get(batch_size), draft_s, 0.1)

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
        seen[rows] = ema(seen.get(rows), ratio, COST_EMA)

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        if tokens <= 0:
            return
        self.catch_up_per_token = ema(self.catch_up_per_token, seconds / tokens, COST_EMA)

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
        self.optional_per_token = ema(self.optional_per_token, seconds / tokens, COST_EMA)

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

